/*
 * ingest_fault_hook.h: a test-only trigger for a fatal error of the idempotent producer.
 *
 * Off unless the environment variable WAL_INGEST_TEST_FATAL_FILE names a file: then, each
 * time that file appears, the ingest service removes it and injects a fatal error into its
 * idempotent producer (rd_kafka_test_fatal_error), so a test can watch the producer being
 * replaced. Production never sets the variable.
 */
#ifndef WAL_INGEST_FAULT_HOOK_H
#define WAL_INGEST_FAULT_HOOK_H

#include <stdbool.h>

/* True once per appearance of the trigger file (always false when the hook is off). */
bool ingest_fault_hook_due(void);

#endif
