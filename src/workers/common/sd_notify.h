/*
 * sd_notify.h: the systemd notify protocol, spoken when NOTIFY_SOCKET is set (a unit with
 * Type=notify and WatchdogSec=), written here so the workers need no libsystemd.
 *
 *   sd_notify_ready()     READY=1, once the role has its configuration and runs
 *   sd_notify_watchdog()  WATCHDOG=1, at most every WATCHDOG_USEC / 2; call it from the
 *                         role's main loop each turn: a loop that hangs stops the pings
 *                         and systemd restarts the worker
 *   sd_notify_stopping()  STOPPING=1, when the role starts shutting down
 *
 * Without NOTIFY_SOCKET each is a no-op. A send that fails is logged once and ignored.
 */
#ifndef WAL_SD_NOTIFY_H
#define WAL_SD_NOTIFY_H

void sd_notify_ready(void);
void sd_notify_watchdog(void);
void sd_notify_stopping(void);

#endif
