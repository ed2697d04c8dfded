/*
 * console_http.c: the console's HTTP server (see console_http.h): framing, sessions by
 * cookie, CSRF and Origin checks, the headers of every answer, and routing to the page,
 * sign-in and the API.
 */
#include "console/console_http.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/clock.h"
#include "common/http_framing.h"
#include "common/listen_socket.h"
#include "common/log.h"
#include "common/metrics.h"
#include "console/console_api.h"
#include "console/console_assets.h"
#include "console/console_request.h"
#include "console/console_signin.h"
#include "shared/hex.h"
#include "shared/utf8.h"

#define HTTP_THREADS            4
#define HTTP_CONNECTION_LIMIT   256
#define HTTP_CONNECTION_TIMEOUT 60

static const char *const single_headers[] = {MHD_HTTP_HEADER_CONTENT_TYPE, MHD_HTTP_HEADER_COOKIE,
											 "Origin", "X-CSRF-Token", NULL};

struct console_http
{
	struct MHD_Daemon *daemon;
	int port;
	console_http_settings settings;
};

/* What a request is, kept between the handler's calls. */
typedef struct
{
	char *body;
	size_t body_len;
	bool too_large;
} http_state;

static metric *requests_metric, *refused_metric;

/* ---------------------------------------------------------------- answers */

void
console_answer_json_text(console_answer *a, unsigned int status, const char *text)
{
	free(a->body);
	a->status = status;
	a->content_type = "application/json";
	a->body = strdup(text);
	a->body_len = strlen(text);
}

void
console_answer_json(console_answer *a, unsigned int status, json_t *json)
{
	char *text = json ? json_dumps(json, JSON_COMPACT) : NULL;

	json_decref(json);
	console_answer_json_text(a, text ? status : 500, text ? text : "{\"error\":\"out of memory\"}");
	free(text);
}

void
console_answer_error(console_answer *a, unsigned int status, const char *fmt, ...)
{
	char message[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	console_answer_json(a, status, json_pack("{s:s}", "error", message));
}

int
console_query_arg(const console_request *r, const char *name, char *out, size_t out_size)
{
	const char *value = NULL;
	size_t len = 0, o = 0;

	if (MHD_lookup_connection_value_n(r->connection, MHD_GET_ARGUMENT_KIND, name, strlen(name),
									  &value, &len) != MHD_YES ||
		value == NULL || len == 0)
		return 0;
	for (size_t i = 0; i < len; i++)
	{
		int hi, lo;

		if (o + 1 >= out_size)
			return -1;
		if (value[i] != '%')
		{
			out[o++] = value[i] == '+' ? ' ' : value[i];
			continue;
		}
		if (i + 2 >= len || (hi = hex_digit_value(value[i + 1])) < 0 ||
			(lo = hex_digit_value(value[i + 2])) < 0 || (hi == 0 && lo == 0))
			return -1;
		out[o++] = (char) (hi << 4 | lo);
		i += 2;
	}
	out[o] = '\0';
	for (size_t i = 0; i < o;)
	{
		size_t n = utf8_sequence_length((const unsigned char *) out + i, o - i);

		if (n == 0)
			return -1;
		i += n;
	}
	return o > 0;
}

json_t *
console_body_object(const console_request *r, console_answer *a)
{
	json_error_t error;
	json_t *body =
		r->body ? json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &error) : NULL;

	if (!json_is_object(body))
	{
		json_decref(body);
		console_answer_error(a, 400, "the body must be a JSON object");
		return NULL;
	}
	return body;
}

/* ---------------------------------------------------------------- checks */

/* The session cookie's token, or NULL. */
static const char *
cookie_token(struct MHD_Connection *connection)
{
	return MHD_lookup_connection_value(connection, MHD_COOKIE_KIND, CONSOLE_COOKIE);
}

/*
 * Why a state-changing request may come from another site's page, or NULL: an Origin
 * that is not this Host, or a browser saying the request is cross-site.
 */
static const char *
cross_site(struct MHD_Connection *connection)
{
	const char *origin = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "Origin");
	const char *host =
		MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
	const char *site = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "Sec-Fetch-Site");

	if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
		return "the browser says this request comes from another site (Sec-Fetch-Site)";
	if (origin == NULL)
		return NULL;
	if (host != NULL)
	{
		const char *rest = strncmp(origin, "https://", 8) == 0  ? origin + 8
						   : strncmp(origin, "http://", 7) == 0 ? origin + 7
																: NULL;

		if (rest && strcmp(rest, host) == 0)
			return NULL;
	}
	return "the Origin header is not this console's address";
}

static void
count_refused(const char *why)
{
	const char *labels[] = {why};

	metric_add(refused_metric, 1, labels);
}

/* ---------------------------------------------------------------- session endpoints */

static void
session_cookie(console_answer *a, const console_http *http, const char *token)
{
	snprintf(a->set_cookie, sizeof(a->set_cookie), "%s=%s; HttpOnly; SameSite=Strict; Path=/%s%s",
			 CONSOLE_COOKIE, token, token[0] ? "" : "; Max-Age=0",
			 http->settings.secure_cookie ? "; Secure" : "");
}

static void
sign_in(const console_http *http, console_request *r, console_answer *a)
{
	const char *type =
		MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
	json_t *body, *user, *password;
	console_signin_result result;

	if (type == NULL || strncasecmp(type, "application/json", 16) != 0)
		return console_answer_error(a, 415, "sign in with a JSON body {\"user\", \"password\"}");
	if ((body = console_body_object(r, a)) == NULL)
		return;
	user = json_object_get(body, "user");
	password = json_object_get(body, "password");
	if (!json_is_string(user) || !json_is_string(password) || json_string_length(user) == 0 ||
		json_string_length(user) > 63 || json_string_length(password) == 0 ||
		json_string_length(password) > 1024 ||
		strlen(json_string_value(user)) != json_string_length(user) ||
		strlen(json_string_value(password)) != json_string_length(password))
	{
		json_decref(body);
		return console_answer_error(a, 400,
									"user (1 to 63 bytes) and password (1 to 1024 bytes) are "
									"needed, as strings without NUL");
	}
	/* jansson's copy is wiped by console_signin: the password lives no longer than that. */
	console_signin(r->client, json_string_value(user), (char *) json_string_value(password),
				   &result);
	json_decref(body);
	if (result.status != 200)
	{
		a->retry_after_s = result.retry_after_s;
		return console_answer_error(a, (unsigned int) result.status, "%s", result.message);
	}
	/* A browser signing in again leaves no older session of its own behind. */
	if (r->session != NULL)
		console_session_end(r->session);
	session_cookie(a, http, result.session->token);
	console_answer_json(
		a, 200,
		json_pack("{s:s, s:s}", "user", result.session->user, "csrf", result.session->csrf));
	console_session_release(result.session);
}

static void
session_info(const console_http *http, console_request *r, console_answer *a)
{
	PGresult *res = console_query(
		r, a,
		"SELECT coalesce(json_agg(rolname ORDER BY rolname), '[]')::text FROM pg_catalog.pg_roles"
		" WHERE rolname LIKE 'wal\\_delivery\\_%' AND pg_has_role(session_user, oid, 'MEMBER')",
		0, NULL);
	json_t *roles;

	if (res == NULL)
		return;
	roles = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
	PQclear(res);
	console_answer_json(a, 200,
						json_pack("{s:s, s:s, s:o, s:i, s:I}", "user", r->session->user, "csrf",
								  r->session->csrf, "roles", roles ? roles : json_array(),
								  "idle_timeout_s", http->settings.idle_s, "expires_in_s",
								  (json_int_t) (http->settings.max_age_s -
												(now_ms() - r->session->started_ms) / 1000)));
}

/* ---------------------------------------------------------------- routing */

static void
route(const console_http *http, console_request *r, console_answer *a)
{
	bool get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
	bool post = strcmp(r->method, "POST") == 0;
	const char *why, *csrf;

	if (strncmp(r->path, "/api/", 5) != 0)
	{
		const console_asset *asset = console_asset_find(r->path);

		if (strcmp(r->path, "/healthz") == 0 && get)
			return console_answer_json_text(a, 200, "{\"ok\":true}");
		if (asset == NULL)
			return console_answer_error(a, 404, "not found");
		if (!get)
			return console_answer_error(a, 405, "GET only");
		a->status = 200;
		a->asset = true;
		a->content_type = asset->content_type;
		a->body = malloc(asset->len);
		memcpy(a->body, asset->data, asset->len);
		a->body_len = asset->len;
		return;
	}
	if (!get && !post)
		return console_answer_error(a, 405, "GET or POST only");
	if (post && (why = cross_site(r->connection)) != NULL)
	{
		count_refused("cross_site");
		return console_answer_error(a, 403, "refused: %s", why);
	}
	if (strcmp(r->path, "/api/session") == 0 && post)
		return sign_in(http, r, a);
	if (r->session == NULL)
		return console_answer_error(a, 401, "sign in first (your session ended or never began)");
	if (post)
	{
		csrf = MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, "X-CSRF-Token");
		if (csrf == NULL || !console_token_equal(csrf, r->session->csrf))
		{
			count_refused("csrf");
			return console_answer_error(
				a, 403, "refused: no valid X-CSRF-Token (the page gets it from GET /api/session)");
		}
	}
	if (strcmp(r->path, "/api/session") == 0)
		return session_info(http, r, a);
	if (strcmp(r->path, "/api/signout") == 0 && post)
	{
		console_session_end(r->session);
		session_cookie(a, http, "");
		return console_answer_json_text(a, 200, "{\"signed_out\":true}");
	}
	console_api_dispatch(r, a);
}

/* ---------------------------------------------------------------- libmicrohttpd */

static enum MHD_Result
send_answer(const console_http *http, struct MHD_Connection *connection, console_answer *a)
{
	struct MHD_Response *response =
		MHD_create_response_from_buffer(a->body_len, a->body, MHD_RESPMEM_MUST_FREE);
	enum MHD_Result result;
	char status[8], retry[16];
	const char *labels[] = {status};

	(void) http;
	if (response == NULL)
	{
		free(a->body);
		return MHD_NO;
	}
	a->body = NULL;
	MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
							a->content_type ? a->content_type : "application/json");
	MHD_add_response_header(response, "Content-Security-Policy", CONSOLE_CSP);
	MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(response, "Referrer-Policy", "no-referrer");
	MHD_add_response_header(response, "X-Frame-Options", "DENY");
	MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL,
							a->asset ? "no-cache" : "no-store");
	if (a->set_cookie[0])
		MHD_add_response_header(response, MHD_HTTP_HEADER_SET_COOKIE, a->set_cookie);
	if (a->disposition[0])
		MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_DISPOSITION, a->disposition);
	if (a->retry_after_s > 0)
	{
		snprintf(retry, sizeof(retry), "%d", a->retry_after_s);
		MHD_add_response_header(response, MHD_HTTP_HEADER_RETRY_AFTER, retry);
	}
	snprintf(status, sizeof(status), "%u", a->status);
	metric_add(requests_metric, 1, labels);
	result = MHD_queue_response(connection, a->status, response);
	MHD_destroy_response(response);
	return result;
}

static void
client_address(struct MHD_Connection *connection, char *out, size_t out_size)
{
	const union MHD_ConnectionInfo *info =
		MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = info ? info->client_addr : NULL;

	snprintf(out, out_size, "unknown");
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *) sa)->sin_addr, out, (socklen_t) out_size);
	else if (sa && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *) sa)->sin6_addr, out,
				  (socklen_t) out_size);
}

static enum MHD_Result
handle_request(void *arg, struct MHD_Connection *connection, const char *url, const char *method,
			   const char *version, const char *upload_data, size_t *upload_data_size,
			   void **state_ptr)
{
	const console_http *http = arg;
	http_state *st = *state_ptr;
	console_request r = {0};
	console_answer a = {0};
	enum MHD_Result result;

	(void) version;
	if (st == NULL)
	{
		char why[512];

		/* Headers are in; the body (if any) comes in the next calls. */
		if (!http_framing_ok(connection, single_headers, why, sizeof(why)))
		{
			struct MHD_Response *resp;

			count_refused("framing");
			resp = MHD_create_response_from_buffer(strlen(why), why, MHD_RESPMEM_MUST_COPY);
			MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
									"text/plain; charset=utf-8");
			result = http_queue_closing(connection, 400, resp);
			MHD_destroy_response(resp);
			return result;
		}
		*state_ptr = st = calloc(1, sizeof(*st));
		return st ? MHD_YES : MHD_NO;
	}
	if (*upload_data_size != 0)
	{
		if (!st->too_large && st->body_len + *upload_data_size <= CONSOLE_BODY_MAX)
		{
			char *grown = realloc(st->body, st->body_len + *upload_data_size + 1);

			if (grown == NULL)
				return MHD_NO;
			st->body = grown;
			memcpy(st->body + st->body_len, upload_data, *upload_data_size);
			st->body_len += *upload_data_size;
			st->body[st->body_len] = '\0';
		}
		else
			st->too_large = true;
		*upload_data_size = 0;
		return MHD_YES;
	}
	r.connection = connection;
	r.method = method;
	r.path = url;
	r.body = st->body;
	r.body_len = st->body_len;
	client_address(connection, r.client, sizeof(r.client));
	r.session = console_session_acquire(cookie_token(connection));
	if (st->too_large)
		console_answer_error(&a, 413, "the body is over %d bytes", CONSOLE_BODY_MAX);
	else
		route(http, &r, &a);
	console_session_release(r.session);
	return send_answer(http, connection, &a);
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
	free(st->body);
	free(st);
	*state_ptr = NULL;
}

console_http *
console_http_start(const console_http_settings *settings, char *errbuf, size_t errbuf_size)
{
	static const char *const status[] = {"status"};
	static const char *const why[] = {"why"};
	console_http *http = calloc(1, sizeof(*http));
	int fd;

	requests_metric = metric_counter("wal_console_requests_total",
									 "Console HTTP requests answered, by status", 1, status);
	refused_metric = metric_counter(
		"wal_console_refused_total",
		"Console requests refused before any handler: framing, csrf, cross_site", 1, why);
	http->settings = *settings;
	fd = listen_socket_open(settings->listen, &http->port, errbuf, errbuf_size);
	if (fd < 0)
	{
		free(http);
		return NULL;
	}
	http->daemon = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC, 0, NULL,
		NULL, handle_request, http, MHD_OPTION_EXTERNAL_LOGGER, listen_socket_log_mhd,
		"http_server_message", MHD_OPTION_LISTEN_SOCKET, (MHD_socket) fd,
		MHD_OPTION_THREAD_POOL_SIZE, (unsigned int) HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
		(unsigned int) HTTP_CONNECTION_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT,
		(unsigned int) HTTP_CONNECTION_TIMEOUT, MHD_OPTION_CLIENT_DISCIPLINE_LVL,
		(int) HTTP_CLIENT_DISCIPLINE, MHD_OPTION_UNESCAPE_CALLBACK, http_keep_escaped, NULL,
		MHD_OPTION_NOTIFY_COMPLETED, request_completed, NULL, MHD_OPTION_END);
	if (http->daemon == NULL)
	{
		snprintf(errbuf, errbuf_size, "cannot start the HTTP server on %s (see the log)",
				 settings->listen);
		close(fd);
		free(http);
		return NULL;
	}
	return http;
}

int
console_http_port(const console_http *http)
{
	return http->port;
}

void
console_http_stop(console_http *http)
{
	if (http == NULL)
		return;
	MHD_stop_daemon(http->daemon);
	free(http);
}
