/*
 * sink.c: the HTTP destination for bench/deliver and bench/end_to_end: counts requests per
 * path and answers 204, after a fixed delay if asked, with 503 for a fixed share of the
 * requests of some paths if asked; on 127.0.0.1 (libmicrohttpd, one epoll thread by
 * default).
 *
 *   sink [-p PORT] [-t THREADS] [-d DELAY_MS] [-P] [-f SUBSTRING -n N] [-l LOGFILE]
 *
 *   -p PORT          0 (default): any free port; prints "port N" on stdout
 *   -d DELAY_MS      answer each request DELAY_MS after it arrived, without holding up the
 *                    others (the connection is suspended and a timer thread resumes it)
 *   -P               a path with a segment /lN/ (N digits) is answered after N ms instead
 *   -f SUB -n N      of the requests whose path contains SUB, every Nth is answered 503
 *   -l LOGFILE       one line per request: "<receive epoch us> <path> <X-Wal-Outbox-Id or ->
 *                    <status>", written when it arrived (flushed at exit)
 *
 *   GET /count                 one line per path: "<count> <path>", then "<total> total"
 *   GET /count?prefix=/r1/     the sum of the counts of paths starting with /r1/ (one number)
 *   GET /status?code=N         from now on answer every other request N (0: back to 204
 *                              and -f), e.g. 503 to park copies in retry (bench/scale)
 *   anything else              body read and dropped; counted under its path when answered
 *
 * Runs until SIGTERM/SIGINT.
 */
#include <microhttpd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PATHS 1024

typedef struct
{
	char *path;
	atomic_long count;
} path_count;

/* One request between its arrival and its answer. */
typedef struct pending
{
	struct MHD_Connection *conn;
	int64_t due_us;
	int status;
	int suspended;
	struct pending *next;
} pending;

static path_count paths[MAX_PATHS];
static atomic_int n_paths;
static pthread_mutex_t add_lock = PTHREAD_MUTEX_INITIALIZER;
static struct MHD_Response *empty_response;
static volatile sig_atomic_t stop;

static int64_t delay_us;
static int delay_from_path;
static const char *fail_substring;
static long fail_every;
static atomic_long fail_counter;
static atomic_int forced_status; /* GET /status?code=N; 0: none */
static FILE *request_log;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* The delayed requests, in due order (inserted from the tail: arrival order, mostly). */
static pending *timer_head, *timer_tail;
static pthread_mutex_t timer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t timer_cond = PTHREAD_COND_INITIALIZER;

static void
on_signal(int signo)
{
	(void) signo;
	stop = 1;
}

static int64_t
now_us(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static path_count *
find_path(const char *path)
{
	int n = atomic_load(&n_paths);

	for (int i = 0; i < n; i++)
		if (strcmp(paths[i].path, path) == 0)
			return &paths[i];
	pthread_mutex_lock(&add_lock);
	n = atomic_load(&n_paths);
	for (int i = 0; i < n; i++)
		if (strcmp(paths[i].path, path) == 0)
		{
			pthread_mutex_unlock(&add_lock);
			return &paths[i];
		}
	if (n == MAX_PATHS)
	{
		pthread_mutex_unlock(&add_lock);
		return NULL;
	}
	paths[n].path = strdup(path);
	atomic_store(&paths[n].count, 0);
	atomic_store(&n_paths, n + 1);
	pthread_mutex_unlock(&add_lock);
	return &paths[n];
}

static enum MHD_Result
send_text(struct MHD_Connection *conn, const char *text)
{
	struct MHD_Response *r =
		MHD_create_response_from_buffer(strlen(text), (void *) text, MHD_RESPMEM_MUST_COPY);
	enum MHD_Result ret;

	MHD_add_response_header(r, "Content-Type", "text/plain");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result
report_counts(struct MHD_Connection *conn)
{
	const char *prefix = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "prefix");
	int n = atomic_load(&n_paths);
	long total = 0;
	size_t cap = 64 + (size_t) n * 300, len = 0;
	char *buf = malloc(cap);
	enum MHD_Result ret;

	buf[0] = '\0';
	for (int i = 0; i < n; i++)
	{
		long c = atomic_load(&paths[i].count);

		if (prefix && strncmp(paths[i].path, prefix, strlen(prefix)) != 0)
			continue;
		total += c;
		if (!prefix)
			len += (size_t) snprintf(buf + len, cap - len, "%ld %.250s\n", c, paths[i].path);
	}
	if (prefix)
		snprintf(buf, cap, "%ld\n", total);
	else
		snprintf(buf + len, cap - len, "%ld total\n", total);
	ret = send_text(conn, buf);
	free(buf);
	return ret;
}

/* Resumes each delayed request when its time has come. */
static void *
timer_main(void *arg)
{
	(void) arg;
	pthread_mutex_lock(&timer_lock);
	while (!stop)
	{
		int64_t wait_us;

		if (timer_head == NULL)
		{
			pthread_cond_wait(&timer_cond, &timer_lock);
			continue;
		}
		wait_us = timer_head->due_us - now_us(CLOCK_MONOTONIC);
		if (wait_us > 0)
		{
			struct timespec until;

			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_sec += wait_us / 1000000;
			until.tv_nsec += (wait_us % 1000000) * 1000;
			if (until.tv_nsec >= 1000000000)
			{
				until.tv_sec++;
				until.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&timer_cond, &timer_lock, &until);
			continue;
		}
		{
			pending *p = timer_head;

			timer_head = p->next;
			if (timer_head == NULL)
				timer_tail = NULL;
			MHD_resume_connection(p->conn);
		}
	}
	pthread_mutex_unlock(&timer_lock);
	return NULL;
}

static int
choose_status(const char *url)
{
	int forced = atomic_load(&forced_status);

	if (forced > 0)
		return forced;
	if (fail_substring && fail_every > 0 && strstr(url, fail_substring) &&
		(atomic_fetch_add(&fail_counter, 1) + 1) % fail_every == 0)
		return MHD_HTTP_SERVICE_UNAVAILABLE;
	return MHD_HTTP_NO_CONTENT;
}

static void
log_request(struct MHD_Connection *conn, const char *url, int status)
{
	const char *id = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Wal-Outbox-Id");

	pthread_mutex_lock(&log_lock);
	fprintf(request_log, "%lld %s %s %d\n", (long long) now_us(CLOCK_REALTIME), url,
			id && *id ? id : "-", status);
	pthread_mutex_unlock(&log_lock);
}

static enum MHD_Result
answer(struct MHD_Connection *conn, const char *url, int status)
{
	path_count *p = find_path(url);

	if (p)
		atomic_fetch_add(&p->count, 1);
	return MHD_queue_response(conn, (unsigned) status, empty_response);
}

/* GET /status?code=N: every later request is answered N (100-599), or as usual for 0. */
static enum MHD_Result
force_status(struct MHD_Connection *conn)
{
	const char *code = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "code");
	long n = code ? strtol(code, NULL, 10) : -1;

	if (n != 0 && (n < 100 || n > 599))
		return MHD_queue_response(conn, MHD_HTTP_BAD_REQUEST, empty_response);
	atomic_store(&forced_status, (int) n);
	return MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, empty_response);
}

/* -d, or with -P the N of a path segment /lN/. */
static int64_t
request_delay_us(const char *url)
{
	const char *seg = delay_from_path ? strstr(url, "/l") : NULL;

	while (seg)
	{
		char *end;
		long ms = strtol(seg + 2, &end, 10);

		if (end > seg + 2 && *end == '/')
			return (int64_t) ms * 1000;
		seg = strstr(seg + 2, "/l");
	}
	return delay_us;
}

/* Keeps the list in due order: appended when due last (always, with one delay), else
 * walked in from the head. Called with timer_lock held. */
static void
timer_insert(pending *p)
{
	pending **at = &timer_head;

	if (timer_tail == NULL || timer_tail->due_us <= p->due_us)
	{
		p->next = NULL;
		if (timer_tail)
			timer_tail->next = p;
		else
			timer_head = p;
		timer_tail = p;
		return;
	}
	while (*at && (*at)->due_us <= p->due_us)
		at = &(*at)->next;
	p->next = *at;
	*at = p;
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
		   const char *version, const char *upload_data, size_t *upload_data_size, void **state)
{
	pending *p = *state;

	(void) cls;
	(void) version;
	(void) upload_data;
	if (p == NULL)
	{
		/* First call: headers only. Ask for the body (if any) before answering. */
		*state = calloc(1, sizeof(pending));
		return *state ? MHD_YES : MHD_NO;
	}
	if (*upload_data_size > 0)
	{
		*upload_data_size = 0; /* body chunk: dropped */
		return MHD_YES;
	}
	if (p->suspended)
		return answer(conn, url, p->status); /* resumed by the timer */
	if (strcmp(method, "GET") == 0 && strcmp(url, "/count") == 0)
		return report_counts(conn);
	if (strcmp(method, "GET") == 0 && strcmp(url, "/status") == 0)
		return force_status(conn);
	p->status = choose_status(url);
	if (request_log)
		log_request(conn, url, p->status);
	p->due_us = request_delay_us(url);
	if (p->due_us <= 0)
		return answer(conn, url, p->status);
	p->conn = conn;
	p->suspended = 1;
	p->due_us += now_us(CLOCK_MONOTONIC);
	pthread_mutex_lock(&timer_lock);
	MHD_suspend_connection(conn);
	timer_insert(p);
	pthread_cond_signal(&timer_cond);
	pthread_mutex_unlock(&timer_lock);
	return MHD_YES;
}

static void
on_completed(void *cls, struct MHD_Connection *conn, void **state,
			 enum MHD_RequestTerminationCode why)
{
	(void) cls;
	(void) conn;
	(void) why;
	free(*state);
	*state = NULL;
}

int
main(int argc, char **argv)
{
	unsigned port = 0, threads = 1;
	struct MHD_Daemon *d;
	const union MHD_DaemonInfo *info;
	struct sockaddr_in addr = {.sin_family = AF_INET};
	pthread_t timer;
	int opt;

	while ((opt = getopt(argc, argv, "p:t:d:Pf:n:l:")) != -1)
		switch (opt)
		{
			case 'p':
				port = (unsigned) atoi(optarg);
				break;
			case 't':
				threads = (unsigned) atoi(optarg);
				break;
			case 'd':
				delay_us = (int64_t) atol(optarg) * 1000;
				break;
			case 'P':
				delay_from_path = 1;
				break;
			case 'f':
				fail_substring = optarg;
				break;
			case 'n':
				fail_every = atol(optarg);
				break;
			case 'l':
				request_log = fopen(optarg, "w");
				if (!request_log)
				{
					perror(optarg);
					return 1;
				}
				setvbuf(request_log, NULL, _IOFBF, 1 << 20);
				break;
			default:
				fprintf(stderr, "usage: sink [-p PORT] [-t THREADS] [-d DELAY_MS] [-P] "
								"[-f SUBSTRING -n N] [-l LOGFILE]\n");
				return 2;
		}
	addr.sin_port = htons((uint16_t) port);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	empty_response = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
	d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_TURBO | MHD_USE_ERROR_LOG |
							 MHD_ALLOW_SUSPEND_RESUME,
						 (uint16_t) port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, &addr,
						 MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
						 MHD_OPTION_CONNECTION_TIMEOUT, 0u, MHD_OPTION_CONNECTION_LIMIT, 12000u,
						 MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
						 threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, threads,
						 MHD_OPTION_END);
	if (d == NULL)
	{
		fprintf(stderr, "sink: could not start on 127.0.0.1:%u\n", port);
		return 1;
	}
	pthread_create(&timer, NULL, timer_main, NULL);
	info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	printf("port %u\n", info ? (unsigned) info->port : port);
	fflush(stdout);
	while (!stop)
		pause();
	pthread_mutex_lock(&timer_lock);
	pthread_cond_signal(&timer_cond);
	pthread_mutex_unlock(&timer_lock);
	pthread_join(timer, NULL);
	MHD_stop_daemon(d);
	MHD_destroy_response(empty_response);
	if (request_log)
		fclose(request_log);
	return 0;
}
