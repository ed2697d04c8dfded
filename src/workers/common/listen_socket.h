/*
 * listen_socket.h: the listening socket of a role's HTTP server (ingest, console, the
 * admin server), opened here and handed to libmicrohttpd, so a port in use is reported
 * with the bind's own errno; and the logger those servers give libmicrohttpd.
 */
#ifndef WAL_LISTEN_SOCKET_H
#define WAL_LISTEN_SOCKET_H

#include <stdarg.h>
#include <stddef.h>

/*
 * A socket listening on a numeric address and port (0: a free one); *port is the port it
 * got. -1 with errno set by the call that failed (EINVAL: the address is not numeric).
 */
int listen_socket_bind(const char *address, int port, int *bound_port);

/*
 * The same from a --listen ADDR:PORT (IPv6 in brackets). -1 with why in errbuf when it
 * cannot.
 */
int listen_socket_open(const char *spec, int *port, char *errbuf, size_t errbuf_size);

/*
 * libmicrohttpd's own complaints (a failed accept, a client gone mid-reply) as one log
 * line: MHD_OPTION_EXTERNAL_LOGGER, with the event's name (a string constant) as arg.
 */
void listen_socket_log_mhd(void *event, const char *fmt, va_list ap);

#endif
