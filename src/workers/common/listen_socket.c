/*
 * listen_socket.c: see listen_socket.h.
 */
#include "listen_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

int
listen_socket_bind(const char *address, int port, int *bound_port)
{
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
							 .ai_family = AF_UNSPEC,
							 .ai_socktype = SOCK_STREAM};
	struct addrinfo *found = NULL;
	struct sockaddr_storage bound;
	socklen_t bound_len = sizeof(bound);
	char service[16];
	int one = 1;
	int fd;
	int saved_errno;

	if (port < 0 || port > 65535)
	{
		errno = EINVAL;
		return -1;
	}
	snprintf(service, sizeof(service), "%d", port);
	if (getaddrinfo(address, service, &hints, &found) != 0 || found == NULL)
	{
		errno = EINVAL;
		return -1;
	}
	fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
	{
		saved_errno = errno;
		freeaddrinfo(found);
		errno = saved_errno;
		return -1;
	}
	/*
	 * Lets a restarted worker take its port back while old connections sit in TIME_WAIT;
	 * on Linux it never lets two listeners share the port.
	 */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* "::" means IPv6 only: an IPv4 address is asked for by its own. */
	if (found->ai_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 1024) != 0 ||
		getsockname(fd, (struct sockaddr *) &bound, &bound_len) != 0)
	{
		saved_errno = errno;
		close(fd);
		freeaddrinfo(found);
		errno = saved_errno;
		return -1;
	}
	freeaddrinfo(found);
	*bound_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *) &bound)->sin6_port
													: ((struct sockaddr_in *) &bound)->sin_port);
	return fd;
}

int
listen_socket_open(const char *listen_spec, int *port, char *errbuf, size_t errbuf_size)
{
	char host[128];
	const char *colon = strrchr(listen_spec, ':');
	char *end;
	long wanted;
	int fd;

	if (colon == NULL || (size_t) (colon - listen_spec) >= sizeof(host))
	{
		snprintf(errbuf, errbuf_size, "--listen wants ADDRESS:PORT, got '%s'", listen_spec);
		return -1;
	}
	snprintf(host, sizeof(host), "%.*s", (int) (colon - listen_spec), listen_spec);
	if (host[0] == '[' && host[strlen(host) - 1] == ']')
	{
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = '\0';
	}
	errno = 0;
	wanted = strtol(colon + 1, &end, 10);
	if (colon[1] == '\0' || *end != '\0' || errno != 0 || wanted < 0 || wanted > 65535)
	{
		snprintf(errbuf, errbuf_size, "cannot listen on %s: not a numeric address and port",
				 listen_spec);
		return -1;
	}
	fd = listen_socket_bind(host, (int) wanted, port);
	if (fd < 0)
		snprintf(errbuf, errbuf_size, "cannot listen on %s: %s", listen_spec,
				 errno == EINVAL ? "not a numeric address and port" : strerror(errno));
	return fd;
}

void
listen_socket_log_mhd(void *event, const char *fmt, va_list ap)
{
	char message[512];

	vsnprintf(message, sizeof(message), fmt, ap);
	message[strcspn(message, "\r\n")] = '\0';
	log_warn("event=%s msg=\"%s\"", (const char *) event, message);
}
