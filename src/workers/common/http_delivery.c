/*
 * http_delivery.c: the delivery engine on libcurl multi (see http_delivery.h).
 *
 * A request lives in one of two places: the FIFO queue of its destination (waiting) or
 * the multi handle plus the engine's active list (in flight). Destinations with waiting
 * requests and a free slot sit in a ready queue; slots of the engine's total are handed
 * out round-robin over it, one request per turn, which is what keeps one destination's
 * backlog from starving the others.
 */
#include "http_delivery.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "clock.h"
#include "file_limit.h"
#include "log.h"

#define DESTINATION_BUCKETS  256
#define RETRY_AFTER_MAX      128
#define RESPONSE_EXCERPT_MAX 256

typedef struct delivery_request delivery_request;
typedef struct destination_state destination_state;

/*
 * An easy handle and what it fills in during a transfer. It outlives requests: a
 * finished one waits, still set up, in its destination's idle list for the next request,
 * so the buffers here are never allocated per request.
 */
typedef struct transfer
{
	CURL *easy;
	delivery_request *request; /* the one in flight on it */
	bool has_retry_after;
	char retry_after[RETRY_AFTER_MAX];
	char curl_error[CURL_ERROR_SIZE];
	size_t excerpt_len;
	char response_excerpt[RESPONSE_EXCERPT_MAX];
} transfer;

/* What a destination's idle easy handles are set up for; a request that differs gets a
 * fresh handle (a config change), and the idle ones are dropped. */
typedef struct prepared_options
{
	char *url;
	char *method;
	long timeout_ms;
	bool verify_tls;
	bool sends_body;
} prepared_options;

struct destination_state
{
	char *name;
	int max_in_flight; /* <= 0: no limit */
	transfer **idle;   /* finished transfers, kept set up for the next request */
	int n_idle;
	int max_idle;
	prepared_options prepared;
	int in_flight;
	int waiting;
	delivery_request *waiting_head;
	delivery_request *waiting_tail;
	destination_state *next_in_bucket;
	destination_state *next_ready;
	bool in_ready_queue;
};

struct delivery_request
{
	destination_state *destination;
	delivery_request *next_waiting;
	delivery_request *prev_active;
	delivery_request *next_active;
	transfer *transfer; /* set only while in flight */
	/* method, url, the header lines and their list nodes, and an unborrowed body all live
	 * in this request's own allocation (one malloc per request). */
	char *method;
	char *url;
	struct curl_slist *headers;
	const char *body;
	size_t body_len;
	bool sends_body;
	long timeout_ms;
	bool verify_tls;
	http_done_fn done;
	void *opaque;
	long long submitted_at_ms;
	long long started_at_ms;
	const char *start_error; /* why it could not start (a static string) */
	bool held;               /* the start gate kept it from starting */
	bool withdrawn;          /* http_engine_withdraw took it back unsent */
};

struct http_engine
{
	CURLM *multi;
	int max_total_in_flight; /* <= 0: no cap */
	int in_flight;
	int waiting;
	bool closing;
	http_start_gate_fn gate;
	void *gate_arg;
	destination_state *buckets[DESTINATION_BUCKETS];
	destination_state *ready_head;
	destination_state *ready_tail;
	delivery_request *active_head;
};

/* FNV-1a: destination names are short and few; any even spread will do. */
static unsigned
destination_bucket(const char *name)
{
	uint32_t hash = 2166136261u;

	for (const unsigned char *p = (const unsigned char *) name; *p; p++)
		hash = (hash ^ *p) * 16777619u;
	return hash % DESTINATION_BUCKETS;
}

static destination_state *
find_destination(http_engine *engine, const char *name)
{
	destination_state *d = engine->buckets[destination_bucket(name)];

	while (d && strcmp(d->name, name) != 0)
		d = d->next_in_bucket;
	return d;
}

/* Destinations are kept for the engine's life: their number is bounded by the config. */
static destination_state *
find_or_add_destination(http_engine *engine, const char *name)
{
	destination_state *d = find_destination(engine, name);
	unsigned bucket;

	if (d)
		return d;
	d = calloc(1, sizeof(*d));
	if (!d || !(d->name = strdup(name)))
	{
		free(d);
		return NULL;
	}
	bucket = destination_bucket(name);
	d->next_in_bucket = engine->buckets[bucket];
	engine->buckets[bucket] = d;
	return d;
}

static bool
destination_has_room(const destination_state *d)
{
	return d->max_in_flight <= 0 || d->in_flight < d->max_in_flight;
}

static void
mark_ready_if_runnable(http_engine *engine, destination_state *d)
{
	if (d->in_ready_queue || !d->waiting_head || !destination_has_room(d))
		return;
	d->in_ready_queue = true;
	d->next_ready = NULL;
	if (engine->ready_tail)
		engine->ready_tail->next_ready = d;
	else
		engine->ready_head = d;
	engine->ready_tail = d;
}

static destination_state *
pop_ready_destination(http_engine *engine)
{
	destination_state *d = engine->ready_head;

	engine->ready_head = d->next_ready;
	if (!engine->ready_head)
		engine->ready_tail = NULL;
	d->in_ready_queue = false;
	d->next_ready = NULL;
	return d;
}

static bool
same_options(const prepared_options *p, const delivery_request *r)
{
	return p->url && strcmp(p->url, r->url) == 0 && strcmp(p->method, r->method) == 0 &&
		   p->timeout_ms == r->timeout_ms && p->verify_tls == r->verify_tls &&
		   p->sends_body == r->sends_body;
}

static void
free_transfer(transfer *t)
{
	curl_easy_cleanup(t->easy);
	free(t);
}

static void
drop_idle_transfers(destination_state *d)
{
	while (d->n_idle > 0)
		free_transfer(d->idle[--d->n_idle]);
	free(d->prepared.url);
	free(d->prepared.method);
	memset(&d->prepared, 0, sizeof(d->prepared));
}

/*
 * Reuses a finished transfer of the destination as it was left: only the options that
 * change per request are set again (no curl_easy_reset, no URL parse); a handle's
 * connection goes back to the multi handle's pool either way. *fresh says whether all
 * options must be set. NULL when out of memory.
 */
static transfer *
take_transfer(delivery_request *r, bool *fresh)
{
	destination_state *d = r->destination;
	transfer *t;

	*fresh = false;
	if (same_options(&d->prepared, r))
	{
		if (d->n_idle > 0)
			return d->idle[--d->n_idle];
	}
	else
	{
		drop_idle_transfers(d);
		d->prepared.url = strdup(r->url);
		d->prepared.method = strdup(r->method);
		d->prepared.timeout_ms = r->timeout_ms;
		d->prepared.verify_tls = r->verify_tls;
		d->prepared.sends_body = r->sends_body;
		if (!d->prepared.url || !d->prepared.method)
			drop_idle_transfers(d);
	}
	*fresh = true;
	t = calloc(1, sizeof(*t));
	if (t && !(t->easy = curl_easy_init()))
	{
		free(t);
		t = NULL;
	}
	return t;
}

static void
give_back_transfer(delivery_request *r)
{
	destination_state *d = r->destination;
	transfer *t = r->transfer;
	int limit = d->max_in_flight > 0 ? d->max_in_flight : 64;

	t->request = NULL;
	if (d->n_idle < limit && same_options(&d->prepared, r))
	{
		if (d->max_idle < limit)
		{
			transfer **grown = realloc(d->idle, sizeof(transfer *) * limit);

			if (!grown)
			{
				free_transfer(t);
				return;
			}
			d->idle = grown;
			d->max_idle = limit;
		}
		d->idle[d->n_idle++] = t;
	}
	else
		free_transfer(t);
}

static void
free_request(delivery_request *r)
{
	if (r->transfer)
		give_back_transfer(r);
	free(r);
}

/* Keeps the value of Retry-After from the final answer (a 1xx answer comes first). */
static size_t
capture_header(char *line, size_t size, size_t n_items, void *userdata)
{
	transfer *r = userdata;
	size_t len = size * n_items;
	static const char name[] = "retry-after:";
	size_t name_len = sizeof(name) - 1;

	if (len >= 5 && strncmp(line, "HTTP/", 5) == 0)
	{
		r->has_retry_after = false;
		r->excerpt_len = 0;
		r->response_excerpt[0] = '\0';
	}
	else if (len > name_len && strncasecmp(line, name, name_len) == 0)
	{
		const char *value = line + name_len;
		size_t value_len = len - name_len;

		while (value_len > 0 && isspace((unsigned char) *value))
			value++, value_len--;
		while (value_len > 0 && isspace((unsigned char) value[value_len - 1]))
			value_len--;
		if (value_len >= RETRY_AFTER_MAX)
			value_len = RETRY_AFTER_MAX - 1;
		memcpy(r->retry_after, value, value_len);
		r->retry_after[value_len] = '\0';
		r->has_retry_after = true;
	}
	return len;
}

/* Keeps the answer body's first bytes for logs and dead letters; the rest is dropped. */
static size_t
capture_body_excerpt(char *data, size_t size, size_t n_items, void *userdata)
{
	transfer *r = userdata;
	size_t len = size * n_items;
	size_t room = RESPONSE_EXCERPT_MAX - 1 - r->excerpt_len;
	size_t take = len < room ? len : room;

	memcpy(r->response_excerpt + r->excerpt_len, data, take);
	r->excerpt_len += take;
	r->response_excerpt[r->excerpt_len] = '\0';
	return len;
}

/*
 * Sets up the easy handle when the request starts, so waiting requests stay small. A
 * fresh handle gets every option; a reused one was left with this destination's.
 */
static CURLcode
configure_transfer(delivery_request *r, bool fresh)
{
	CURLcode rc = CURLE_OK;
	transfer *t = r->transfer;
	CURL *easy = t->easy;

#define SET(option, value)                                                                         \
	do                                                                                             \
	{                                                                                              \
		if (rc == CURLE_OK)                                                                        \
			rc = curl_easy_setopt(easy, option, value);                                            \
	} while (0)

	if (fresh)
	{
		SET(CURLOPT_PRIVATE, t);
		SET(CURLOPT_ERRORBUFFER, t->curl_error);
		SET(CURLOPT_HEADERDATA, t);
		SET(CURLOPT_WRITEDATA, t);
		SET(CURLOPT_URL, r->url);
		SET(CURLOPT_PROTOCOLS_STR, "http,https");
		SET(CURLOPT_FOLLOWLOCATION, 0L);
		SET(CURLOPT_NOSIGNAL, 1L);
		SET(CURLOPT_TCP_KEEPALIVE, 1L);
		SET(CURLOPT_USERAGENT, "wal_delivery");
		SET(CURLOPT_HEADERFUNCTION, capture_header);
		SET(CURLOPT_WRITEFUNCTION, capture_body_excerpt);
		SET(CURLOPT_SSL_VERIFYPEER, r->verify_tls ? 1L : 0L);
		SET(CURLOPT_SSL_VERIFYHOST, r->verify_tls ? 2L : 0L);
		if (r->timeout_ms > 0)
			SET(CURLOPT_TIMEOUT_MS, r->timeout_ms);
		if (!r->sends_body)
			SET(strcmp(r->method, "HEAD") == 0 ? CURLOPT_NOBODY : CURLOPT_HTTPGET, 1L);
		else if (strcmp(r->method, "POST") != 0)
			SET(CURLOPT_CUSTOMREQUEST, r->method);
	}
	SET(CURLOPT_HTTPHEADER, r->headers);
	if (r->sends_body)
	{
		SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) r->body_len);
		SET(CURLOPT_POSTFIELDS, r->body);
	}
#undef SET
	return rc;
}

/*
 * Moves a waiting request into flight at time now (the caller's clock reading, shared
 * by the requests it starts together); on failure it stays the caller's to complete.
 */
static CURLcode
start_transfer(http_engine *engine, delivery_request *r, long long now)
{
	CURLcode rc;
	CURLMcode mrc;
	bool fresh;

	r->transfer = take_transfer(r, &fresh);
	if (!r->transfer)
	{
		r->start_error = curl_easy_strerror(CURLE_OUT_OF_MEMORY);
		return CURLE_OUT_OF_MEMORY;
	}
	r->transfer->request = r;
	r->transfer->has_retry_after = false;
	r->transfer->excerpt_len = 0;
	r->transfer->response_excerpt[0] = '\0';
	r->transfer->curl_error[0] = '\0';
	rc = configure_transfer(r, fresh);
	r->start_error = curl_easy_strerror(rc);
	if (rc == CURLE_OK &&
		(mrc = curl_multi_add_handle(engine->multi, r->transfer->easy)) != CURLM_OK)
	{
		r->start_error = curl_multi_strerror(mrc);
		rc = CURLE_FAILED_INIT;
	}
	if (rc != CURLE_OK)
	{
		free_transfer(r->transfer); /* its options are in an unknown state */
		r->transfer = NULL;
		return rc;
	}

	r->started_at_ms = now;
	r->prev_active = NULL;
	r->next_active = engine->active_head;
	if (engine->active_head)
		engine->active_head->prev_active = r;
	engine->active_head = r;
	r->destination->in_flight++;
	engine->in_flight++;
	return CURLE_OK;
}

/*
 * Takes r out of the engine, tells its owner and frees it. The counters are settled
 * before done runs, so done sees the engine as it is now and may submit more.
 */
static void
complete_request(http_engine *engine, delivery_request *r, CURLcode curl_result, bool aborted)
{
	destination_state *d = r->destination;
	long long now = now_ms();
	transfer *t = r->transfer;
	bool was_in_flight = t != NULL;
	http_result result = {0};
	char status_error[32];

	result.curl_code = curl_result;
	result.aborted = aborted;
	result.held = r->held;
	result.withdrawn = r->withdrawn;
	result.queued_ms = (long) ((was_in_flight ? r->started_at_ms : now) - r->submitted_at_ms);
	result.elapsed_ms = was_in_flight ? (long) (now - r->started_at_ms) : 0;
	result.response_excerpt = was_in_flight ? t->response_excerpt : "";
	if (was_in_flight)
	{
		curl_easy_getinfo(t->easy, CURLINFO_NUM_CONNECTS, &result.new_connections);
		if (!aborted)
			curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &result.http_status);
		curl_multi_remove_handle(engine->multi, t->easy);

		if (r->prev_active)
			r->prev_active->next_active = r->next_active;
		else
			engine->active_head = r->next_active;
		if (r->next_active)
			r->next_active->prev_active = r->prev_active;
		d->in_flight--;
		engine->in_flight--;
	}
	result.retry_after = was_in_flight && t->has_retry_after && !aborted ? t->retry_after : NULL;

	if (aborted)
		result.error = "aborted: the delivery engine was freed before an answer";
	else if (!was_in_flight)
		result.error = r->start_error ? r->start_error : curl_easy_strerror(curl_result);
	else if (curl_result != CURLE_OK)
		result.error = t->curl_error[0] ? t->curl_error : curl_easy_strerror(curl_result);
	else if (result.http_status >= 200 && result.http_status <= 299)
		result.error = "";
	else
	{
		snprintf(status_error, sizeof(status_error), "HTTP %ld", result.http_status);
		result.error = status_error;
	}

	mark_ready_if_runnable(engine, d);
	r->done(r->opaque, &result);
	free_request(r);
}

/* Completes, unsent, every waiting request of a destination the gate holds. */
static int
complete_held_requests(http_engine *engine)
{
	int completed = 0;

	if (engine->gate == NULL || engine->waiting == 0)
		return 0;
	for (int b = 0; b < DESTINATION_BUCKETS; b++)
		for (destination_state *d = engine->buckets[b]; d; d = d->next_in_bucket)
		{
			delivery_request *held;

			if (d->waiting_head == NULL || engine->gate(engine->gate_arg, d->name))
				continue;
			/* Detached first: a done callback may queue new requests for d. */
			held = d->waiting_head;
			engine->waiting -= d->waiting;
			d->waiting = 0;
			d->waiting_head = d->waiting_tail = NULL;
			while (held)
			{
				delivery_request *r = held;

				held = r->next_waiting;
				r->held = true;
				r->start_error = "held: the destination is paused";
				complete_request(engine, r, CURLE_ABORTED_BY_CALLBACK, false);
				completed++;
			}
		}
	return completed;
}

int
http_engine_withdraw(http_engine *engine, http_keep_fn keep, void *arg)
{
	delivery_request *taken = NULL;
	int completed = 0;

	for (int b = 0; b < DESTINATION_BUCKETS; b++)
		for (destination_state *d = engine->buckets[b]; d; d = d->next_in_bucket)
		{
			delivery_request **link = &d->waiting_head;

			d->waiting_tail = NULL;
			while (*link)
			{
				delivery_request *r = *link;

				if (keep(arg, r->opaque))
				{
					d->waiting_tail = r;
					link = &r->next_waiting;
					continue;
				}
				*link = r->next_waiting;
				d->waiting--;
				engine->waiting--;
				r->next_waiting = taken;
				taken = r;
			}
		}
	/* Completed after the walk: a done callback may queue new requests. */
	while (taken)
	{
		delivery_request *r = taken;

		taken = r->next_waiting;
		r->withdrawn = true;
		r->start_error = "withdrawn: taken back before it started";
		complete_request(engine, r, CURLE_ABORTED_BY_CALLBACK, false);
		completed++;
	}
	return completed;
}

/*
 * Hands out free slots round-robin over ready destinations; returns how many completed.
 * *started counts the transfers it added to the multi handle.
 */
static int
start_waiting_requests(http_engine *engine, int *started)
{
	int completed = complete_held_requests(engine);
	long long now = engine->ready_head ? now_ms() : 0;

	*started = 0;

	while (engine->ready_head &&
		   (engine->max_total_in_flight <= 0 || engine->in_flight < engine->max_total_in_flight))
	{
		destination_state *d = pop_ready_destination(engine);
		delivery_request *r = d->waiting_head;
		CURLcode rc;

		if (!r || !destination_has_room(d))
			continue;
		d->waiting_head = r->next_waiting;
		if (!d->waiting_head)
			d->waiting_tail = NULL;
		d->waiting--;
		engine->waiting--;

		rc = start_transfer(engine, r, now);
		if (rc != CURLE_OK)
		{
			log_warn("event=http_request_not_started destination=\"%s\" url=\"%s\" "
					 "error=\"%s\" msg=\"reported to the caller as a failed attempt\"",
					 d->name, r->url, r->start_error);
			complete_request(engine, r, rc, false);
			completed++;
		}
		else
			(*started)++;
		mark_ready_if_runnable(engine, d);
	}
	return completed;
}

static int
read_completions(http_engine *engine)
{
	CURLMsg *msg;
	int msgs_left;
	int completed = 0;

	while ((msg = curl_multi_info_read(engine->multi, &msgs_left)))
	{
		char *private_pointer = NULL;
		CURLcode result;

		if (msg->msg != CURLMSG_DONE)
			continue;
		/* msg is only valid until its handle leaves the multi handle: copy first. */
		result = msg->data.result;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &private_pointer);
		complete_request(engine, ((transfer *) private_pointer)->request, result, false);
		completed++;
	}
	return completed;
}

static bool
perform_transfers(http_engine *engine)
{
	int running;
	CURLMcode mrc = curl_multi_perform(engine->multi, &running);

	if (mrc != CURLM_OK)
	{
		log_error("event=http_multi_failed call=curl_multi_perform error=\"%s\" "
				  "msg=\"transfers stall until the next poll\"",
				  curl_multi_strerror(mrc));
		return false;
	}
	return true;
}

http_engine *
http_engine_new(int max_total_in_flight)
{
	http_engine *engine;

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		return NULL;
	engine = calloc(1, sizeof(*engine));
	if (!engine || !(engine->multi = curl_multi_init()))
	{
		free(engine);
		curl_global_cleanup();
		return NULL;
	}
	engine->max_total_in_flight = max_total_in_flight;
	/* Keep an idle connection for every slot, so keep-alive survives between batches. */
	if (max_total_in_flight > 0)
		curl_multi_setopt(engine->multi, CURLMOPT_MAXCONNECTS, (long) max_total_in_flight);
	return engine;
}

/* Case-insensitive "Name:" at the start of one of the lines. */
static bool
has_header(const char *lines, const char *name)
{
	size_t name_len = strlen(name);
	const char *line = lines;

	while (line && *line)
	{
		if (strncasecmp(line, name, name_len) == 0 &&
			(line[name_len] == ':' || line[name_len] == ';'))
			return true;
		line = strchr(line, '\n');
		if (line)
			line++;
	}
	return false;
}

/* Lines of text: each ends at a newline or at the end. */
static int
count_lines(const char *text)
{
	int n = 0;

	for (const char *p = text; p && *p; n++)
	{
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	return n;
}

/*
 * The request and everything it keeps, in one allocation: the struct, the curl_slist
 * nodes (curl only reads the list), then method, URL, header text and, unless borrowed,
 * the body. NULL when out of memory.
 */
static delivery_request *
new_request(const http_request *request, const char *method, bool sends_body)
{
	const char *lines = request->headers ? request->headers : "";
	int n_nodes = count_lines(lines) + 2; /* + Expect: and, maybe, Content-Type: */
	size_t method_len = strlen(method) + 1, url_len = strlen(request->url) + 1;
	size_t lines_len = strlen(lines) + 1;
	size_t body_len = request->body_borrowed ? 0 : request->body_len + 1;
	delivery_request *r = calloc(1, sizeof(*r) + sizeof(struct curl_slist) * n_nodes + method_len +
										url_len + lines_len + body_len);
	struct curl_slist *nodes, **link;
	char *text;
	int used = 0;

	if (!r)
		return NULL;
	nodes = (struct curl_slist *) (r + 1);
	text = (char *) (nodes + n_nodes);
	r->method = memcpy(text, method, method_len);
	for (char *p = r->method; *p; p++)
		*p = (char) toupper((unsigned char) *p);
	r->url = memcpy(text += method_len, request->url, url_len);
	text = memcpy(text + url_len, lines, lines_len);
	if (request->body_borrowed)
		r->body = request->body ? request->body : "";
	else
	{
		char *body = text + lines_len;

		if (request->body_len > 0)
			memcpy(body, request->body, request->body_len);
		body[request->body_len] = '\0';
		r->body = body;
	}
	r->body_len = request->body_len;
	r->sends_body = sends_body;

	/* Split the copied text into lines, one node each (empty lines are skipped). */
	link = &r->headers;
	for (char *line = text; *line;)
	{
		char *end = strchr(line, '\n');

		if (end)
			*end = '\0';
		if (*line)
		{
			nodes[used].data = line;
			*link = &nodes[used++];
			link = &(*link)->next;
		}
		if (!end)
			break;
		line = end + 1;
	}
	/*
	 * Many webhook receivers mishandle "Expect: 100-continue", and a body without a
	 * Content-Type must not be labelled form-encoded, which curl does by default.
	 */
	if (sends_body)
	{
		nodes[used].data = (char *) "Expect:";
		*link = &nodes[used++];
		link = &(*link)->next;
		if (!has_header(lines, "Content-Type"))
		{
			nodes[used].data = (char *) "Content-Type:";
			*link = &nodes[used++];
			link = &(*link)->next;
		}
	}
	*link = NULL;
	return r;
}

bool
http_engine_submit(http_engine *engine, const http_request *request, http_done_fn done,
				   void *opaque)
{
	const char *method = request->method ? request->method : "POST";
	destination_state *d;
	delivery_request *r;
	bool sends_body;

	if (engine->closing || !request->url || !request->url[0] || !method[0] || !done ||
		(!request->body && request->body_len > 0))
		return false;
	d = find_or_add_destination(engine, request->destination ? request->destination : "");
	sends_body = !(strcasecmp(method, "GET") == 0 && request->body_len == 0) &&
				 strcasecmp(method, "HEAD") != 0;
	r = d ? new_request(request, method, sends_body) : NULL;
	if (!r)
		return false;
	r->destination = d;
	r->timeout_ms = request->timeout_ms;
	r->verify_tls = request->verify_tls;
	r->done = done;
	r->opaque = opaque;
	r->submitted_at_ms = now_ms();

	d->max_in_flight = request->max_in_flight;
	/*
	 * With a free slot and nobody of this destination ahead, start at once: a caller that
	 * counts in-flight requests to decide how long to block then sees this one.
	 */
	if (!d->waiting_head && destination_has_room(d) &&
		(engine->max_total_in_flight <= 0 || engine->in_flight < engine->max_total_in_flight))
	{
		CURLcode rc = start_transfer(engine, r, r->submitted_at_ms);

		if (rc != CURLE_OK)
		{
			log_warn("event=http_request_not_started destination=\"%s\" url=\"%s\" "
					 "error=\"%s\" msg=\"submit refused\"",
					 d->name, r->url, r->start_error);
			free_request(r);
			return false;
		}
		return true;
	}
	if (d->waiting_tail)
		d->waiting_tail->next_waiting = r;
	else
		d->waiting_head = r;
	d->waiting_tail = r;
	d->waiting++;
	engine->waiting++;
	mark_ready_if_runnable(engine, d);
	return true;
}

int
http_engine_poll(http_engine *engine, int timeout_ms)
{
	int started;
	int completed = start_waiting_requests(engine, &started);

	if (!perform_transfers(engine))
		return -1;
	completed += read_completions(engine);
	if (completed == 0 && timeout_ms > 0)
	{
		CURLMcode mrc = curl_multi_poll(engine->multi, NULL, 0, timeout_ms, NULL);

		if (mrc != CURLM_OK)
		{
			log_error("event=http_multi_failed call=curl_multi_poll error=\"%s\" "
					  "msg=\"transfers stall until the next poll\"",
					  curl_multi_strerror(mrc));
			return -1;
		}
		if (!perform_transfers(engine))
			return -1;
		completed += read_completions(engine);
	}
	/* Slots freed above go to waiting requests now, not one poll later. */
	completed += start_waiting_requests(engine, &started);
	/*
	 * And they are sent now: otherwise they sat in their slots, unsent, through the
	 * caller's next turn (a batch of records to take in), while the destination idled
	 * (bench/deliver at 0 ms).
	 */
	if (started > 0 && !perform_transfers(engine))
		return -1;
	return completed;
}

int
http_engine_affordable_in_flight(void)
{
	long files = file_limit_raise(HTTP_MAX_TOTAL_IN_FLIGHT + HTTP_RESERVED_FILES);

	if (files >= HTTP_MAX_TOTAL_IN_FLIGHT + HTTP_RESERVED_FILES)
		return HTTP_MAX_TOTAL_IN_FLIGHT;
	return files > HTTP_RESERVED_FILES + 256 ? (int) (files - HTTP_RESERVED_FILES) : 256;
}

void
http_engine_set_start_gate(http_engine *engine, http_start_gate_fn gate, void *arg)
{
	engine->gate = gate;
	engine->gate_arg = arg;
}

void
http_engine_wakeup(http_engine *engine)
{
	curl_multi_wakeup(engine->multi);
}

int
http_engine_in_flight(http_engine *engine, const char *destination)
{
	destination_state *d;

	if (!destination)
		return engine->in_flight;
	d = find_destination(engine, destination);
	return d ? d->in_flight : 0;
}

int
http_engine_pending(http_engine *engine, const char *destination)
{
	destination_state *d;

	if (!destination)
		return engine->in_flight + engine->waiting;
	d = find_destination(engine, destination);
	return d ? d->in_flight + d->waiting : 0;
}

void
http_engine_free(http_engine *engine)
{
	if (!engine)
		return;
	engine->closing = true;
	while (engine->active_head)
		complete_request(engine, engine->active_head, CURLE_ABORTED_BY_CALLBACK, true);
	for (int b = 0; b < DESTINATION_BUCKETS; b++)
	{
		destination_state *d = engine->buckets[b];

		while (d)
		{
			destination_state *next = d->next_in_bucket;

			while (d->waiting_head)
			{
				delivery_request *r = d->waiting_head;

				d->waiting_head = r->next_waiting;
				d->waiting--;
				engine->waiting--;
				complete_request(engine, r, CURLE_ABORTED_BY_CALLBACK, true);
			}
			drop_idle_transfers(d);
			free(d->idle);
			free(d->name);
			free(d);
			d = next;
		}
	}
	curl_multi_cleanup(engine->multi);
	curl_global_cleanup();
	free(engine);
}
