/*
 * fatal_error_hook.h: a test-only trigger for a fatal error of an idempotent producer.
 *
 * Off unless the environment variable WAL_TEST_FATAL_FILE names a file: then, each time
 * that file appears, the process removes it and injects a fatal error into its idempotent
 * producer (rd_kafka_test_fatal_error): the ingest service's or the hand-off producer of
 * consume and retry, each of which replaces itself.
 * Production never sets the variable.
 */
#ifndef WAL_FATAL_ERROR_HOOK_H
#define WAL_FATAL_ERROR_HOOK_H

#include <stdbool.h>

#include <librdkafka/rdkafka.h>

/* Injects the fatal error into rk once per appearance of the trigger file. */
void fatal_error_hook_poll(rd_kafka_t *rk);

#endif
