/*
 * otlp_sender.c: the relay's span buffer and its one request at a time (otlp_sender.h).
 *
 * Nothing here waits: curl_multi_perform does what the sockets allow and returns. The
 * request has short timeouts that libcurl checks whenever the relay drives it, so a hung
 * collector ends as a failed request within seconds, whatever the relay does meanwhile.
 * No call between curl_easy_init and the request's end can ereport.
 */
#include "postgres.h"

#include <time.h>

#include <curl/curl.h>

#include "fmgr.h"
#include "funcapi.h"
#include "access/htup_details.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "otlp_sender.h"

#define OTLP_FLUSH_MS           1000 /* a span waits at most this long for its batch */
#define OTLP_CONNECT_TIMEOUT_MS 1000L
#define OTLP_REQUEST_TIMEOUT_MS 2000L
#define OTLP_POLL_MS            20 /* how often a request in flight is driven */

/* What became of the relays' spans since the server started, summed over the relays. */
typedef enum
{
	SPANS_EXPORTED,
	SPANS_DROPPED_BUFFER_FULL,
	SPANS_DROPPED_EXPORT_FAILED,
	SPANS_DROPPED_DISCARDED, /* at a relay's exit or an endpoint change */
	REQUESTS_FAILED,
	OTLP_COUNTERS
} OtlpCounter;

typedef struct OtlpCounters
{
	pg_atomic_uint64 n[OTLP_COUNTERS];
} OtlpCounters;

static OtlpCounters *counters = NULL;

bool otlp_sender_enabled = false;

static char traces_url[OTLP_URL_MAX];
static otlp_span *buffer = NULL; /* a ring of RELAY_SPAN_BUFFER spans, malloc'd while enabled */
static int oldest = 0;           /* the ring's first span */
static int n_buffered = 0;
static int64 oldest_at_ms = 0; /* when the oldest buffered span came */

static CURLM *multi = NULL;
static CURL *request = NULL;
static struct curl_slist *json_header = NULL;
static char *request_body = NULL; /* non-NULL while a request is in flight */
static int request_spans = 0;

PG_FUNCTION_INFO_V1(wal_delivery_relay_span_export);

void
otlp_sender_request_shmem(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(OtlpCounters)));
}

void
otlp_sender_init_shmem(void)
{
	bool found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	counters = ShmemInitStruct("wal_delivery otlp counters", sizeof(OtlpCounters), &found);
	if (!found)
	{
		for (int i = 0; i < OTLP_COUNTERS; i++)
			pg_atomic_init_u64(&counters->n[i], 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

static void
count(OtlpCounter which, int n)
{
	if (counters != NULL && n > 0)
		pg_atomic_fetch_add_u64(&counters->n[which], (uint64) n);
}

static int64
monotonic_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static size_t
drop_body(char *data, size_t size, size_t n_items, void *userdata)
{
	return size * n_items; /* the collector's answer is not kept */
}

/* Says when the export starts or stops failing: a down collector is one line, not one a second. */
static void
note_outcome(bool ok, const char *error, long status)
{
	static bool failing = false;

	if (ok && failing)
		ereport(LOG, (errmsg("wal_delivery relay: the OTLP collector takes spans again")));
	else if (!ok && !failing)
		ereport(LOG, (errmsg("wal_delivery relay: exporting spans to %s failed: %s", traces_url,
							 status ? psprintf("HTTP status %ld", status) : error),
					  errdetail("Spans are dropped and counted (wal_delivery.relay_span_export()) "
								"until the collector answers 2xx; records are not held up.")));
	failing = !ok;
}

/* Ends the request in flight, done or not; counts its spans as exported or failed. */
static void
finish_request(bool ok)
{
	if (request_body == NULL)
		return;
	curl_multi_remove_handle(multi, request);
	free(request_body);
	request_body = NULL;
	if (ok)
		count(SPANS_EXPORTED, request_spans);
	else
	{
		count(REQUESTS_FAILED, 1);
		count(SPANS_DROPPED_EXPORT_FAILED, request_spans);
	}
	request_spans = 0;
}

/* Whether the handles exist (made once per process, the first time export is on). */
static bool
ensure_handles(void)
{
	static bool curl_ready = false;

	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
			return false;
		curl_ready = true;
	}
	if (multi == NULL)
		multi = curl_multi_init();
	if (request == NULL)
		request = curl_easy_init();
	if (json_header == NULL)
		json_header = curl_slist_append(NULL, "Content-Type: application/json");
	return multi != NULL && request != NULL && json_header != NULL;
}

void
otlp_sender_configure(const char *endpoint)
{
	char url[OTLP_URL_MAX];
	bool on = endpoint != NULL && endpoint[0] != '\0' && otlp_traces_url(endpoint, url) == NULL;

	if (on && otlp_sender_enabled && strcmp(url, traces_url) == 0)
		return;
	/* Off, or another collector: what was meant for the old one is not sent. */
	if (request_body != NULL)
	{
		curl_multi_remove_handle(multi, request);
		free(request_body);
		request_body = NULL;
		count(SPANS_DROPPED_DISCARDED, request_spans);
	}
	otlp_sender_discard();
	if (!on && otlp_sender_enabled)
		ereport(LOG, (errmsg("wal_delivery relay: span export is off")));
	otlp_sender_enabled = false;
	if (!on)
	{
		free(buffer);
		buffer = NULL;
		return;
	}
	if (buffer == NULL)
		buffer = malloc(sizeof(otlp_span) * RELAY_SPAN_BUFFER);
	if (buffer == NULL || !ensure_handles())
	{
		ereport(LOG, (errmsg("wal_delivery relay: spans are not exported: out of memory or "
							 "libcurl failed to start")));
		return;
	}
	strlcpy(traces_url, url, sizeof(traces_url));
	curl_easy_setopt(request, CURLOPT_URL, traces_url);
	curl_easy_setopt(request, CURLOPT_HTTPHEADER, json_header);
	curl_easy_setopt(request, CURLOPT_CONNECTTIMEOUT_MS, OTLP_CONNECT_TIMEOUT_MS);
	curl_easy_setopt(request, CURLOPT_TIMEOUT_MS, OTLP_REQUEST_TIMEOUT_MS);
	curl_easy_setopt(request, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(request, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(request, CURLOPT_WRITEFUNCTION, drop_body);
	otlp_sender_enabled = true;
	ereport(LOG, (errmsg("wal_delivery relay: exporting spans to %s", traces_url)));
}

void
otlp_sender_add(const otlp_span *span)
{
	if (!otlp_sender_enabled)
		return;
	if (n_buffered == RELAY_SPAN_BUFFER)
	{
		count(SPANS_DROPPED_BUFFER_FULL, 1);
		return;
	}
	if (n_buffered == 0)
		oldest_at_ms = monotonic_ms();
	memcpy(&buffer[(oldest + n_buffered++) % RELAY_SPAN_BUFFER], span, sizeof(*span));
}

/* Sends up to a batch of the oldest spans (up to the ring's end: the encoder takes an array). */
static void
start_request(void)
{
	static const otlp_resource resource = {"wal_delivery", WAL_DELIVERY_VERSION, "relay"};
	int n = Min(Min(n_buffered, RELAY_SPAN_BATCH), RELAY_SPAN_BUFFER - oldest);
	char *body = otlp_encode_spans(&resource, buffer + oldest, (size_t) n);

	oldest = (oldest + n) % RELAY_SPAN_BUFFER;
	n_buffered -= n;
	oldest_at_ms = monotonic_ms();
	if (body != NULL)
	{
		curl_easy_setopt(request, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(request, CURLOPT_POSTFIELDSIZE, (long) strlen(body));
		if (curl_multi_add_handle(multi, request) == CURLM_OK)
		{
			request_body = body;
			request_spans = n;
			return;
		}
	}
	free(body);
	count(REQUESTS_FAILED, 1);
	count(SPANS_DROPPED_EXPORT_FAILED, n);
}

/* Reaps the request in flight when it is done. */
static void
reap_request(void)
{
	int running = 0;
	int left = 0;
	CURLMsg *msg;

	curl_multi_perform(multi, &running);
	while ((msg = curl_multi_info_read(multi, &left)) != NULL)
	{
		long status = 0;
		bool ok;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
		ok = msg->data.result == CURLE_OK && status >= 200 && status <= 299;
		note_outcome(ok, curl_easy_strerror(msg->data.result), ok ? 0 : status);
		finish_request(ok);
	}
}

int
otlp_sender_drive(void)
{
	int64 waited;

	if (!otlp_sender_enabled)
		return -1;
	if (request_body != NULL)
		reap_request();
	if (request_body == NULL && n_buffered > 0)
	{
		waited = monotonic_ms() - oldest_at_ms;
		if (n_buffered >= RELAY_SPAN_BATCH || waited >= OTLP_FLUSH_MS)
		{
			start_request();
			if (request_body != NULL)
				reap_request(); /* connect and send what the socket takes now */
		}
		else
			return (int) (OTLP_FLUSH_MS - waited);
	}
	if (request_body != NULL)
		return OTLP_POLL_MS;
	return n_buffered > 0 ? OTLP_FLUSH_MS : -1;
}

void
otlp_sender_discard(void)
{
	count(SPANS_DROPPED_DISCARDED, n_buffered);
	n_buffered = oldest = 0;
}

/* The relays' span export since the server started (relay_span_export()). */
Datum
wal_delivery_relay_span_export(PG_FUNCTION_ARGS)
{
	TupleDesc desc;
	Datum values[OTLP_COUNTERS];
	bool nulls[OTLP_COUNTERS] = {0};

	if (counters == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("wal_delivery is not in shared_preload_libraries"),
				 errhint("Add wal_delivery to shared_preload_libraries and restart the server.")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "relay_span_export must return a record");
	for (int i = 0; i < OTLP_COUNTERS; i++)
		values[i] = Int64GetDatum((int64) pg_atomic_read_u64(&counters->n[i]));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
