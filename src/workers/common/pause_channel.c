/*
 * pause_channel.c: pauses announced over Kafka (see pause_channel.h).
 *
 * An announcement is a message keyed by the destination whose value is
 * {"destination", "step", "probe_after_ms", "since_ms", "by"}: since_ms is when the
 * pause began; the Kafka timestamp says when it was announced.
 */
#include "pause_channel.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "clock.h"
#include "kafka_conf.h"
#include "log.h"
#include "metrics.h"

/*
 * A listener that starts applies the announcements of the last minute (divided by
 * --time-scale): every pause still in force is announced again more often than that.
 */
#define RECENT_MS   60000
#define RECENT_MSGS 1024

struct pause_channel
{
	const worker_options *opts;
	char *topic;
	char *holder;
	char *bootstrap; /* from the config the channel was opened with */
	rd_kafka_t *listener;
	rd_kafka_t *announcer; /* created on the first announcement */
	bool listen_error_logged;
	metric *announced;
	metric *heard;
};

static char *
pause_topic(const control_plane_config *config)
{
	size_t n = strlen(config->retry_topic_prefix) + sizeof("pauses");
	char *topic = malloc(n);

	snprintf(topic, n, "%spauses", config->retry_topic_prefix);
	return topic;
}

static rd_kafka_t *
new_listener(pause_channel *ch, char *errbuf, size_t errbuf_size)
{
	/* No offsets are committed: a group id is needed only to poll as a consumer. */
	static const kafka_default defaults[] = {
		{"client.id", "wal-worker-pauses"}, {"group.id", "wal_delivery.pause_listeners"},
		{"enable.auto.commit", "false"},    {"enable.auto.offset.store", "false"},
		{"fetch.wait.max.ms", "100"},
	};
	rd_kafka_conf_t *conf = kafka_conf_build(defaults, sizeof(defaults) / sizeof(defaults[0]),
											 ch->bootstrap, ch->opts, errbuf, errbuf_size);
	rd_kafka_topic_partition_list_t *parts;
	rd_kafka_t *rk;

	if (conf == NULL)
		return NULL;
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errbuf, errbuf_size);
	if (rk == NULL)
		return NULL;
	rd_kafka_poll_set_consumer(rk);
	parts = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(parts, ch->topic, 0)->offset =
		RD_KAFKA_OFFSET_TAIL(RECENT_MSGS);
	rd_kafka_assign(rk, parts);
	rd_kafka_topic_partition_list_destroy(parts);
	return rk;
}

pause_channel *
pause_channel_new(const worker_options *opts, const control_plane_config *config,
				  const char *holder, char *errbuf, size_t errbuf_size)
{
	static const char *const dest[] = {"destination"};
	pause_channel *ch = calloc(1, sizeof(*ch));

	ch->opts = opts;
	ch->topic = pause_topic(config);
	ch->holder = strdup(holder);
	ch->bootstrap =
		config->kafka_bootstrap_servers ? strdup(config->kafka_bootstrap_servers) : NULL;
	ch->listener = new_listener(ch, errbuf, errbuf_size);
	if (ch->listener == NULL)
	{
		pause_channel_free(ch);
		return NULL;
	}
	ch->announced = metric_counter("wal_pause_announcements_total",
								   "Pauses this process announced on the pause topic.", 1, dest);
	ch->heard =
		metric_counter("wal_pause_announcements_heard_total",
					   "Pauses heard on the pause topic (announced by any process).", 1, dest);
	log_info("event=pause_channel_listening topic=%s", ch->topic);
	return ch;
}

void
pause_channel_free(pause_channel *ch)
{
	if (ch == NULL)
		return;
	if (ch->announcer)
	{
		rd_kafka_flush(ch->announcer, 2000);
		rd_kafka_destroy(ch->announcer);
	}
	if (ch->listener)
	{
		rd_kafka_consumer_close(ch->listener);
		rd_kafka_destroy(ch->listener);
	}
	free(ch->topic);
	free(ch->holder);
	free(ch->bootstrap);
	free(ch);
}

static void
on_announced(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque)
{
	(void) rk;
	(void) opaque;
	if (rkm->err)
		log_warn("event=pause_announcement_failed error=\"%s\" msg=\"other workers learn of the "
				 "pause from the database\"",
				 rd_kafka_err2str(rkm->err));
}

static rd_kafka_t *
announcer(pause_channel *ch)
{
	static const kafka_default defaults[] = {
		{"client.id", "wal-worker-pause-announcer"},
		{"linger.ms", "0"},
		{"acks", "1"},
		{"message.timeout.ms", "30000"},
	};
	char errbuf[512];
	rd_kafka_conf_t *conf;

	if (ch->announcer)
		return ch->announcer;
	conf = kafka_conf_build(defaults, sizeof(defaults) / sizeof(defaults[0]), ch->bootstrap,
							ch->opts, errbuf, sizeof(errbuf));
	if (conf)
	{
		rd_kafka_conf_set_dr_msg_cb(conf, on_announced);
		ch->announcer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, sizeof(errbuf));
	}
	if (ch->announcer == NULL)
		log_warn("event=pause_announcement_failed error=\"%s\"", errbuf);
	return ch->announcer;
}

void
pause_channel_announce(pause_channel *ch, const char *destination, int step, long probe_after_ms,
					   int64_t since_ms, bool repeated)
{
	rd_kafka_t *rk = announcer(ch);
	json_t *doc;
	char *value;
	rd_kafka_resp_err_t err;

	if (rk == NULL)
		return;
	doc = json_pack("{s:s, s:i, s:I, s:I, s:s}", "destination", destination, "step", step,
					"probe_after_ms", (json_int_t) probe_after_ms, "since_ms",
					(json_int_t) since_ms, "by", ch->holder);
	value = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	err = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(ch->topic),
							RD_KAFKA_V_KEY(destination, strlen(destination)),
							RD_KAFKA_V_VALUE(value, strlen(value)),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
	free(value);
	if (err)
	{
		log_warn("event=pause_announcement_failed destination=%s error=\"%s\"", destination,
				 rd_kafka_err2str(err));
		return;
	}
	metric_add(ch->announced, 1, (const char *const[]){destination});
	if (repeated)
		log_debug("event=pause_announced_again destination=%s", destination);
	else
		log_warn("event=pause_announced destination=%s step=%d topic=%s", destination, step,
				 ch->topic);
}

/* One announcement; anything malformed or stale is skipped. */
static void
take_announcement(pause_channel *ch, const rd_kafka_message_t *rkm, pause_heard_fn heard, void *arg)
{
	rd_kafka_timestamp_type_t type;
	int64_t at = rd_kafka_message_timestamp(rkm, &type);
	json_error_t jerr;
	json_t *doc;
	const char *destination = NULL, *by = "";
	json_int_t since = 0;

	if (at < 0 || at < wall_ms() - (int64_t) (RECENT_MS / ch->opts->time_scale))
		return;
	doc = json_loadb(rkm->payload, rkm->len, 0, &jerr);
	if (doc == NULL || json_unpack(doc, "{s:s, s:I, s?s}", "destination", &destination, "since_ms",
								   &since, "by", &by) != 0)
		log_warn("event=bad_pause_announcement offset=%" PRId64 " msg=\"skipped\"",
				 (int64_t) rkm->offset);
	else
	{
		metric_add(ch->heard, 1, (const char *const[]){destination});
		heard(arg, destination, by, (int64_t) since);
	}
	json_decref(doc);
}

void
pause_channel_poll(pause_channel *ch, pause_heard_fn heard, void *arg)
{
	rd_kafka_message_t *rkm;

	if (ch->announcer)
		rd_kafka_poll(ch->announcer, 0);
	while ((rkm = rd_kafka_consumer_poll(ch->listener, 0)) != NULL)
	{
		if (rkm->err == RD_KAFKA_RESP_ERR_NO_ERROR)
			take_announcement(ch, rkm, heard, arg);
		else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF && !ch->listen_error_logged)
		{
			/* Logged once: pauses still reach this process through the database. */
			log_warn("event=pause_channel_error topic=%s error=\"%s\"", ch->topic,
					 rd_kafka_message_errstr(rkm));
			ch->listen_error_logged = true;
		}
		rd_kafka_message_destroy(rkm);
	}
}
