/*
 * ingest_http.c: the ingest HTTP server on libmicrohttpd (see ingest_http.h).
 *
 * A request is read whole, turned into records and handed on; its connection is then
 * suspended until every record is settled (ingest_request.h), so a thread never blocks
 * on Kafka or the database and thousands of requests wait side by side.
 */
#include "ingest_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "ingest/ingest_kafka.h"
#include "ingest/ingest_outbox.h"
#include "ingest/ingest_parse.h"
#include "ingest/ingest_request.h"

#define HTTP_THREADS            2
#define HTTP_CONNECTION_LIMIT   10000
#define HTTP_CONNECTION_TIMEOUT 60
#define TOPIC_PREFIX            "/v1/topics/"

struct ingest_http
{
	struct MHD_Daemon *daemon;
	int port;
	bool (*is_ready)(void);
};

static atomic_int requests_in_flight;

typedef enum
{
	ROUTE_RECORDS,
	ROUTE_BATCH,
	ROUTE_HEALTHZ,
	ROUTE_READYZ,
	ROUTE_METRICS,
	ROUTE_NONE /* an error is set */
} url_route;

/* What a request is, kept between the handler's calls. */
typedef struct http_state
{
	ingest_request *req;
	url_route route;
} http_state;

static enum MHD_Result
send_text(struct MHD_Connection *connection, unsigned int status, const char *type, char *body,
		  bool must_free)
{
	struct MHD_Response *response = MHD_create_response_from_buffer(
		strlen(body), body, must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	enum MHD_Result result;

	if (response == NULL)
		return MHD_NO;
	MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	result = MHD_queue_response(connection, status, response);
	MHD_destroy_response(response);
	return result;
}

/* The bearer token, the topic and the token's right to it: 401, 403, 404 or fine. */
static void
authorize(ingest_request *req, const char *topic)
{
	static const char bearer[] = "Bearer ";
	const char *auth = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND,
												   MHD_HTTP_HEADER_AUTHORIZATION);
	const ingest_token *token;

	if (auth == NULL || strncmp(auth, bearer, sizeof(bearer) - 1) != 0)
	{
		ingest_request_fail(req, 401, "unauthorized",
							"send \"Authorization: Bearer <token>\" with an ingest token "
							"(wal_delivery.create_ingest_token)");
		return;
	}
	token = ingest_catalog_token(req->catalog, auth + sizeof(bearer) - 1);
	if (token == NULL)
	{
		ingest_request_fail(req, 401, "unauthorized", "the bearer token is unknown or revoked");
		return;
	}
	if (!ingest_token_allows(token, topic))
	{
		ingest_request_fail(req, 403, "forbidden", "token \"%s\" may not write topic \"%.249s\"",
							token->name, topic);
		return;
	}
	req->topic = ingest_catalog_topic(req->catalog, topic);
	if (req->topic == NULL)
		ingest_request_fail(req, 404, "unknown_topic",
							"topic \"%.249s\" does not exist (wal_delivery.topics)", topic);
}

/* Reads the URL and method on the first call; sets the route and any early error. */
static url_route
route_request(ingest_request *req, const char *url, const char *method)
{
	bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, "HEAD") == 0;
	url_route route = ROUTE_NONE;
	char topic[256];
	const char *slash;

	if (strcmp(url, "/healthz") == 0)
		route = ROUTE_HEALTHZ;
	else if (strcmp(url, "/readyz") == 0)
		route = ROUTE_READYZ;
	else if (strcmp(url, "/metrics") == 0)
		route = ROUTE_METRICS;
	if (route != ROUTE_NONE)
	{
		if (!get)
			ingest_request_fail(req, 405, "method_not_allowed", "%s takes GET", url);
		return get ? route : ROUTE_NONE;
	}
	if (strncmp(url, TOPIC_PREFIX, sizeof(TOPIC_PREFIX) - 1) != 0 ||
		(slash = strchr(url + sizeof(TOPIC_PREFIX) - 1, '/')) == NULL ||
		(strcmp(slash, "/records") != 0 && strcmp(slash, "/batch") != 0) ||
		slash == url + sizeof(TOPIC_PREFIX) - 1 ||
		(size_t) (slash - url) - (sizeof(TOPIC_PREFIX) - 1) >= sizeof(topic))
	{
		ingest_request_fail(req, 404, "not_found",
							"no such endpoint: POST /v1/topics/{topic}/records or /batch");
		return ROUTE_NONE;
	}
	if (strcmp(method, MHD_HTTP_METHOD_POST) != 0)
	{
		ingest_request_fail(req, 405, "method_not_allowed", "records are sent with POST");
		return ROUTE_NONE;
	}
	snprintf(topic, sizeof(topic), "%.*s", (int) (slash - url) - (int) (sizeof(TOPIC_PREFIX) - 1),
			 url + sizeof(TOPIC_PREFIX) - 1);
	req->batch = strcmp(slash, "/batch") == 0;
	req->catalog = ingest_catalog_acquire();
	authorize(req, topic);
	if (req->topic)
		req->body_limit = req->batch ? INGEST_BATCH_MAX_BYTES : (size_t) req->topic->record_limit;
	return req->batch ? ROUTE_BATCH : ROUTE_RECORDS;
}

/* Keeps the body up to its limit; beyond, only counts it (the answer will be 413). */
static void
take_body(ingest_request *req, const char *data, size_t size)
{
	if (req->error_status != 0 || req->body_too_large)
		return;
	if (req->body_len + size > req->body_limit)
	{
		req->body_too_large = true;
		ingest_request_fail(req, 413, "too_large",
							req->batch ? "the batch is over %zu bytes"
									   : "the payload is over the topic's limit of %zu bytes",
							req->body_limit);
		return;
	}
	if (req->body_len + size + 1 > req->body_cap)
	{
		size_t cap = req->body_cap ? req->body_cap : 4096;

		while (cap < req->body_len + size + 1)
			cap *= 2;
		req->body = realloc(req->body, cap);
		if (req->body == NULL)
			fatal("event=out_of_memory what=request_body bytes=%zu", cap);
		req->body_cap = cap;
	}
	memcpy(req->body + req->body_len, data, size);
	req->body_len += size;
	req->body[req->body_len] = '\0';
}

static void
hand_on(ingest_record *r)
{
	if (r->needs_processing)
	{
		/* Its processor runs from the outbox: never straight to Kafka. */
		atomic_store(&r->route, ROUTE_OUTBOX);
		ingest_outbox_submit(r, NULL);
	}
	else
		ingest_kafka_submit(r);
}

static enum MHD_Result
serve_get(const ingest_http *http, http_state *st)
{
	struct MHD_Connection *c = st->req->connection;

	if (st->route == ROUTE_HEALTHZ)
		return send_text(c, 200, "text/plain; charset=utf-8", "ok\n", false);
	if (st->route == ROUTE_METRICS)
		return send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", metrics_render(),
						 true);
	if (http->is_ready())
		return send_text(c, 200, "text/plain; charset=utf-8", "ready\n", false);
	return send_text(c, 503, "text/plain; charset=utf-8",
					 "not ready: neither Kafka nor the outbox database is reachable\n", false);
}

static enum MHD_Result
handle_request(void *arg, struct MHD_Connection *connection, const char *url, const char *method,
			   const char *version, const char *upload_data, size_t *upload_data_size,
			   void **state_ptr)
{
	const ingest_http *http = arg;
	http_state *st = *state_ptr;
	ingest_request *req;

	(void) version;
	if (st == NULL)
	{
		/* Headers are in; the body (if any) comes in the next calls. */
		st = calloc(1, sizeof(*st));
		if (st == NULL)
			return MHD_NO;
		st->req = ingest_request_new(connection);
		st->route = route_request(st->req, url, method);
		*state_ptr = st;
		atomic_fetch_add(&requests_in_flight, 1);
		return MHD_YES;
	}
	req = st->req;
	if (*upload_data_size != 0)
	{
		take_body(req, upload_data, *upload_data_size);
		*upload_data_size = 0;
		return MHD_YES;
	}
	/* The whole request is in (or the records are settled and it was resumed). */
	if (req->handed_on || req->error_status != 0)
		return ingest_request_answer(req);
	if (st->route != ROUTE_RECORDS && st->route != ROUTE_BATCH)
		return serve_get(http, st);
	if (!(st->route == ROUTE_BATCH ? ingest_parse_batch(req) : ingest_parse_single(req)))
		return ingest_request_answer(req);
	for (int i = 0; i < req->n_records; i++)
		hand_on(req->records[i]);
	if (ingest_request_wait(req))
		return ingest_request_answer(req);
	return MHD_YES;
}

static void
request_completed(void *arg, struct MHD_Connection *connection, void **state_ptr,
				  enum MHD_RequestTerminationCode code)
{
	http_state *st = *state_ptr;

	(void) arg;
	(void) connection;
	(void) code;
	if (st == NULL)
		return;
	ingest_request_free(st->req);
	free(st);
	*state_ptr = NULL;
	atomic_fetch_sub(&requests_in_flight, 1);
}

static void
log_mhd(void *arg, const char *fmt, va_list ap)
{
	char message[512];

	(void) arg;
	vsnprintf(message, sizeof(message), fmt, ap);
	message[strcspn(message, "\r\n")] = '\0';
	log_warn("event=http_server_message msg=\"%s\"", message);
}

/* The listening socket on ADDR:PORT (numeric; IPv6 in brackets), or -1 with why. */
static int
listen_on(const char *listen_spec, int *port, char *errbuf, size_t errbuf_size)
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

ingest_http *
ingest_http_start(const char *listen_spec, bool (*is_ready)(void), char *errbuf, size_t errbuf_size)
{
	ingest_http *http = calloc(1, sizeof(*http));
	int fd;

	http->is_ready = is_ready;
	fd = listen_on(listen_spec, &http->port, errbuf, errbuf_size);
	if (fd < 0)
	{
		free(http);
		return NULL;
	}
	http->daemon =
		MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
							 MHD_USE_ERROR_LOG | MHD_USE_ITC,
						 0, NULL, NULL, handle_request, http, MHD_OPTION_EXTERNAL_LOGGER, log_mhd,
						 NULL, MHD_OPTION_LISTEN_SOCKET, (MHD_socket) fd,
						 MHD_OPTION_THREAD_POOL_SIZE, (unsigned int) HTTP_THREADS,
						 MHD_OPTION_CONNECTION_LIMIT, (unsigned int) HTTP_CONNECTION_LIMIT,
						 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int) HTTP_CONNECTION_TIMEOUT,
						 MHD_OPTION_NOTIFY_COMPLETED, request_completed, NULL, MHD_OPTION_END);
	if (http->daemon == NULL)
	{
		snprintf(errbuf, errbuf_size, "cannot start the HTTP server on %s (see the log)",
				 listen_spec);
		free(http);
		return NULL;
	}
	return http;
}

int
ingest_http_port(const ingest_http *http)
{
	return http->port;
}

void
ingest_http_stop(ingest_http *http, int wait_ms)
{
	int64_t until = now_ms() + wait_ms;
	MHD_socket fd;

	if (http == NULL)
		return;
	/* No new connections: the load balancer sees the port closed and moves on. */
	fd = MHD_quiesce_daemon(http->daemon);
	if (fd != MHD_INVALID_SOCKET)
		close(fd);
	while (atomic_load(&requests_in_flight) > 0 && now_ms() < until)
		usleep(10 * 1000);
	if (atomic_load(&requests_in_flight) > 0)
	{
		/* libmicrohttpd aborts when stopped with suspended connections: leave it to exit. */
		log_warn("event=requests_unanswered count=%d", atomic_load(&requests_in_flight));
		return;
	}
	MHD_stop_daemon(http->daemon);
	free(http);
}
