/*
 * sink.c: the HTTP destination for bench/scale: answers every request after a fixed
 * latency, so a destination is not free and instances have something to overlap, and
 * counts requests per path, on 127.0.0.1 (libmicrohttpd, a thread per connection: each
 * in-flight request sleeps in its own thread).
 *
 *   sink LATENCY_MS               prints "port N" on stdout (any free port)
 *
 *   GET /count?prefix=/r1/        the sum of the counts of paths starting with /r1/
 *   GET /status?code=503          from now on answer every request with that status
 *   anything else                 counted under its path (body dropped), answered after
 *                                 LATENCY_MS with the current status (204 at start)
 *
 * Runs until SIGTERM/SIGINT.
 */
#include <microhttpd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PATHS 4096

typedef struct
{
	char *path;
	atomic_long count;
} path_count;

static path_count paths[MAX_PATHS];
static atomic_int n_paths;
static atomic_int answer_status = MHD_HTTP_NO_CONTENT;
static pthread_mutex_t add_lock = PTHREAD_MUTEX_INITIALIZER;
static struct MHD_Response *empty_response;
static long latency_ms;
static volatile sig_atomic_t stop;

static void
on_signal(int signo)
{
	(void) signo;
	stop = 1;
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
report_count(struct MHD_Connection *conn)
{
	const char *prefix = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "prefix");
	int n = atomic_load(&n_paths);
	long total = 0;
	char buf[32];

	for (int i = 0; i < n; i++)
		if (prefix == NULL || strncmp(paths[i].path, prefix, strlen(prefix)) == 0)
			total += atomic_load(&paths[i].count);
	snprintf(buf, sizeof(buf), "%ld\n", total);
	return send_text(conn, buf);
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
		   const char *version, const char *upload_data, size_t *upload_data_size, void **state)
{
	static int first_call_marker;
	path_count *p;
	struct timespec pause_for = {latency_ms / 1000, (latency_ms % 1000) * 1000000L};

	(void) cls;
	(void) version;
	(void) upload_data;
	if (*state == NULL)
	{
		/* First call: headers only. Ask for the body (if any) before answering. */
		*state = &first_call_marker;
		return MHD_YES;
	}
	if (*upload_data_size > 0)
	{
		*upload_data_size = 0; /* body chunk: dropped */
		return MHD_YES;
	}
	if (strcmp(method, "GET") == 0 && strcmp(url, "/count") == 0)
		return report_count(conn);
	if (strcmp(method, "GET") == 0 && strcmp(url, "/status") == 0)
	{
		const char *code = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "code");

		atomic_store(&answer_status, code ? atoi(code) : MHD_HTTP_NO_CONTENT);
		return send_text(conn, "ok\n");
	}
	p = find_path(url);
	if (p)
		atomic_fetch_add(&p->count, 1);
	/* This connection's own thread: sleeping holds only this request. */
	nanosleep(&pause_for, NULL);
	return MHD_queue_response(conn, (unsigned) atomic_load(&answer_status), empty_response);
}

int
main(int argc, char **argv)
{
	struct MHD_Daemon *d;
	const union MHD_DaemonInfo *info;
	struct sockaddr_in addr = {.sin_family = AF_INET};

	if (argc != 2)
	{
		fprintf(stderr, "usage: sink LATENCY_MS\n");
		return 2;
	}
	latency_ms = atol(argv[1]);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	empty_response = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
	d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
							 MHD_USE_ERROR_LOG,
						 0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, &addr,
						 MHD_OPTION_CONNECTION_TIMEOUT, 0u, MHD_OPTION_CONNECTION_LIMIT, 4000u,
						 MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_END);
	if (d == NULL)
	{
		fprintf(stderr, "sink: could not start on 127.0.0.1\n");
		return 1;
	}
	info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	printf("port %u\n", info ? (unsigned) info->port : 0u);
	fflush(stdout);
	while (!stop)
		pause();
	MHD_stop_daemon(d);
	MHD_destroy_response(empty_response);
	return 0;
}
