/*
 * relay.h: the relay background workers (relay.c), which ship the outbox to Kafka.
 */
#ifndef RELAY_H
#define RELAY_H

#include "postgres.h"

/* Started by the postmaster (bgworkers.c); main_arg is the relay's slot. */
PGDLLEXPORT void wal_delivery_relay_main(Datum main_arg);

#endif
