/*
 * reconcile.h: the reconciler background worker (reconcile.c), which makes Kafka match
 * the control plane.
 */
#ifndef RECONCILE_H
#define RECONCILE_H

#include "postgres.h"

/* Started by the postmaster (bgworkers.c). */
PGDLLEXPORT void wal_delivery_reconcile_main(Datum main_arg);

#endif
