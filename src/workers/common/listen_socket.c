/*
 * listen_socket.c: see listen_socket.h.
 */
#include "listen_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int
listen_socket_open(const char *listen_spec, int *port, char *errbuf, size_t errbuf_size)
{
	char host[128];
	const char *colon = strrchr(listen_spec, ':');
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
							 .ai_family = AF_UNSPEC,
							 .ai_socktype = SOCK_STREAM};
	struct addrinfo *found = NULL;
	struct sockaddr_storage bound;
	socklen_t bound_len = sizeof(bound);
	int one = 1;
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
	if (getaddrinfo(host, colon + 1, &hints, &found) != 0)
	{
		snprintf(errbuf, errbuf_size, "cannot listen on %s: not a numeric address and port",
				 listen_spec);
		return -1;
	}
	fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 1024) != 0 ||
		getsockname(fd, (struct sockaddr *) &bound, &bound_len) != 0)
	{
		snprintf(errbuf, errbuf_size, "cannot listen on %s: %s", listen_spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(found);
		return -1;
	}
	freeaddrinfo(found);
	*port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *) &bound)->sin6_port
											  : ((struct sockaddr_in *) &bound)->sin_port);
	return fd;
}
