/*
 * stop_signal.c: see stop_signal.h.
 */
#include "stop_signal.h"

volatile sig_atomic_t stop_requested = 0;

static void
on_stop_signal(int signo)
{
	(void) signo;
	stop_requested = 1;
}

void
stop_on_signals(void)
{
	signal(SIGTERM, on_stop_signal);
	signal(SIGINT, on_stop_signal);
	signal(SIGPIPE, SIG_IGN);
}
