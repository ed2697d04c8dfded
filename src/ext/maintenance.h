/*
 * maintenance.h: the periodic tasks relay 0 runs for other parts (maintenance.c).
 */
#ifndef MAINTENANCE_H
#define MAINTENANCE_H

/* Runs every task once (the purge until it is done), each in its own transaction. */
void run_maintenance(void);

#endif
