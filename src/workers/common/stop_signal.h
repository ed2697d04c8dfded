/*
 * stop_signal.h: how every wal-worker role is told to stop.
 *
 * SIGTERM and SIGINT set stop_requested; the role then stops taking work, finishes what
 * is in flight within its bound and exits 0. SIGPIPE is ignored: a peer that closed its
 * socket is an error return, not a reason to die.
 *
 * A failure the process cannot recover from (a Kafka client's fatal error) stops it the
 * same way but with stop_exit_status set, which wal-worker exits with: the supervisor
 * (systemd's Restart=on-failure) starts it again, and what it had not finished is
 * redelivered, as after any stop.
 */
#ifndef WAL_STOP_SIGNAL_H
#define WAL_STOP_SIGNAL_H

#include <signal.h>

extern volatile sig_atomic_t stop_requested;
extern volatile sig_atomic_t stop_exit_status; /* 0, or the status to exit with */

/* EX_SOFTWARE of sysexits.h: an internal error, restart me. */
#define STOP_STATUS_FATAL 70

void stop_on_signals(void);
void stop_with_failure(int status);

#endif
