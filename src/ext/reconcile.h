/*
 * reconcile.h: the reconciler background worker (reconcile.c) and its settings.
 */
#ifndef RECONCILE_H
#define RECONCILE_H

#include "postgres.h"

void define_reconcile_settings(void);
void register_reconcile_worker(void);

PGDLLEXPORT void wal_delivery_reconcile_main(Datum main_arg);

#endif
