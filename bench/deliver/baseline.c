/*
 * baseline.c: the bare minimum `wal-worker consume` does, for bench/deliver: a librdkafka
 * consumer (its own group, auto commit off, from the beginning, committing nothing) plus
 * a libcurl multi loop that POSTs each record's value to each of N URLs, at most
 * MAX_IN_FLIGHT requests in flight per URL. No retries, no DLQ, no dedupe, no signing,
 * no offset tracking beyond "this record's copies are done".
 *
 *   baseline BOOTSTRAP TOPIC GROUP RECORDS MAX_IN_FLIGHT MODE URL...
 *
 * RECORDS 0: runs until SIGTERM (bench/end_to_end feeds it live records).
 *
 * MODE "bare": every request carries only Content-Type: application/json (set once).
 * MODE "same-request": every request carries the headers a delivery must carry, read
 * from the record's Kafka headers like the worker does: Content-Type, Idempotency-Key,
 * X-Wal-Topic, X-Wal-Outbox-Id, X-Wal-Attempt and User-Agent, built with curl_slist per
 * request, the plain way. The sink sees the same bytes from it as from the worker.
 *
 * Like the worker it stops fetching while MAX_OPEN records (2000, the worker's
 * MAX_OPEN_RECORDS) are not yet done, and keeps one connection per in-flight slot
 * (easy handles are reused, so connections stay alive). It waits on Kafka and on the
 * sockets at once (the consumer queue signals a pipe that curl_multi_poll watches).
 * Exits 0 after RECORDS x N answers. A non-2xx answer counts as an answer ("refused": the
 * bare loop neither retries nor keeps it, so it does strictly less than the worker, which
 * hands such a copy to its retry topic); a transport error is reported as failed and the
 * exit status is 1. Prints one line: records, copies, refused, failed, seconds since
 * start, CPU seconds used (user + system, all threads).
 */
#include <curl/curl.h>
#include <librdkafka/rdkafka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_OPEN 2000

typedef struct
{
	rd_kafka_message_t *msg;
	int copies_left;
} open_record;

typedef struct transfer transfer;

typedef struct
{
	const char *url;
	int in_flight;
	int limit;
	transfer **idle; /* stack of idle easy handles */
	int n_idle;
	int queue[MAX_OPEN]; /* FIFO of open record slots waiting for this destination */
	int q_head, q_len;
} destination;

struct transfer
{
	CURL *easy;
	destination *dest;
	int record;
	struct curl_slist *headers; /* same-request mode: this request's own */
};

static open_record records[MAX_OPEN];
static int free_slots[MAX_OPEN], n_free;
static destination *dests;
static int n_dests;
static long answered, refused, failed;
static struct curl_slist *headers;
static CURLM *multi;
static bool same_request;
static volatile sig_atomic_t stop_asked;

static void
on_signal(int signo)
{
	(void) signo;
	stop_asked = 1;
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t
discard(char *data, size_t size, size_t n, void *arg)
{
	(void) data;
	(void) arg;
	return size * n;
}

static const char *
header_or(rd_kafka_message_t *m, const char *name, const char *otherwise)
{
	rd_kafka_headers_t *hdrs;
	const void *value;
	size_t size;

	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
		rd_kafka_header_get_last(hdrs, name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR && value)
		return value; /* librdkafka NUL-terminates header values */
	return otherwise;
}

static void
set_delivery_headers(transfer *t, rd_kafka_message_t *m)
{
	char line[1024];

	snprintf(line, sizeof(line), "Content-Type: %s",
			 header_or(m, "content-type", "application/octet-stream"));
	t->headers = curl_slist_append(NULL, line);
	snprintf(line, sizeof(line), "Idempotency-Key: %s", header_or(m, "idempotency-key", ""));
	t->headers = curl_slist_append(t->headers, line);
	snprintf(line, sizeof(line), "X-Wal-Topic: %s", rd_kafka_topic_name(m->rkt));
	t->headers = curl_slist_append(t->headers, line);
	snprintf(line, sizeof(line), "X-Wal-Outbox-Id: %s", header_or(m, "outbox-id", ""));
	t->headers = curl_slist_append(t->headers, line);
	t->headers = curl_slist_append(t->headers, "X-Wal-Attempt: 1");
	t->headers = curl_slist_append(t->headers, "Expect:");
	curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
}

static void
start(destination *d, int record)
{
	transfer *t = d->idle[--d->n_idle];
	rd_kafka_message_t *m = records[record].msg;

	t->record = record;
	if (same_request)
		set_delivery_headers(t, m);
	curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE, (long) m->len);
	curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, m->payload ? (char *) m->payload : "");
	curl_multi_add_handle(multi, t->easy);
	d->in_flight++;
}

static void
record_copy_done(int record)
{
	if (--records[record].copies_left == 0)
	{
		rd_kafka_message_destroy(records[record].msg);
		records[record].msg = NULL;
		free_slots[n_free++] = record;
	}
}

static void
handle_message(rd_kafka_message_t *m)
{
	int slot = free_slots[--n_free];

	records[slot].msg = m;
	records[slot].copies_left = n_dests;
	for (int i = 0; i < n_dests; i++)
	{
		destination *d = &dests[i];

		if (d->q_len == 0 && d->in_flight < d->limit)
			start(d, slot);
		else
			d->queue[(d->q_head + d->q_len++) % MAX_OPEN] = slot;
	}
}

static int
read_completions(void)
{
	CURLMsg *msg;
	int left, n = 0;

	while ((msg = curl_multi_info_read(multi, &left)))
	{
		transfer *t;
		long status = 0;
		destination *d;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &t);
		curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
		if (msg->data.result == CURLE_OK && (status < 200 || status > 299))
			refused++;
		else if (msg->data.result != CURLE_OK)
		{
			if (failed++ < 5)
				fprintf(stderr, "baseline: %s: %s, HTTP %ld\n", t->dest->url,
						curl_easy_strerror(msg->data.result), status);
		}
		curl_multi_remove_handle(multi, t->easy);
		curl_slist_free_all(t->headers);
		t->headers = NULL;
		d = t->dest;
		d->in_flight--;
		d->idle[d->n_idle++] = t;
		answered++;
		n++;
		record_copy_done(t->record);
		if (d->q_len > 0)
		{
			int next = d->queue[d->q_head];

			d->q_head = (d->q_head + 1) % MAX_OPEN;
			d->q_len--;
			start(d, next);
		}
	}
	return n;
}

int
main(int argc, char **argv)
{
	char errstr[512];
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_queue_t *queue;
	rd_kafka_topic_partition_list_t *topics;
	int pipefd[2];
	long want, consumed = 0;
	int limit;
	double t0 = now_s();

	if (argc < 8 || (strcmp(argv[6], "bare") != 0 && strcmp(argv[6], "same-request") != 0))
	{
		fprintf(stderr, "usage: baseline BOOTSTRAP TOPIC GROUP RECORDS MAX_IN_FLIGHT "
						"bare|same-request URL...\n");
		return 2;
	}
	want = atol(argv[4]);
	limit = atoi(argv[5]);
	same_request = strcmp(argv[6], "same-request") == 0;
	n_dests = argc - 7;

	conf = rd_kafka_conf_new();
	if (rd_kafka_conf_set(conf, "bootstrap.servers", argv[1], errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "group.id", argv[3], errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", errstr, sizeof(errstr)))
	{
		fprintf(stderr, "baseline: %s\n", errstr);
		return 1;
	}
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (!rk)
	{
		fprintf(stderr, "baseline: %s\n", errstr);
		return 1;
	}
	rd_kafka_poll_set_consumer(rk);
	topics = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(topics, argv[2], RD_KAFKA_PARTITION_UA);
	if (rd_kafka_subscribe(rk, topics))
	{
		fprintf(stderr, "baseline: subscribe failed\n");
		return 1;
	}
	rd_kafka_topic_partition_list_destroy(topics);

	/* The consumer queue writes to the pipe when it goes from empty to non-empty. */
	if (pipe(pipefd) != 0)
		return 1;
	fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
	fcntl(pipefd[1], F_SETFL, O_NONBLOCK);
	queue = rd_kafka_queue_get_consumer(rk);
	rd_kafka_queue_io_event_enable(queue, pipefd[1], "1", 1);

	curl_global_init(CURL_GLOBAL_DEFAULT);
	multi = curl_multi_init();
	curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long) (n_dests * limit));
	headers = curl_slist_append(NULL, "Content-Type: application/json");
	headers = curl_slist_append(headers, "Expect:");
	dests = calloc(n_dests, sizeof(*dests));
	for (int i = 0; i < n_dests; i++)
	{
		destination *d = &dests[i];

		d->url = argv[7 + i];
		d->limit = limit;
		d->idle = calloc(limit, sizeof(transfer *));
		for (int k = 0; k < limit; k++)
		{
			transfer *t = calloc(1, sizeof(*t));

			t->easy = curl_easy_init();
			t->dest = d;
			curl_easy_setopt(t->easy, CURLOPT_URL, d->url);
			curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, headers);
			curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, discard);
			curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
			curl_easy_setopt(t->easy, CURLOPT_PRIVATE, (char *) t);
			if (same_request)
				curl_easy_setopt(t->easy, CURLOPT_USERAGENT, "wal_delivery");
			d->idle[d->n_idle++] = t;
		}
	}
	for (int i = MAX_OPEN - 1; i >= 0; i--)
		free_slots[n_free++] = i;

	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	while (want > 0 ? answered < want * n_dests : !stop_asked)
	{
		bool kafka_empty = false;
		int running, done;

		while (n_free > 0)
		{
			rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 0);

			if (!m)
			{
				kafka_empty = true;
				break;
			}
			if (m->err)
			{
				if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
					fprintf(stderr, "baseline: %s\n", rd_kafka_message_errstr(m));
				rd_kafka_message_destroy(m);
				continue;
			}
			consumed++;
			handle_message(m);
		}
		curl_multi_perform(multi, &running);
		done = read_completions();
		if (done == 0 && (kafka_empty || n_free == 0))
		{
			struct curl_waitfd extra = {.fd = pipefd[0], .events = CURL_WAIT_POLLIN};
			char drain[64];

			curl_multi_poll(multi, &extra, 1, 100, NULL);
			while (read(pipefd[0], drain, sizeof(drain)) > 0)
				;
		}
	}
	{
		struct rusage ru;

		getrusage(RUSAGE_SELF, &ru);
		printf("records=%ld copies=%ld refused=%ld failed=%ld seconds=%.3f cpu=%.2f\n", consumed,
			   answered, refused, failed, now_s() - t0,
			   ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
				   (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
	}
	fflush(stdout);
	rd_kafka_queue_destroy(queue);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return failed > 0 ? 1 : 0;
}
