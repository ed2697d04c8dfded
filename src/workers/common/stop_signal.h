/*
 * stop_signal.h: how every wal-worker role is told to stop.
 *
 * SIGTERM and SIGINT set stop_requested; the role then stops taking work, finishes what
 * is in flight within its bound and exits 0. SIGPIPE is ignored: a peer that closed its
 * socket is an error return, not a reason to die.
 */
#ifndef WAL_STOP_SIGNAL_H
#define WAL_STOP_SIGNAL_H

#include <signal.h>

extern volatile sig_atomic_t stop_requested;

void stop_on_signals(void);

#endif
