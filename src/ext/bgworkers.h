/*
 * bgworkers.h: registering the extension's background workers (bgworkers.c).
 */
#ifndef BGWORKERS_H
#define BGWORKERS_H

/* The relays (wal_delivery.relay_workers of them) and, when there is a relay, the reconciler. */
void register_background_workers(void);

#endif
