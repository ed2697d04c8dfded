/*
 * otlp_exporter.c: the worker's span queue and its export thread (otlp_exporter.h).
 *
 * The queue is a ring of span copies under one mutex, held only for one span's copy: a
 * call site never waits for the network nor for a batch. The thread encodes up to a batch
 * straight from the ring, outside the lock (call sites write only free slots, and the
 * batch's slots stay taken until it is encoded), then POSTs it with libcurl under short
 * timeouts, so a hung collector holds up only the thread, and a stopping worker at most
 * OTLP_STOP_MS.
 */
#include "common/otlp_exporter.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"

#define OTLP_FLUSH_MS           1000 /* a span waits at most this long for its batch */
#define OTLP_CONNECT_TIMEOUT_MS 1000L
#define OTLP_REQUEST_TIMEOUT_MS 2000L
#define OTLP_STOP_MS            3000 /* what a stopping worker gives the last batches */

typedef struct
{
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stopping;   /* under lock */
	otlp_span *ring; /* OTLP_QUEUE_SPANS, under lock */
	int head;        /* the oldest span, under lock */
	int count;       /* under lock */
	char url[OTLP_URL_MAX];
	otlp_resource resource;
	CURL *curl;   /* the thread's own, kept for the connection */
	bool failing; /* the last request failed: logged once per change */
	metric *exported;
	metric *dropped;
	metric *requests_failed;
} otlp_exporter;

static otlp_exporter *exporter = NULL;

static const char *const reason_label[] = {"reason"};

static void
count_dropped(const char *reason, int n)
{
	metric_add(exporter->dropped, n, (const char *const[]){reason});
}

bool
otlp_exporter_enabled(void)
{
	return exporter != NULL;
}

void
otlp_span_record(const otlp_span *span)
{
	bool full;

	if (exporter == NULL)
		return;
	pthread_mutex_lock(&exporter->lock);
	full = exporter->count == OTLP_QUEUE_SPANS || exporter->stopping;
	if (!full)
	{
		int tail = (exporter->head + exporter->count) % OTLP_QUEUE_SPANS;

		memcpy(&exporter->ring[tail], span, sizeof(*span));
		/* A full batch goes at once; a smaller one waits for the flush interval. */
		if (++exporter->count == OTLP_BATCH_SPANS)
			pthread_cond_signal(&exporter->wake);
	}
	pthread_mutex_unlock(&exporter->lock);
	if (full)
		count_dropped("queue_full", 1);
}

/* The collector's answer is not ours to keep: read and dropped. */
static size_t
drop_body(char *data, size_t size, size_t n_items, void *userdata)
{
	(void) data;
	(void) userdata;
	return size * n_items;
}

/* Logs the export's state when it changes, so a down collector is one line, not one a second. */
static void
note_outcome(bool ok, const char *error, long status, int n)
{
	if (ok && exporter->failing)
		log_info("event=otlp_export_recovered url=%s", exporter->url);
	else if (!ok && !exporter->failing)
		log_warn("event=otlp_export_failed url=%s error=\"%s\" status=%ld spans=%d "
				 "msg=\"spans are dropped and counted until the collector answers 2xx\"",
				 exporter->url, error, status, n);
	exporter->failing = !ok;
}

/*
 * Encodes up to a batch of the oldest queued spans (up to the ring's end: the encoder takes
 * an array) and frees their slots. Returns the body (NULL when out of memory: send_batch
 * counts the spans as failed) and sets *n; *n == 0 when nothing is queued.
 */
static char *
encode_next_batch(int *n)
{
	int head;
	char *body;

	pthread_mutex_lock(&exporter->lock);
	head = exporter->head;
	*n = exporter->count < OTLP_BATCH_SPANS ? exporter->count : OTLP_BATCH_SPANS;
	if (*n > OTLP_QUEUE_SPANS - head)
		*n = OTLP_QUEUE_SPANS - head;
	pthread_mutex_unlock(&exporter->lock);
	if (*n == 0)
		return NULL;
	body = otlp_encode_spans(&exporter->resource, &exporter->ring[head], (size_t) *n);
	pthread_mutex_lock(&exporter->lock);
	exporter->head = (head + *n) % OTLP_QUEUE_SPANS;
	exporter->count -= *n;
	pthread_mutex_unlock(&exporter->lock);
	return body;
}

/* POSTs the n spans encoded in body within timeout_ms; counts what became of them. */
static void
send_batch(char *body, int n, long timeout_ms)
{
	struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
	CURLcode rc = CURLE_OUT_OF_MEMORY;
	long status = 0;
	bool ok;

	if (body != NULL && headers != NULL && exporter->curl != NULL)
	{
		curl_easy_setopt(exporter->curl, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(exporter->curl, CURLOPT_POSTFIELDSIZE, (long) strlen(body));
		curl_easy_setopt(exporter->curl, CURLOPT_HTTPHEADER, headers);
		curl_easy_setopt(exporter->curl, CURLOPT_TIMEOUT_MS, timeout_ms);
		rc = curl_easy_perform(exporter->curl);
		curl_easy_getinfo(exporter->curl, CURLINFO_RESPONSE_CODE, &status);
	}
	ok = rc == CURLE_OK && status >= 200 && status <= 299;
	if (ok)
		metric_add(exporter->exported, n, NULL);
	else
	{
		metric_add(exporter->requests_failed, 1, NULL);
		count_dropped("export_failed", n);
	}
	note_outcome(ok, rc != CURLE_OK ? curl_easy_strerror(rc) : "non-2xx answer", status, n);
	curl_slist_free_all(headers);
	free(body);
}

static void
deadline_in(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long) (ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L)
		ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

/*
 * Sends what is left when the worker stops, within OTLP_STOP_MS, unless the collector
 * failed the last request (it would likely fail these too, and the stop would wait for
 * it); drops the rest.
 */
static void
drain_at_stop(void)
{
	int64_t end = now_ms() + OTLP_STOP_MS;
	int n;

	while (!exporter->failing && end - now_ms() >= 100)
	{
		int64_t left = end - now_ms();
		char *body = encode_next_batch(&n);

		if (n == 0)
			break;
		send_batch(body, n, left < OTLP_REQUEST_TIMEOUT_MS ? (long) left : OTLP_REQUEST_TIMEOUT_MS);
	}
	pthread_mutex_lock(&exporter->lock);
	n = exporter->count;
	exporter->count = 0;
	pthread_mutex_unlock(&exporter->lock);
	if (n > 0)
		count_dropped("shutdown", n);
}

static void *
export_thread(void *arg)
{
	(void) arg;
	for (;;)
	{
		struct timespec until;
		char *body;
		int n;

		pthread_mutex_lock(&exporter->lock);
		if (exporter->count < OTLP_BATCH_SPANS && !exporter->stopping)
		{
			deadline_in(&until, OTLP_FLUSH_MS);
			pthread_cond_timedwait(&exporter->wake, &exporter->lock, &until);
		}
		if (exporter->stopping)
		{
			pthread_mutex_unlock(&exporter->lock);
			break;
		}
		pthread_mutex_unlock(&exporter->lock);
		body = encode_next_batch(&n);
		if (n > 0)
			send_batch(body, n, OTLP_REQUEST_TIMEOUT_MS);
	}
	drain_at_stop();
	return NULL;
}

static void
init_curl(otlp_exporter *e)
{
	e->curl = curl_easy_init();
	if (e->curl == NULL)
		return;
	curl_easy_setopt(e->curl, CURLOPT_URL, e->url);
	curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, OTLP_CONNECT_TIMEOUT_MS);
	curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, drop_body);
}

static void
register_metrics(otlp_exporter *e)
{
	e->exported = metric_counter("wal_otlp_spans_exported_total",
								 "Spans the OTLP collector accepted (a 2xx answer).", 0, NULL);
	e->dropped = metric_counter("wal_otlp_spans_dropped_total",
								"Spans not exported: the queue was full, the collector did not "
								"take them, or the worker stopped before they were sent.",
								1, reason_label);
	e->requests_failed =
		metric_counter("wal_otlp_export_requests_failed_total",
					   "Export requests to the OTLP collector that failed.", 0, NULL);
	for (int i = 0; i < 3; i++) /* every reason's series from the start, at 0 */
		metric_add(
			e->dropped, 0,
			(const char *const[]){(const char *[]){"queue_full", "export_failed", "shutdown"}[i]});
}

bool
otlp_exporter_start(const char *endpoint, const char *role)
{
	otlp_exporter *e = calloc(1, sizeof(*e));
	const char *problem;
	pthread_condattr_t attr;

	if (e == NULL)
		return false;
	problem = otlp_traces_url(endpoint, e->url);
	e->ring = calloc(OTLP_QUEUE_SPANS, sizeof(otlp_span));
	if (problem != NULL || e->ring == NULL || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
	{
		log_error("event=otlp_export_not_started error=\"%s\"",
				  problem ? problem : "out of memory or libcurl failed to start");
		free(e->ring), free(e);
		return false;
	}
	e->resource = (otlp_resource){"wal-worker", WAL_DELIVERY_VERSION, role};
	init_curl(e);
	register_metrics(e);
	pthread_mutex_init(&e->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* timedwait's deadlines are monotonic */
	pthread_cond_init(&e->wake, &attr);
	pthread_condattr_destroy(&attr);
	exporter = e;
	if (pthread_create(&e->thread, NULL, export_thread, NULL) != 0)
	{
		exporter = NULL;
		log_error("event=otlp_export_not_started error=\"cannot start the export thread\"");
		return false;
	}
	log_info("event=otlp_export_started url=%s", e->url);
	return true;
}

void
otlp_exporter_stop(void)
{
	if (exporter == NULL)
		return;
	pthread_mutex_lock(&exporter->lock);
	exporter->stopping = true;
	pthread_cond_signal(&exporter->wake);
	pthread_mutex_unlock(&exporter->lock);
	pthread_join(exporter->thread, NULL);
	/* The exporter stays: a late otlp_span_record from another thread finds it stopping. */
	curl_easy_cleanup(exporter->curl);
	exporter->curl = NULL;
}
