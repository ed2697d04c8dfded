/*
 * relay.h: the relay background workers (relay.c) and their settings.
 */
#ifndef RELAY_H
#define RELAY_H

#include "postgres.h"

extern char *wal_delivery_database;
extern int wal_delivery_relay_workers;
extern char *kafka_bootstrap_servers;
extern char *kafka_properties;

void define_relay_settings(void);
void register_relay_workers(void);

PGDLLEXPORT void wal_delivery_relay_main(Datum main_arg);

#endif
