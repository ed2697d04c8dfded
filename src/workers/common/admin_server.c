/*
 * admin_server.c: the admin HTTP server (see admin_server.h) on libmicrohttpd.
 *
 * We open the listening socket ourselves and hand it to libmicrohttpd: that way it is
 * bound to exactly the address asked for (127.0.0.1 by default), and a port already in
 * use is reported with the errno of the bind, which libmicrohttpd's own start-up would
 * reduce to a NULL daemon.
 *
 * Requests are read as strictly as the ingest service's (http_framing.h): libmicrohttpd's
 * discipline level, the path compared as sent (an escape never matches an endpoint), and
 * ambiguous framing answered 400 with the connection closed.
 */
#include "admin_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "file_limit.h"
#include "http_framing.h"
#include "listen_socket.h"
#include "log.h"
#include "metrics.h"

/*
 * Idle connections must not lock out health checks: a load balancer marks a worker dead
 * when /healthz does not answer. So the limit is high (one polling thread serves them
 * all through epoll) and a connection that says nothing is dropped after a few seconds.
 */
#define ADMIN_CONNECTION_LIMIT     1000
#define ADMIN_CONNECTION_TIMEOUT_S 3
#define ADMIN_WANTED_FILES         (ADMIN_CONNECTION_LIMIT + 1024)

#define CONTENT_TYPE_TEXT    "text/plain; charset=utf-8"
#define CONTENT_TYPE_METRICS "text/plain; version=0.0.4; charset=utf-8"
#define CONTENT_TYPE_JSON    "application/json"

/* The one header the server reads: a request with two is refused. */
static const char *const single_headers[] = {MHD_HTTP_HEADER_AUTHORIZATION, NULL};

struct admin_server
{
	struct MHD_Daemon *daemon;
	admin_handlers handlers;
	char address[INET6_ADDRSTRLEN];
	int port;
	char *config_token; /* NULL: /config is not served */
};

static void set_error(char *errbuf, size_t errbuf_size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void
set_error(char *errbuf, size_t errbuf_size, const char *fmt, ...)
{
	va_list ap;

	if (errbuf == NULL || errbuf_size == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(errbuf, errbuf_size, fmt, ap);
	va_end(ap);
}

/*
 * Queues one response. body is either static (must_free false) or malloc'd and then
 * always owned by this function.
 */
static enum MHD_Result
send_response(struct MHD_Connection *connection, unsigned int status, const char *content_type,
			  const char *body, bool must_free)
{
	struct MHD_Response *response;
	enum MHD_Result result;

	response = MHD_create_response_from_buffer(
		strlen(body), (void *) body, must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (response == NULL)
	{
		if (must_free)
			free((void *) body);
		return MHD_NO;
	}
	MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
	/* Every answer describes the worker now; a cached one would lie. */
	MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	result = MHD_queue_response(connection, status, response);
	MHD_destroy_response(response);
	return result;
}

/* A 400 from the first call, before any body: the connection closes after it. */
static enum MHD_Result
refuse_request(struct MHD_Connection *connection, const char *why)
{
	char body[320];
	struct MHD_Response *response;
	enum MHD_Result result;

	snprintf(body, sizeof(body), "bad request: %s\n", why);
	response = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
	if (response == NULL)
		return MHD_NO;
	MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE_TEXT);
	MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	result = http_queue_closing(connection, MHD_HTTP_BAD_REQUEST, response);
	MHD_destroy_response(response);
	return result;
}

static enum MHD_Result
serve_readyz(const admin_server *server, struct MHD_Connection *connection)
{
	bool ready =
		server->handlers.is_ready == NULL || server->handlers.is_ready(server->handlers.arg);

	if (ready)
		return send_response(connection, MHD_HTTP_OK, CONTENT_TYPE_TEXT, "ready\n", false);
	return send_response(connection, MHD_HTTP_SERVICE_UNAVAILABLE, CONTENT_TYPE_TEXT, "not ready\n",
						 false);
}

/* Compares in time that depends only on the lengths, so a guess learns nothing. */
static bool
token_matches(const char *expected, const char *given, size_t given_len)
{
	size_t expected_len = strlen(expected);
	unsigned char diff = expected_len != given_len;

	for (size_t i = 0; i < expected_len; i++)
		diff |= (unsigned char) (expected[i] ^ (given_len ? given[i % given_len] : 0));
	return diff == 0;
}

static bool
has_config_token(const admin_server *server, struct MHD_Connection *connection)
{
	const char *token;
	size_t token_len;

	/* With its length: "<token>\0junk" is not the token. */
	return http_bearer_token(connection, &token, &token_len) &&
		   token_matches(server->config_token, token, token_len);
}

static enum MHD_Result
serve_config(const admin_server *server, struct MHD_Connection *connection)
{
	char *json = NULL;

	/* The document carries destination credentials: never to a caller without the token. */
	if (server->config_token == NULL)
		return send_response(connection, MHD_HTTP_FORBIDDEN, CONTENT_TYPE_TEXT,
							 "/config is not served: no peer token is configured (set "
							 "WAL_PEER_TOKEN on every worker)\n",
							 false);
	if (!has_config_token(server, connection))
		return send_response(connection, MHD_HTTP_UNAUTHORIZED, CONTENT_TYPE_TEXT,
							 "/config needs \"Authorization: Bearer <WAL_PEER_TOKEN>\"\n", false);
	if (server->handlers.config_json != NULL)
		json = server->handlers.config_json(server->handlers.arg);
	if (json == NULL)
		return send_response(connection, MHD_HTTP_SERVICE_UNAVAILABLE, CONTENT_TYPE_TEXT,
							 "no config loaded yet\n", false);
	return send_response(connection, MHD_HTTP_OK, CONTENT_TYPE_JSON, json, true);
}

static enum MHD_Result
handle_admin_request(void *arg, struct MHD_Connection *connection, const char *url,
					 const char *method, const char *version, const char *upload_data,
					 size_t *upload_data_size, void **request_state)
{
	static int request_started;
	const admin_server *server = arg;

	(void) version;
	(void) upload_data;

	/*
	 * Answer only once the whole request is in: answering while a body is still unread
	 * makes libmicrohttpd close the connection, and the client may see a reset instead of
	 * our 405.
	 */
	if (*request_state == NULL)
	{
		char why[256];

		*request_state = &request_started;
		if (!http_framing_ok(connection, single_headers, why, sizeof(why)))
			return refuse_request(connection, why);
		return MHD_YES;
	}
	if (*upload_data_size != 0)
	{
		*upload_data_size = 0;
		return MHD_YES;
	}

	/* HEAD is GET without the body, which libmicrohttpd drops for us. */
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return send_response(connection, MHD_HTTP_METHOD_NOT_ALLOWED, CONTENT_TYPE_TEXT,
							 "method not allowed\n", false);

	if (strcmp(url, "/metrics") == 0)
		return send_response(connection, MHD_HTTP_OK, CONTENT_TYPE_METRICS, metrics_render(), true);
	if (strcmp(url, "/healthz") == 0)
		return send_response(connection, MHD_HTTP_OK, CONTENT_TYPE_TEXT, "ok\n", false);
	if (strcmp(url, "/readyz") == 0)
		return serve_readyz(server, connection);
	if (strcmp(url, "/config") == 0)
		return serve_config(server, connection);
	return send_response(connection, MHD_HTTP_NOT_FOUND, CONTENT_TYPE_TEXT, "not found\n", false);
}

static void
free_server(admin_server *server)
{
	free(server->config_token);
	free(server);
}

admin_server *
admin_server_start(const admin_listen *listen, const admin_handlers *handlers, char *errbuf,
				   size_t errbuf_size)
{
	const char *address =
		listen->address != NULL && listen->address[0] != '\0' ? listen->address : "127.0.0.1";
	admin_server *server;
	int listen_fd;

	if (listen->port < 0 || listen->port > 65535)
	{
		set_error(errbuf, errbuf_size, "cannot listen on %s:%d: not a port number", address,
				  listen->port);
		return NULL;
	}
	if (strlen(address) >= INET6_ADDRSTRLEN)
	{
		set_error(errbuf, errbuf_size, "cannot listen on %s: not a numeric IP address", address);
		return NULL;
	}

	server = calloc(1, sizeof(*server));
	if (server == NULL)
	{
		set_error(errbuf, errbuf_size, "cannot start the admin server: out of memory");
		return NULL;
	}
	if (handlers != NULL)
		server->handlers = *handlers;
	strcpy(server->address, address);
	if (listen->config_token != NULL && listen->config_token[0] != '\0' &&
		(server->config_token = strdup(listen->config_token)) == NULL)
	{
		set_error(errbuf, errbuf_size, "cannot start the admin server: out of memory");
		free_server(server);
		return NULL;
	}

	listen_fd = listen_socket_bind(address, listen->port, &server->port);
	if (listen_fd < 0)
	{
		set_error(errbuf, errbuf_size, "cannot listen on %s:%d: %s", address, listen->port,
				  errno == EINVAL ? "not a numeric IP address" : strerror(errno));
		free_server(server);
		return NULL;
	}
	/* Enough descriptors for the connection limit beside the worker's own (Kafka, libpq). */
	file_limit_raise(ADMIN_WANTED_FILES);

	/*
	 * One internal thread polls every connection, so the handlers are never called
	 * concurrently; the timeout drops clients that connect and then say nothing.
	 */
	server->daemon = MHD_start_daemon(
		MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, handle_admin_request,
		server, MHD_OPTION_EXTERNAL_LOGGER, listen_socket_log_mhd, "admin_server_message",
		MHD_OPTION_LISTEN_SOCKET, (MHD_socket) listen_fd, MHD_OPTION_CONNECTION_LIMIT,
		(unsigned int) ADMIN_CONNECTION_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT,
		(unsigned int) ADMIN_CONNECTION_TIMEOUT_S, MHD_OPTION_CLIENT_DISCIPLINE_LVL,
		(int) HTTP_CLIENT_DISCIPLINE, MHD_OPTION_UNESCAPE_CALLBACK, http_keep_escaped, NULL,
		MHD_OPTION_END);
	if (server->daemon == NULL)
	{
		/*
		 * Left open on purpose: libmicrohttpd versions differ on whether a failed start
		 * closes a socket it was given, and closing it twice could close another thread's
		 * file. This path ends the worker anyway.
		 */
		set_error(errbuf, errbuf_size,
				  "cannot start the admin server on %s:%d (libmicrohttpd refused; see the log)",
				  address, server->port);
		free_server(server);
		return NULL;
	}
	return server;
}

int
admin_server_port(const admin_server *server)
{
	return server->port;
}

void
admin_server_stop(admin_server *server)
{
	if (server == NULL)
		return;
	/* Joins the server thread and closes the listening socket. */
	MHD_stop_daemon(server->daemon);
	free_server(server);
}
