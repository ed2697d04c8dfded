/*
 * log.c: structured, line-at-a-time logging to stderr (see log.h).
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char *log_role = "wal-worker";
static log_level log_min_level = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void
log_set_role(const char *role)
{
	log_role = role;
}

void
log_set_min_level(log_level level)
{
	log_min_level = level;
}

static void
log_vwrite(log_level level, const char *file, int line, const char *fmt, va_list ap)
{
	struct timespec now;
	struct tm tm;
	char stamp[32];

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);

	/* One fprintf per line keeps lines whole when threads log at once. */
	char message[4096];
	vsnprintf(message, sizeof(message), fmt, ap);
	if (level >= LOG_WARN)
		fprintf(stderr, "%s.%03ldZ level=%s role=%s at=%s:%d %s\n", stamp, now.tv_nsec / 1000000,
				level_names[level], log_role, file, line, message);
	else
		fprintf(stderr, "%s.%03ldZ level=%s role=%s %s\n", stamp, now.tv_nsec / 1000000,
				level_names[level], log_role, message);
}

void
log_event(log_level level, const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	if (level < log_min_level)
		return;
	va_start(ap, fmt);
	log_vwrite(level, file, line, fmt, ap);
	va_end(ap);
}

void
log_fatal(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vwrite(LOG_ERROR, file, line, fmt, ap);
	va_end(ap);
	exit(1);
}
