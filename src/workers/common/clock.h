/*
 * clock.h: milliseconds for timers (monotonic) and for timestamps that travel in
 * messages (wall clock).
 */
#ifndef WAL_CLOCK_H
#define WAL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Monotonic seconds with sub-millisecond precision, for durations put in histograms. */
static inline double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline int64_t
wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
