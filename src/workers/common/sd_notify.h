/*
 * sd_notify.h: the systemd notify protocol, spoken when NOTIFY_SOCKET is set (a unit with
 * Type=notify and WatchdogSec=), written here so the workers need no libsystemd.
 *
 *   sd_notify_loop()      call once per turn of a role's main loop, which starts once
 *                         the role has its configuration: the first call sends READY=1,
 *                         then WATCHDOG=1 at most every WATCHDOG_USEC / 2. A loop that
 *                         hangs stops the pings, and systemd restarts the worker; so
 *                         WatchdogSec= must exceed the longest turn (a processor's lease).
 *   sd_notify_stopping()  STOPPING=1; async-signal-safe (stop_signal calls it from the
 *                         SIGTERM handler), sent only once READY=1 was
 *
 * Without NOTIFY_SOCKET each is a no-op. A send that fails is logged once and ignored.
 */
#ifndef WAL_SD_NOTIFY_H
#define WAL_SD_NOTIFY_H

void sd_notify_loop(void);
void sd_notify_stopping(void);

#endif
