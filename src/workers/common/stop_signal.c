/*
 * stop_signal.c: see stop_signal.h.
 */
#include "stop_signal.h"

#include "sd_notify.h"

volatile sig_atomic_t stop_requested = 0;
volatile sig_atomic_t stop_exit_status = 0;

static void
on_stop_signal(int signo)
{
	(void) signo;
	stop_requested = 1;
	sd_notify_stopping(); /* async-signal-safe: one sendto on a socket opened before */
}

void
stop_on_signals(void)
{
	signal(SIGTERM, on_stop_signal);
	signal(SIGINT, on_stop_signal);
	signal(SIGPIPE, SIG_IGN);
}

void
stop_with_failure(int status)
{
	stop_exit_status = status;
	stop_requested = 1;
	sd_notify_stopping();
}
