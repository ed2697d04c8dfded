/*
 * sd_notify.c: see sd_notify.h. One datagram per message to the unix socket named by
 * NOTIFY_SOCKET ("@name" is an abstract socket). The socket and address are prepared at
 * the first call, so STOPPING=1 from a signal handler is a bare sendto.
 */
#include "sd_notify.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

static struct sockaddr_un addr;
static socklen_t addr_len;
static volatile sig_atomic_t fd = -1; /* -1: not prepared (or no NOTIFY_SOCKET) */
static bool prepared;
static int64_t watchdog_ms; /* half of WATCHDOG_USEC; 0: no watchdog */
static int64_t next_watchdog_ms;
static bool failure_logged;

static void
prepare(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	const char *usec = getenv("WATCHDOG_USEC");
	const char *pid = getenv("WATCHDOG_PID");
	size_t path_len;
	int s;

	prepared = true;
	if (path == NULL || path[0] == '\0')
		return;
	path_len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || path_len >= sizeof(addr.sun_path))
	{
		log_warn("event=sd_notify_failed socket=\"%s\" msg=\"not an absolute path or @name\"",
				 path);
		return;
	}
	addr.sun_family = AF_UNIX;
	memcpy(addr.sun_path, path, path_len);
	if (path[0] == '@')
		addr.sun_path[0] = '\0';
	addr_len = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + path_len);
	if (usec != NULL && atoll(usec) > 0 && (pid == NULL || atoll(pid) == (long long) getpid()))
		watchdog_ms = atoll(usec) >= 2000 ? atoll(usec) / 2000 : 1;
	s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s >= 0)
		fd = s;
}

/* Returns whether it was sent; safe in a signal handler (no logging there). */
static bool
send_message(const char *message)
{
	if (fd < 0)
		return true;
	return sendto(fd, message, strlen(message), MSG_NOSIGNAL, (struct sockaddr *) &addr,
				  addr_len) >= 0;
}

static void
notify(const char *message)
{
	if (!send_message(message) && !failure_logged)
	{
		failure_logged = true;
		log_warn("event=sd_notify_failed message=%s error=\"%s\"", message, strerror(errno));
	}
}

void
sd_notify_loop(void)
{
	int64_t now;

	if (!prepared)
	{
		prepare();
		notify("READY=1");
	}
	if (watchdog_ms <= 0)
		return;
	now = now_ms();
	if (now < next_watchdog_ms)
		return;
	next_watchdog_ms = now + watchdog_ms;
	notify("WATCHDOG=1");
}

void
sd_notify_stopping(void)
{
	int saved_errno = errno;

	send_message("STOPPING=1");
	errno = saved_errno;
}
