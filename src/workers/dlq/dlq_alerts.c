/*
 * dlq_alerts.c: see dlq_alerts.h.
 */
#include "dlq/dlq_alerts.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libpq-fe.h>

#include "common/db_connect.h"
#include "common/log.h"
#include "shared/trace_context.h"
#include "common/metrics.h"

#define ALERT_CHECK_MS   1000 /* looking for dead letters still to alert */
#define ALERT_RETRY_MS   5000 /* after the webhook failed */
#define ALERT_TIMEOUT_MS 5000L

struct dlq_alerts
{
	const worker_options *opts;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool woken;    /* under lock */
	bool stopping; /* under lock */
	char *url;     /* under lock */
	PGconn *db;    /* the thread's own */
	metric *sent;
	metric *failed;
};

/* The webhook's answer is not ours to keep: read and dropped, never printed. */
static size_t
drop_body(char *data, size_t size, size_t n_items, void *userdata)
{
	(void) data;
	(void) userdata;
	return size * n_items;
}

/* POSTs one alert; false (logged and counted) when the webhook did not take it. */
static bool
post_alert(dlq_alerts *a, const char *url, const char *body)
{
	CURL *curl = curl_easy_init();
	struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
	long status = 0;
	CURLcode rc = CURLE_FAILED_INIT;

	if (curl != NULL && headers != NULL)
	{
		curl_easy_setopt(curl, CURLOPT_URL, url);
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
		curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ALERT_TIMEOUT_MS);
		curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
		curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, drop_body);
		rc = curl_easy_perform(curl);
		curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	}
	curl_slist_free_all(headers);
	curl_easy_cleanup(curl);
	if (rc == CURLE_OK && status >= 200 && status <= 299)
		return true;
	metric_add(a->failed, 1, NULL);
	log_error("event=alert_failed url=%s error=\"%s\" status=%ld msg=\"tried again in %d ms\"", url,
			  rc != CURLE_OK ? curl_easy_strerror(rc) : "non-2xx answer", status,
			  (int) (ALERT_RETRY_MS / a->opts->time_scale));
	return false;
}

/* One dead letter's alert: the event, the metric and, with a webhook, its POST. */
static bool
raise_alert(dlq_alerts *a, const char *url, PGresult *res, int row)
{
	const char *v[7];
	json_t *body;
	char *text;
	bool ok = true;
	trace_context tc;

	for (int c = 0; c < 7; c++)
		v[c] = PQgetisnull(res, row, c) ? NULL : PQgetvalue(res, row, c);
	log_record(LOG_WARN, v[2] ? v[2] : "", v[3] ? v[3] : "",
			   v[6] && trace_context_parse(v[6], strlen(v[6]), &tc) == NULL ? tc.trace_id : NULL,
			   "event=dead_letter id=%s origin=%s destination=%s error=\"%s\"", v[0], v[1],
			   v[4] ? v[4] : "", v[5] ? v[5] : "");
	if (url != NULL)
	{
		body = json_pack("{s:s, s:I, s:s, s:s?, s:s?, s:s?, s:s?}", "event", "dead_letter", "id",
						 (json_int_t) strtoll(v[0], NULL, 10), "origin", v[1], "topic", v[2],
						 "idempotency_key", v[3], "destination", v[4], "last_error", v[5]);
		text = body ? json_dumps(body, JSON_COMPACT) : NULL;
		ok = text != NULL && post_alert(a, url, text);
		free(text);
		json_decref(body);
	}
	if (ok)
		metric_add(a->sent, 1, (const char *const[]){v[1]});
	return ok;
}

static bool
mark_alerted(dlq_alerts *a, const char *id)
{
	const char *values[1] = {id};
	PGresult *res = PQexecParams(a->db, "SELECT wal_delivery.mark_dead_letter_alerted($1)", 1, NULL,
								 values, NULL, NULL, 0);
	bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;

	if (!ok)
		log_error("event=mark_alerted_failed id=%s error=\"%s\" msg=\"it will be alerted again\"",
				  id, PQerrorMessage(a->db));
	PQclear(res);
	return ok;
}

/* Alerts the dead letters not alerted yet, oldest first; false when the webhook failed. */
static bool
alert_pending(dlq_alerts *a)
{
	PGresult *res;
	char *url;
	bool ok = true;

	if (!db_ensure(&a->db, a->opts->conninfo, "dlq", "not alerting", NULL))
		return false;
	pthread_mutex_lock(&a->lock);
	url = a->url ? strdup(a->url) : NULL;
	pthread_mutex_unlock(&a->lock);
	res = PQexec(a->db, "SELECT id, origin, topic, idempotency_key, destination, last_error, "
						"traceparent FROM wal_delivery.dead_letters_to_alert(100)");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_error("event=alert_query_failed error=\"%s\"", PQerrorMessage(a->db));
		ok = false;
	}
	for (int r = 0; ok && r < PQntuples(res); r++)
		ok = raise_alert(a, url, res, r) && mark_alerted(a, PQgetvalue(res, r, 0));
	PQclear(res);
	free(url);
	return ok;
}

/* Sleeps until woken, stopping, or ms passed; true unless stopping. */
static bool
wait_for_work(dlq_alerts *a, long ms)
{
	struct timespec until;
	bool go_on;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L)
		until.tv_sec++, until.tv_nsec -= 1000000000L;
	pthread_mutex_lock(&a->lock);
	while (!a->woken && !a->stopping && pthread_cond_timedwait(&a->wake, &a->lock, &until) == 0)
		;
	a->woken = false;
	go_on = !a->stopping;
	pthread_mutex_unlock(&a->lock);
	return go_on;
}

static void *
run_alerts(void *arg)
{
	dlq_alerts *a = arg;
	long wait_ms = 0;

	while (wait_for_work(a, wait_ms))
		wait_ms =
			(long) ((alert_pending(a) ? ALERT_CHECK_MS : ALERT_RETRY_MS) / a->opts->time_scale);
	if (a->db)
		PQfinish(a->db);
	return NULL;
}

dlq_alerts *
alerts_start(const worker_options *opts)
{
	dlq_alerts *a = calloc(1, sizeof(*a));

	if (a == NULL || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
	{
		log_error("event=alerts_not_started msg=\"out of memory or curl failed to start\"");
		free(a);
		return NULL;
	}
	a->opts = opts;
	a->sent = metric_counter("wal_dead_letter_alerts_total",
							 "Dead letters alerted (webhook accepted, or metric only).", 1,
							 (const char *const[]){"origin"});
	a->failed = metric_counter("wal_dead_letter_alerts_failed_total",
							   "Alerts the alert webhook did not accept.", 0, NULL);
	pthread_mutex_init(&a->lock, NULL);
	pthread_cond_init(&a->wake, NULL);
	if (pthread_create(&a->thread, NULL, run_alerts, a) != 0)
	{
		log_error("event=alerts_not_started msg=\"cannot start the alert thread\"");
		free(a);
		return NULL;
	}
	return a;
}

void
alerts_set_url(dlq_alerts *a, const char *url)
{
	pthread_mutex_lock(&a->lock);
	if ((a->url == NULL) != (url == NULL) || (url && strcmp(a->url, url) != 0))
	{
		free(a->url);
		a->url = url ? strdup(url) : NULL;
		a->woken = true;
		pthread_cond_signal(&a->wake);
	}
	pthread_mutex_unlock(&a->lock);
}

void
alerts_wake(dlq_alerts *a)
{
	pthread_mutex_lock(&a->lock);
	a->woken = true;
	pthread_cond_signal(&a->wake);
	pthread_mutex_unlock(&a->lock);
}

void
alerts_stop(dlq_alerts *a)
{
	if (a == NULL)
		return;
	pthread_mutex_lock(&a->lock);
	a->stopping = true;
	pthread_cond_signal(&a->wake);
	pthread_mutex_unlock(&a->lock);
	pthread_join(a->thread, NULL);
	pthread_cond_destroy(&a->wake);
	pthread_mutex_destroy(&a->lock);
	free(a->url);
	free(a);
}
