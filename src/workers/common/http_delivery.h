/*
 * http_delivery.h: the engine that sends delivery requests to HTTP destinations, many at
 * once, from the caller's own thread and loop (libcurl multi underneath).
 *
 * Words used here:
 *   destination  a name that groups requests for the per-destination limit (the
 *                destination's name in wal_delivery.destinations); it is not a host
 *   in flight    a request the engine has handed to curl and not yet completed; the
 *                limits bound this number
 *   waiting      a request submitted while its destination (or the engine) was at its
 *                limit; it waits in a FIFO queue of its destination and starts, in
 *                submission order, when a slot frees
 *   pending      in flight + waiting: submitted, not yet completed
 *
 * Semantics:
 *   - One engine is one curl multi handle, so connections (keep-alive), DNS and TLS
 *     sessions are shared by every request of the engine. Use it from one thread only
 *     (http_engine_wakeup excepted).
 *   - Submitting never calls a callback. A request whose destination has a free slot
 *     (and nobody waiting ahead of it) is in flight when submit returns; others wait.
 *     http_engine_poll starts waiting requests, moves transfers on (nothing moves
 *     between polls), waits up to timeout_ms for something to happen and calls `done`
 *     once for each completed request; done is only ever called from http_engine_poll
 *     or http_engine_free.
 *   - `done` may submit new requests. It must not call http_engine_poll or
 *     http_engine_free. The result and its strings live only until done returns.
 *   - Destinations take turns for the engine's total limit, so a slow destination at its
 *     own limit never holds back another destination's requests.
 *   - timeout_ms counts from when the request starts (leaves the waiting queue), not from
 *     submission; queued_ms in the result says how long it waited.
 *   - Redirects are not followed (a 3xx is an answer like any other) and only http and
 *     https URLs are allowed. TLS peer and host verification is on unless the request
 *     says verify_tls = false.
 *   - A request without a Content-Type header gets none (curl's form-encoded default is
 *     suppressed), and "Expect: 100-continue" is never sent.
 */
#ifndef WAL_HTTP_DELIVERY_H
#define WAL_HTTP_DELIVERY_H

#include <stdbool.h>
#include <stddef.h>

#include <curl/curl.h>

typedef struct http_engine http_engine;

typedef struct
{
	const char *destination; /* groups requests for max_in_flight; NULL is "" */
	int max_in_flight;       /* this destination's limit (<= 0: none); the newest
							  * submitted value applies to the destination */
	const char *method;      /* "POST", "PUT", ...; NULL is POST */
	const char *url;         /* http:// or https:// */
	const char *headers;     /* "Name: value" lines, each ended by a newline; copied
							  * by submit; NULL: none */
	const char *body;        /* copied by submit unless body_borrowed; any bytes */
	size_t body_len;         /* bytes of body */
	bool body_borrowed;      /* body stays valid until done runs: not copied */
	long timeout_ms;         /* whole request once started; <= 0: no limit */
	bool verify_tls;         /* false only for destinations configured so */
} http_request;

typedef struct
{
	CURLcode curl_code;           /* CURLE_OK when an HTTP answer arrived */
	long http_status;             /* 0 when no answer arrived */
	const char *retry_after;      /* the answer's Retry-After value, NULL if none */
	long elapsed_ms;              /* from start to completion (0 if it never started) */
	long queued_ms;               /* waiting in the engine before it started */
	long new_connections;         /* connections opened for it: 0 when one was reused */
	const char *error;            /* short text: "" for 2xx, "HTTP 503", curl's message,
								   * or "aborted: ..." */
	const char *response_excerpt; /* the answer body's first bytes, for logs ("" if none) */
	bool aborted;                 /* completed by http_engine_free, never answered */
	bool held;                    /* never started: the start gate closed its destination */
	bool withdrawn;               /* never started: taken back by http_engine_withdraw */
} http_result;

typedef void (*http_done_fn)(void *opaque, const http_result *result);

/*
 * max_total_in_flight caps requests in flight across all destinations (<= 0: no cap); it
 * also sizes curl's cache of idle keep-alive connections. Returns NULL if curl cannot
 * start. Calls curl_global_init (reference counted), so with several threads call
 * curl_global_init once in main before starting them.
 */
http_engine *http_engine_new(int max_total_in_flight);

/*
 * The max_total_in_flight a worker process can afford: every request holds a socket, so
 * what the open-file limit leaves after HTTP_RESERVED_FILES for Kafka, libpq and the admin
 * server, at most HTTP_MAX_TOTAL_IN_FLIGHT (a destination's own max_in_flight limit) and
 * at least 256. Raises the soft open-file limit toward the hard one first.
 */
#define HTTP_MAX_TOTAL_IN_FLIGHT 10000
#define HTTP_RESERVED_FILES      2048
int http_engine_affordable_in_flight(void);

/*
 * Starts one request, or queues it behind its destination's limit. Returns false (and
 * calls nothing) when the request lacks a URL, curl refuses its options, memory runs out,
 * or the engine is being freed.
 */
bool http_engine_submit(http_engine *engine, const http_request *request, http_done_fn done,
						void *opaque);

/*
 * Starts waiting requests, moves transfers on and calls done for completed ones, waiting
 * up to timeout_ms (0: do not wait) when nothing completed at once. Returns how many
 * completed, or -1 on a curl multi error (logged).
 */
int http_engine_poll(http_engine *engine, int timeout_ms);

/*
 * Asked right before a waiting request would start: false holds its destination, and
 * every request of it still waiting completes at the next poll, never sent, with
 * held = true (in flight ones run to their answer). Lets a caller whose destination was
 * paused after it queued requests keep them from reaching it. NULL: no gate.
 */
typedef bool (*http_start_gate_fn)(void *arg, const char *destination);
void http_engine_set_start_gate(http_engine *engine, http_start_gate_fn gate, void *arg);

/*
 * Takes back every waiting request (not yet started) for which keep(arg, its opaque) is
 * false: each completes at once, never sent, with withdrawn = true; in flight ones run to
 * their answer. Returns how many. Like http_engine_poll, it calls done, so not from done.
 */
typedef bool (*http_keep_fn)(void *arg, void *opaque);
int http_engine_withdraw(http_engine *engine, http_keep_fn keep, void *arg);

/* Makes a running or the next http_engine_poll return early; safe from any thread. */
void http_engine_wakeup(http_engine *engine);

/* Requests in flight for one destination, or for all when destination is NULL. */
int http_engine_in_flight(http_engine *engine, const char *destination);

/* Requests submitted and not yet completed (in flight + waiting); NULL: all. */
int http_engine_pending(http_engine *engine, const char *destination);

/*
 * Aborts every pending request, calling its done with aborted = true,
 * curl_code = CURLE_ABORTED_BY_CALLBACK, then frees the engine. NULL is allowed.
 */
void http_engine_free(http_engine *engine);

#endif
