/*
 * admin_server.h: the worker's admin HTTP server (--admin-port, --admin-listen; loopback
 * unless told otherwise).
 *
 *   GET /metrics  200, metrics_render() as text/plain; version=0.0.4
 *   GET /healthz  200 "ok" while the process runs (liveness)
 *   GET /readyz   200 "ready" or 503 "not ready", as is_ready says (readiness)
 *   GET /config   the cached config for peers, which carries destination credentials, so:
 *                 403 when no token is configured (never served), 401 without
 *                 "Authorization: Bearer <token>", else 200 application/json from
 *                 config_json, or 503 when it returns NULL
 *   other paths   404; methods other than GET (and HEAD) 405 with "Allow: GET, HEAD"
 *
 * The server runs on its own thread (libmicrohttpd's internal polling thread) and serves
 * one request at a time, so the callbacks are called from that thread, never two at
 * once, and never from the thread that started the server: they must only read state
 * that is safe to read from another thread (atomics, or data under the caller's lock).
 * A slow callback delays the other requests, so keep them quick.
 */
#ifndef WAL_ADMIN_SERVER_H
#define WAL_ADMIN_SERVER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct
{
	/* NULL: always ready. */
	bool (*is_ready)(void *arg);
	/* A malloc'd JSON document the server frees, or NULL (503) while there is none yet. */
	char *(*config_json)(void *arg);
	/* Passed to both callbacks. */
	void *arg;
} admin_handlers;

typedef struct
{
	/* A numeric IPv4 or IPv6 address; NULL or "": 127.0.0.1. */
	const char *address;
	/* 0: a free port, see admin_server_port. */
	int port;
	/* The bearer token /config requires; NULL or "": /config is not served. */
	const char *config_token;
} admin_listen;

typedef struct admin_server admin_server;

/*
 * Listens on listen->address:port and serves until admin_server_stop. Both structs are
 * copied (strings too). On failure returns NULL with a message in errbuf, e.g. "cannot
 * listen on 127.0.0.1:9187: Address already in use".
 */
admin_server *admin_server_start(const admin_listen *listen, const admin_handlers *handlers,
								 char *errbuf, size_t errbuf_size);

/* The port actually listened on. */
int admin_server_port(const admin_server *server);

/* Closes the port and waits for the server thread to finish; NULL is a no-op. */
void admin_server_stop(admin_server *server);

#endif
