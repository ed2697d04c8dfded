/*
 * listen_socket.h: the listening socket of a role's own HTTP server (ingest, console),
 * from its --listen ADDR:PORT.
 */
#ifndef WAL_LISTEN_SOCKET_H
#define WAL_LISTEN_SOCKET_H

#include <stddef.h>

/*
 * A socket listening on spec, ADDR:PORT with a numeric address (IPv6 in brackets) and
 * port (0: a free one); *port is the port it got. -1 with why in errbuf when it cannot.
 */
int listen_socket_open(const char *spec, int *port, char *errbuf, size_t errbuf_size);

#endif
