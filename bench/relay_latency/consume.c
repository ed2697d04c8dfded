/*
 * consume.c: the reader for bench/relay_latency/run. A librdkafka consumer assigned every
 * partition of TOPIC at its current end (no group offsets, nothing committed); for each
 * record whose value holds "sent_us": <epoch microseconds> it writes one line to stdout:
 *
 *   <sent_us> <produced_us> <read_us> <outbox id>
 *
 * sent_us is the enqueuing statement's clock_timestamp(), produced_us the record's Kafka
 * timestamp (CreateTime: when the relay handed it to librdkafka, ms resolution), read_us
 * when this process read it, and the outbox id (header outbox-id, -1 if none) lets the
 * harness find the record's commit time. Enqueue -> produce is the outbox's part of the
 * latency (commit, wake-up, pass), produce -> read Kafka's and the reader's.
 *
 *   consume BOOTSTRAP TOPIC
 *
 * The first line, on stderr, is "ready" once the partitions are assigned; it stops on
 * SIGTERM or SIGINT.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../common/kafka_tail.h"

int
main(int argc, char **argv)
{
	/* A fetch returns as soon as there is a byte; the wait only bounds an empty fetch. */
	static const char *const fetch_now[] = {"fetch.wait.max.ms", "100", NULL};
	rd_kafka_t *rk;
	int partitions;
	int64_t end_sum;

	if (argc != 3)
	{
		fprintf(stderr, "usage: consume BOOTSTRAP TOPIC\n");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0); /* the harness counts the lines while it runs */
	rk = kafka_tail_open("consume", argv[1], argv[2], fetch_now, 30, &partitions, &end_sum);
	fprintf(stderr, "ready\n");

	while (!kafka_tail_stop_asked)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
		int64_t now = kafka_tail_wall_us(), sent, ts;
		rd_kafka_timestamp_type_t tstype;

		if (m == NULL)
			continue;
		if (!m->err && m->payload && (sent = kafka_tail_sent_stamp(m->payload, m->len)) > 0)
		{
			rd_kafka_headers_t *hdrs = NULL;
			const void *id = NULL;
			size_t id_len = 0;
			char idbuf[32] = "-1";

			ts = rd_kafka_message_timestamp(m, &tstype);
			if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
				rd_kafka_header_get_last(hdrs, "outbox-id", &id, &id_len) ==
					RD_KAFKA_RESP_ERR_NO_ERROR &&
				id_len < sizeof(idbuf))
			{
				memcpy(idbuf, id, id_len);
				idbuf[id_len] = '\0';
			}
			printf("%" PRId64 " %" PRId64 " %" PRId64 " %s\n", sent, ts * 1000, now, idbuf);
		}
		else if (m->err && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
			fprintf(stderr, "consume: %s\n", rd_kafka_message_errstr(m));
		rd_kafka_message_destroy(m);
	}
	fflush(stdout);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return 0;
}
