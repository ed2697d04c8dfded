/*
 * roles.h: the entry point of each wal-worker role.
 */
#ifndef WAL_ROLES_H
#define WAL_ROLES_H

#include "common/options.h"

int run_consume(const worker_options *opts);
int run_dlq(const worker_options *opts);
int run_retry(const worker_options *opts);
int run_process(const worker_options *opts);
int run_ingest(const worker_options *opts);
int run_console(const worker_options *opts);

#endif
