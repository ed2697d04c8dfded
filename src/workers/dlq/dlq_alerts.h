/*
 * dlq_alerts.h: the dlq worker's alerts, sent beside ingestion on a thread of their own.
 *
 * Every dead letter (ingested here, or written by the database itself for a row whose
 * processing or shipping failed for good) raises one alert: a log event, a metric, and a
 * POST to settings.dlq_alert_url when set. A row is marked alerted only after the webhook
 * answered 2xx, so alerts are at least once across crashes. A webhook that fails or hangs
 * holds up only the alerts (tried again after a pause), never ingestion. The answer's
 * body is read and dropped.
 */
#ifndef WAL_DLQ_ALERTS_H
#define WAL_DLQ_ALERTS_H

#include "common/options.h"

typedef struct dlq_alerts dlq_alerts;

/* Starts the thread (its own database connection); NULL when it cannot start (logged). */
dlq_alerts *alerts_start(const worker_options *opts);

/* The webhook to POST to from now on (copied; NULL: metric and log only). */
void alerts_set_url(dlq_alerts *alerts, const char *url);

/* Look for dead letters to alert now rather than at the next check. */
void alerts_wake(dlq_alerts *alerts);

/* Stops the thread (waits for an alert in flight, at most its timeout). NULL is a no-op. */
void alerts_stop(dlq_alerts *alerts);

#endif
