/*
 * sd_notify.c: see sd_notify.h. One datagram per message to the unix socket named by
 * NOTIFY_SOCKET ("@name" is an abstract socket).
 */
#include "sd_notify.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

static atomic_bool failure_logged;
static _Atomic int64_t next_watchdog_ms;

static void
notify(const char *message)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	size_t path_len;
	socklen_t addr_len;
	int fd;
	ssize_t sent;

	if (path == NULL || path[0] == '\0')
		return;
	path_len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || path_len >= sizeof(addr.sun_path))
	{
		if (!atomic_exchange(&failure_logged, true))
			log_warn("event=sd_notify_failed socket=\"%s\" msg=\"not an absolute path or @name\"",
					 path);
		return;
	}
	memcpy(addr.sun_path, path, path_len);
	if (path[0] == '@')
		addr.sun_path[0] = '\0';
	addr_len = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + path_len);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	sent = sendto(fd, message, strlen(message), MSG_NOSIGNAL, (struct sockaddr *) &addr, addr_len);
	if (sent < 0 && !atomic_exchange(&failure_logged, true))
		log_warn("event=sd_notify_failed socket=\"%s\" error=\"%s\"", path, strerror(errno));
	close(fd);
}

void
sd_notify_ready(void)
{
	notify("READY=1");
}

/* Half of WATCHDOG_USEC (systemd's advice), 0 when no watchdog is asked for. */
static int64_t
watchdog_interval_ms(void)
{
	const char *usec = getenv("WATCHDOG_USEC");
	const char *pid = getenv("WATCHDOG_PID");
	long long value;

	if (usec == NULL || (pid != NULL && atoll(pid) != (long long) getpid()))
		return 0;
	value = atoll(usec);
	if (value <= 0)
		return 0;
	return value >= 2000 ? value / 2000 : 1;
}

void
sd_notify_watchdog(void)
{
	int64_t interval = watchdog_interval_ms();
	int64_t now;

	if (interval <= 0)
		return;
	now = now_ms();
	if (now < atomic_load(&next_watchdog_ms))
		return;
	atomic_store(&next_watchdog_ms, now + interval);
	notify("WATCHDOG=1");
}

void
sd_notify_stopping(void)
{
	notify("STOPPING=1");
}
