/*
 * ingest_http.c: the ingest HTTP server on libmicrohttpd (see ingest_http.h).
 *
 * A request is read whole, turned into records and handed on; its connection is then
 * suspended until every record is settled (ingest_request.h), so a thread never blocks
 * on Kafka or the database and thousands of requests wait side by side.
 *
 * Before any of that, a request whose framing or path two HTTP parsers could read two
 * ways is answered 400 and its connection closed (http_framing.h; docs/security.md,
 * "HTTP framing of the ingest service"). The path arrives as sent (http_keep_escaped)
 * and is decoded here, with its length: %00, a malformed escape, bytes that are not
 * UTF-8 once decoded and a topic that is not a topic name are refused, and so is a query
 * string on the records endpoints (they take none; /healthz, /readyz and /metrics
 * ignore one). A chunked body followed by trailer fields is refused once read: the
 * service reads no trailer, a proxy may merge them into the header.
 */
#include "ingest_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/clock.h"
#include "common/file_limit.h"
#include "common/http_framing.h"
#include "common/listen_socket.h"
#include "common/log.h"
#include "common/metrics.h"
#include "ingest/ingest_kafka.h"
#include "ingest/ingest_metrics.h"
#include "ingest/ingest_outbox.h"
#include "ingest/ingest_parse.h"
#include "ingest/ingest_request.h"
#include "shared/hex.h"
#include "shared/record_contract.h"
#include "shared/utf8.h"

#define HTTP_THREADS          2
#define HTTP_CONNECTION_LIMIT 10000
/* Descriptors kept for the rest of the worker: Kafka, libpq, the admin server's 1000. */
#define HTTP_RESERVED_FILES     2048
#define HTTP_CONNECTION_TIMEOUT 60
#define TOPIC_PREFIX            "/v1/topics/"
/* Longer than any endpoint's path (a topic name is at most 249 bytes, 747 escaped). */
#define PATH_MAX_BYTES 1024

/* The headers a record takes one value of: a request with two of one is refused. */
static const char *const single_headers[] = {MHD_HTTP_HEADER_AUTHORIZATION,
											 MHD_HTTP_HEADER_CONTENT_TYPE,
											 MHD_HTTP_HEADER_CONTENT_ENCODING,
											 "Idempotency-Key",
											 "X-Wal-Key",
											 "traceparent",
											 "tracestate",
											 NULL};

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
	ROUTE_NONE,   /* an error is set */
	ROUTE_REFUSED /* answered 400 at once, and the connection closed */
} url_route;

/* What a request is, kept between the handler's calls. */
typedef struct http_state
{
	ingest_request *req; /* NULL until the handler's first call */
	url_route route;
	bool has_query; /* the request target holds a "?" */
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

/*
 * A 400 for a request refused from the handler's first call, before its body is read:
 * queued with "Connection: close", so the connection ends after it (http_framing.h).
 * message is plain ASCII.
 */
static enum MHD_Result
refuse_request(struct MHD_Connection *connection, const char *message)
{
	json_t *body = json_pack("{s:s, s:s}", "error", "bad_request", "message", message);
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	const char *labels[] = {"400"};
	struct MHD_Response *response;
	enum MHD_Result result;

	json_decref(body);
	if (text == NULL)
		return MHD_NO;
	response = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	if (response == NULL)
	{
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	result = http_queue_closing(connection, MHD_HTTP_BAD_REQUEST, response);
	MHD_destroy_response(response);
	metric_add(ingest_m.requests, 1, labels);
	return result;
}

/*
 * Called with the request target as sent, before libmicrohttpd splits off its query: a
 * request's state starts here (MHD_OPTION_URI_LOG_CALLBACK).
 */
static void *
request_started(void *arg, const char *uri, struct MHD_Connection *connection)
{
	http_state *st = calloc(1, sizeof(*st));

	(void) arg;
	(void) connection;
	if (st == NULL)
		fatal("event=out_of_memory what=http_state");
	st->has_query = strchr(uri, '?') != NULL;
	return st;
}

/*
 * Decodes the percent escapes of s (len bytes) into out (len + 1 bytes at least) and
 * sets *out_len; NULL when fine, else what is wrong: a malformed escape, %00, or bytes
 * that are not UTF-8 once decoded.
 */
static const char *
decode_path(const char *s, size_t len, char *out, size_t *out_len)
{
	size_t o = 0;

	for (size_t i = 0; i < len; i++)
	{
		int hi, lo;

		if (s[i] != '%')
		{
			out[o++] = s[i];
			continue;
		}
		if (i + 2 >= len || (hi = hex_digit_value(s[i + 1])) < 0 ||
			(lo = hex_digit_value(s[i + 2])) < 0)
			return "holds a malformed percent escape (a \"%\" not followed by two hex digits)";
		if (hi == 0 && lo == 0)
			return "holds %00 (a NUL byte)";
		out[o++] = (char) (hi << 4 | lo);
		i += 2;
	}
	out[o] = '\0';
	if (record_invalid_utf8_at(out, o) >= 0)
		return "is not UTF-8 once its percent escapes are decoded";
	*out_len = o;
	return NULL;
}

/* The bearer token, the topic and the token's right to it: 401, 403, 404 or fine. */
static void
authorize(ingest_request *req, const char *topic)
{
	const char *bearer;
	size_t bearer_len;
	const ingest_token *token;

	if (!http_bearer_token(req->connection, &bearer, &bearer_len))
	{
		ingest_request_fail(req, 401, "unauthorized",
							"send \"Authorization: Bearer <token>\" with an ingest token "
							"(wal_delivery.create_ingest_token)");
		return;
	}
	/* The token with its length: "<token>\0junk" is not "<token>". */
	token = memchr(bearer, '\0', bearer_len) == NULL ? ingest_catalog_token(req->catalog, bearer)
													 : NULL;
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

/*
 * 415 for a body in a content coding (gzip, ...): the service does not decode one, and
 * the compressed bytes would be stored as the payload, which no reader could take for
 * the record sent. "identity" is no coding.
 */
static void
refuse_content_encoding(ingest_request *req)
{
	const char *coding;
	size_t len;

	if (!http_header(req->connection, MHD_HTTP_HEADER_CONTENT_ENCODING, &coding, &len) ||
		(len == 8 && strncasecmp(coding, "identity", 8) == 0))
		return;
	ingest_request_fail(req, 415, "unsupported_content_encoding",
						"the body has Content-Encoding \"%.40s\": send it without one (the "
						"service stores the body as the payload and decodes no coding)",
						coding);
}

/*
 * Reads the path (as sent) and the method on the first call; sets the route and any
 * early error, or returns ROUTE_REFUSED with why for a 400 at once.
 */
static url_route
route_request(http_state *st, const char *url, const char *method, char *why, size_t why_size)
{
	ingest_request *req = st->req;
	bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, "HEAD") == 0;
	url_route route = ROUTE_NONE;
	size_t url_len = strlen(url), path_len, topic_len;
	char path[PATH_MAX_BYTES], topic[PATH_MAX_BYTES], shown[256];
	const char *slash, *problem;

	if (url_len >= sizeof(path))
	{
		ingest_request_fail(req, 404, "not_found",
							"no such endpoint: POST /v1/topics/{topic}/records or /batch");
		return ROUTE_NONE;
	}
	if ((problem = decode_path(url, url_len, path, &path_len)) != NULL)
	{
		http_escape(url, url_len, shown, sizeof(shown));
		snprintf(why, why_size, "the path \"%s\" %s", shown, problem);
		return ROUTE_REFUSED;
	}
	if (strcmp(path, "/healthz") == 0)
		route = ROUTE_HEALTHZ;
	else if (strcmp(path, "/readyz") == 0)
		route = ROUTE_READYZ;
	else if (strcmp(path, "/metrics") == 0)
		route = ROUTE_METRICS;
	if (route != ROUTE_NONE)
	{
		if (!get)
		{
			ingest_request_fail(req, 405, "method_not_allowed", "%s takes GET", path);
			req->allow = "GET, HEAD";
		}
		return get ? route : ROUTE_NONE;
	}
	/* Split as sent: an escaped "/" (%2F) belongs to the topic, which then is no name. */
	if (strncmp(url, TOPIC_PREFIX, sizeof(TOPIC_PREFIX) - 1) != 0 ||
		(slash = strchr(url + sizeof(TOPIC_PREFIX) - 1, '/')) == NULL ||
		(strcmp(slash, "/records") != 0 && strcmp(slash, "/batch") != 0) ||
		slash == url + sizeof(TOPIC_PREFIX) - 1)
	{
		ingest_request_fail(req, 404, "not_found",
							"no such endpoint: POST /v1/topics/{topic}/records or /batch");
		return ROUTE_NONE;
	}
	if (strcmp(method, MHD_HTTP_METHOD_POST) != 0)
	{
		ingest_request_fail(req, 405, "method_not_allowed", "records are sent with POST");
		req->allow = "POST";
		return ROUTE_NONE;
	}
	if (st->has_query)
	{
		http_escape(url, url_len, shown, sizeof(shown));
		snprintf(why, why_size,
				 "the path \"%s\" has a query string (\"?...\"): the records endpoints take none",
				 shown);
		return ROUTE_REFUSED;
	}
	url += sizeof(TOPIC_PREFIX) - 1;
	if ((problem = decode_path(url, (size_t) (slash - url), topic, &topic_len)) != NULL ||
		(problem = record_topic_name_problem(topic, topic_len)) != NULL)
	{
		http_escape(url, (size_t) (slash - url), shown, sizeof(shown));
		snprintf(why, why_size, "the topic \"%s\" in the path is not a topic name: %s", shown,
				 problem);
		return ROUTE_REFUSED;
	}
	req->batch = strcmp(slash, "/batch") == 0;
	req->catalog = ingest_catalog_acquire();
	authorize(req, topic);
	refuse_content_encoding(req);
	if (req->topic)
		req->body_limit = req->batch ? INGEST_BATCH_MAX_BYTES : (size_t) req->topic->record_limit;
	return req->batch ? ROUTE_BATCH : ROUTE_RECORDS;
}

/*
 * A client that sent "Expect: 100-continue" waits for the go-ahead before its body. When
 * the answer is already known (401, 403, 404, 405, or a Content-Length over the limit)
 * it is given at once instead, and the connection closed: the client never sends a
 * body that would only be read to be thrown away. Other clients are sending their body
 * already; it is read (counted, not kept), so they get the answer rather than a reset.
 */
static bool
answer_before_body(ingest_request *req)
{
	const char *expect, *length;
	size_t expect_len, length_len;

	if (!http_header(req->connection, MHD_HTTP_HEADER_EXPECT, &expect, &expect_len) ||
		expect_len != 12 || strncasecmp(expect, "100-continue", 12) != 0)
		return false;
	if (req->error_status == 0 && req->topic != NULL &&
		http_header(req->connection, MHD_HTTP_HEADER_CONTENT_LENGTH, &length, &length_len) &&
		strtoull(length, NULL, 10) > req->body_limit)
	{
		req->body_too_large = true;
		ingest_request_fail(req, 413, "too_large",
							req->batch ? "the batch is over %zu bytes (Content-Length: %.20s)"
									   : "the payload is over the topic's limit of %zu bytes "
										 "(Content-Length: %.20s)",
							req->body_limit, length);
	}
	if (req->error_status == 0)
		return false;
	req->closing = true;
	return true;
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
	if (req->body_len + size + 1 > req->body_cap && !ingest_request_grow_body(req, size))
	{
		static _Atomic int64_t logged_ms;
		int64_t now = now_ms(), last = atomic_load(&logged_ms);

		ingest_request_fail(req, 503, "busy",
							"the service holds %zu MiB of request bodies, its limit; send the "
							"request again after Retry-After",
							INGEST_BODIES_MAX_BYTES >> 20);
		/* Once a second at most: under a flood of uploads the log says it, not each one. */
		if (now - last >= 1000 && atomic_compare_exchange_strong(&logged_ms, &last, now))
			log_warn("event=bodies_limit_reached limit_bytes=%zu msg=\"requests get 503 until "
					 "uploads in progress end\"",
					 INGEST_BODIES_MAX_BYTES);
		return;
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
	if (st == NULL) /* request_started made it; never NULL */
		return MHD_NO;
	if (st->req == NULL)
	{
		/* Headers are in; the body (if any) comes in the next calls. */
		char why[512];

		st->req = ingest_request_new(connection);
		atomic_fetch_add(&requests_in_flight, 1);
		if (!http_framing_ok(connection, single_headers, why, sizeof(why)))
			return refuse_request(connection, why);
		st->route = route_request(st, url, method, why, sizeof(why));
		if (st->route == ROUTE_REFUSED)
			return refuse_request(connection, why);
		if (answer_before_body(st->req))
			return ingest_request_answer(st->req);
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
	if (!req->handed_on && req->error_status == 0 &&
		MHD_get_connection_values(connection, MHD_FOOTER_KIND, NULL, NULL) > 0)
		ingest_request_fail(req, 400, "bad_request",
							"the request has trailer fields after its chunked body: send every "
							"field before the body (a proxy may merge trailers into the header, "
							"this service reads none)");
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
	if (st->req != NULL)
	{
		ingest_request_free(st->req);
		atomic_fetch_sub(&requests_in_flight, 1);
	}
	free(st);
	*state_ptr = NULL;
}

/*
 * As many connections as the open-file limit allows beside the worker's own descriptors
 * (the limit raised toward what HTTP_CONNECTION_LIMIT needs; when it stays low, half of it). Over
 * the connection limit, libmicrohttpd closes a new connection at once, which a client or load
 * balancer sees and retries elsewhere; over the file limit, accept() would fail and every new
 * client would wait unanswered until connections went away.
 */
static unsigned int
connection_limit(void)
{
	long files = file_limit_raise(HTTP_CONNECTION_LIMIT + HTTP_RESERVED_FILES);
	long room = files - HTTP_RESERVED_FILES;

	if (room >= HTTP_CONNECTION_LIMIT)
		return HTTP_CONNECTION_LIMIT;
	if (room < files / 2)
		room = files / 2; /* a low limit: half for connections, half for the rest */
	log_warn("event=connection_limit_lowered connections=%ld open_files=%ld msg=\"the open-file "
			 "limit allows no more; raise LimitNOFILE to %d for %d\"",
			 room, files, HTTP_CONNECTION_LIMIT + HTTP_RESERVED_FILES, HTTP_CONNECTION_LIMIT);
	return (unsigned int) room;
}

ingest_http *
ingest_http_start(const char *listen_spec, bool (*is_ready)(void), char *errbuf, size_t errbuf_size)
{
	ingest_http *http = calloc(1, sizeof(*http));
	unsigned int connections = connection_limit();
	int fd;

	http->is_ready = is_ready;
	fd = listen_socket_open(listen_spec, &http->port, errbuf, errbuf_size);
	if (fd < 0)
	{
		free(http);
		return NULL;
	}
	http->daemon = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
			MHD_USE_ERROR_LOG | MHD_USE_ITC,
		0, NULL, NULL, handle_request, http, MHD_OPTION_EXTERNAL_LOGGER, listen_socket_log_mhd,
		"http_server_message", MHD_OPTION_LISTEN_SOCKET, (MHD_socket) fd,
		MHD_OPTION_THREAD_POOL_SIZE, (unsigned int) HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
		connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int) HTTP_CONNECTION_TIMEOUT,
		MHD_OPTION_CLIENT_DISCIPLINE_LVL, (int) HTTP_CLIENT_DISCIPLINE,
		MHD_OPTION_UNESCAPE_CALLBACK, http_keep_escaped, NULL, MHD_OPTION_URI_LOG_CALLBACK,
		request_started, NULL, MHD_OPTION_NOTIFY_COMPLETED, request_completed, NULL,
		MHD_OPTION_END);
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
