/*
 * http_processor.c: POSTs claimed rows to their topic's transform service, all of a batch
 * at once, and collects each answer (see http_processor.h).
 */
#define _GNU_SOURCE /* asprintf */
#include "process/http_processor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/log.h"

typedef struct transfer
{
	attempt_result *result;
	CURL *curl;
	struct curl_slist *headers;
	char *body;
	size_t len;
	bool too_large;
} transfer;

static size_t
collect_body(char *data, size_t size, size_t nmemb, void *arg)
{
	transfer *t = arg;
	size_t n = size * nmemb;
	char *grown;

	/* An answer over the topic's limit could never be stored: stop reading it at the
	 * limit, so a worker holds at most that much per row whatever a service sends. */
	if (t->len + n > (size_t) t->result->row->max_payload_bytes)
	{
		t->too_large = true;
		return 0; /* aborts the transfer */
	}
	grown = realloc(t->body, t->len + n + 1);
	if (grown == NULL)
		return 0;
	t->body = grown;
	memcpy(t->body + t->len, data, n);
	t->len += n;
	t->body[t->len] = '\0';
	return n;
}

static char *
format_error(const char *fmt, const char *a, long b)
{
	char *text;

	if (asprintf(&text, fmt, a, b) < 0)
		fatal("event=out_of_memory");
	return text;
}

static void
start_transfer(CURLM *multi, transfer *t)
{
	const claimed_row *row = t->result->row;
	char line[1024];

	t->curl = curl_easy_init();
	if (t->curl == NULL)
		fatal("event=curl_init_failed");
	snprintf(line, sizeof(line), "Content-Type: %s", row->content_type);
	t->headers = curl_slist_append(t->headers, line);
	snprintf(line, sizeof(line), "Idempotency-Key: %s", row->idempotency_key);
	t->headers = curl_slist_append(t->headers, line);
	snprintf(line, sizeof(line), "X-Wal-Topic: %s", row->topic);
	t->headers = curl_slist_append(t->headers, line);
	snprintf(line, sizeof(line), "X-Wal-Attempt: %d", row->attempts);
	t->headers = curl_slist_append(t->headers, line);
	t->headers = curl_slist_append(t->headers, "Expect:");
	curl_easy_setopt(t->curl, CURLOPT_URL, row->processor);
	curl_easy_setopt(t->curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(t->curl, CURLOPT_POST, 1L);
	curl_easy_setopt(t->curl, CURLOPT_POSTFIELDS, row->payload);
	curl_easy_setopt(t->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) row->payload_len);
	curl_easy_setopt(t->curl, CURLOPT_HTTPHEADER, t->headers);
	curl_easy_setopt(t->curl, CURLOPT_TIMEOUT_MS, row->timeout_ms);
	curl_easy_setopt(t->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, collect_body);
	curl_easy_setopt(t->curl, CURLOPT_WRITEDATA, t);
	curl_easy_setopt(t->curl, CURLOPT_PRIVATE, t);
	curl_multi_add_handle(multi, t->curl);
}

/* Turns a finished transfer into the attempt's payload or error. */
static void
take_answer(transfer *t, CURLcode code)
{
	attempt_result *r = t->result;
	long status = 0;

	curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
	if (t->too_large)
		r->error = format_error("the answer of %s is over the topic's max_payload_bytes (%ld)",
								r->row->processor, r->row->max_payload_bytes);
	else if (code == CURLE_OPERATION_TIMEDOUT)
		r->error =
			format_error("%s did not answer within %ld ms", r->row->processor, r->row->timeout_ms);
	else if (code != CURLE_OK)
	{
		char *text;

		if (asprintf(&text, "%s: %s", r->row->processor, curl_easy_strerror(code)) < 0)
			fatal("event=out_of_memory");
		r->error = text;
	}
	else if (status < 200 || status > 299)
		r->error = format_error("%s answered HTTP %ld", r->row->processor, status);
	else
	{
		r->payload = t->body ? t->body : strdup("");
		if (r->payload == NULL)
			fatal("event=out_of_memory");
		r->payload_len = t->len;
		t->body = NULL;
	}
}

void
run_http_processors(attempt_result *results, int n, attempts_done_fn done, void *arg)
{
	CURLM *multi;
	transfer *transfers;
	attempt_result **completed;
	int running = 0;

	if (n == 0)
		return;
	multi = curl_multi_init();
	transfers = calloc(n, sizeof(transfer));
	completed = calloc(n, sizeof(attempt_result *));
	if (multi == NULL || transfers == NULL || completed == NULL)
		fatal("event=out_of_memory");
	for (int i = 0; i < n; i++)
	{
		transfers[i].result = &results[i];
		start_transfer(multi, &transfers[i]);
	}
	do
	{
		CURLMsg *msg;
		int left, n_completed = 0;

		curl_multi_perform(multi, &running);
		while ((msg = curl_multi_info_read(multi, &left)) != NULL)
		{
			transfer *t;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &t);
			take_answer(t, msg->data.result);
			completed[n_completed++] = t->result;
		}
		if (n_completed > 0)
			done(arg, completed, n_completed);
		if (running > 0)
			curl_multi_poll(multi, NULL, 0, 200, NULL);
	} while (running > 0);

	for (int i = 0; i < n; i++)
	{
		curl_multi_remove_handle(multi, transfers[i].curl);
		curl_easy_cleanup(transfers[i].curl);
		curl_slist_free_all(transfers[i].headers);
		free(transfers[i].body);
	}
	free(transfers);
	free(completed);
	curl_multi_cleanup(multi);
}
