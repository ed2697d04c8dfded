/*
 * log.h: the workers' one logging helper. Every line is one event: a timestamp, a level,
 * the worker role, the source location for errors, then key=value fields.
 */
#ifndef WAL_LOG_H
#define WAL_LOG_H

#include <stdnoreturn.h>

typedef enum
{
	LOG_DEBUG,
	LOG_INFO,
	LOG_WARN,
	LOG_ERROR
} log_level;

void log_set_role(const char *role);
void log_set_min_level(log_level level);
void log_event(log_level level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/*
 * A line about one record: the event's fields, then topic= (the record's topic), key=
 * (its idempotency key) and trace_id= (when trace_id is not NULL), escaped as any %s
 * value. Every line about a record goes through here, so they join on the same fields.
 */
void log_record_event(log_level level, const char *file, int line, const char *topic,
					  const char *key, const char *trace_id, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
noreturn void log_fatal(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_debug(...) log_event(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  log_event(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  log_event(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_event(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define log_record(level, topic, key, trace_id, ...)                                               \
	log_record_event(level, __FILE__, __LINE__, topic, key, trace_id, __VA_ARGS__)
/* For states the worker cannot go on from: logs where, then exits 1. */
#define fatal(...) log_fatal(__FILE__, __LINE__, __VA_ARGS__)

#endif
