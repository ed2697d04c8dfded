/*
 * wal_delivery.h: declarations shared by the extension's source files.
 */
#ifndef WAL_DELIVERY_H
#define WAL_DELIVERY_H

/* default_version of wal_delivery.control; the Makefile passes it (-D). */
#ifndef WAL_DELIVERY_VERSION
#error "WAL_DELIVERY_VERSION is not defined: build with the project's Makefile"
#endif

/* PostgreSQL 15's fmgr.h does not declare it. */
void _PG_init(void);

#endif
