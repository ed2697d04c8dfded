/*
 * control_plane.c: load and parse the workers' configuration (see control_plane.h).
 */
#include "control_plane.h"

#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

static char *
dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static char **
string_array(json_t *array, int *count)
{
	size_t i;
	json_t *item;
	char **out = calloc(json_array_size(array) + 1, sizeof(char *));

	*count = 0;
	json_array_foreach(array, i, item)
	{
		if (json_is_string(item))
			out[(*count)++] = strdup(json_string_value(item));
	}
	return out;
}

static bool
parse_destination(json_t *obj, destination_config *d, char *errbuf, size_t errbuf_size)
{
	json_t *delays = json_object_get(obj, "retry_delays_ms");
	json_t *headers = json_object_get(obj, "headers");
	const char *name = json_string_value(json_object_get(obj, "name"));
	const char *endpoint = json_string_value(json_object_get(obj, "endpoint"));

	if (name == NULL || endpoint == NULL)
	{
		snprintf(errbuf, errbuf_size, "a destination has no name or endpoint");
		return false;
	}
	d->name = strdup(name);
	d->endpoint = strdup(endpoint);
	d->method = dup_or_null(json_string_value(json_object_get(obj, "method")));
	if (d->method == NULL)
		d->method = strdup("POST");
	d->headers = json_is_object(headers) ? json_incref(headers) : json_object();
	d->timeout_ms = (long) json_integer_value(json_object_get(obj, "timeout_ms"));
	d->max_in_flight = (int) json_integer_value(json_object_get(obj, "max_in_flight"));
	d->dedicated = json_is_true(json_object_get(obj, "dedicated"));
	d->verify_tls = !json_is_false(json_object_get(obj, "verify_tls"));
	d->transient_statuses =
		string_array(json_object_get(obj, "transient_statuses"), &d->n_transient_statuses);
	for (int i = 0; i < RETRY_STEPS; i++)
		d->retry_delays_ms[i] = (long) json_integer_value(json_array_get(delays, i));
	d->retry_jitter = json_number_value(json_object_get(obj, "retry_jitter"));
	d->pause_after_failures =
		(int) json_integer_value(json_object_get(obj, "pause_after_failures"));
	d->probe_interval_ms = (long) json_integer_value(json_object_get(obj, "probe_interval_ms"));
	d->retry_partition = (int) json_integer_value(json_object_get(obj, "retry_partition"));
	d->signing_secret = dup_or_null(json_string_value(json_object_get(obj, "signing_secret")));
	d->secret_unavailable = d->signing_secret && strcmp(d->signing_secret, "redacted") == 0;
	d->topics = string_array(json_object_get(obj, "topics"), &d->n_topics);
	if (d->timeout_ms <= 0 || d->max_in_flight <= 0)
	{
		snprintf(errbuf, errbuf_size, "destination %s has no timeout or max_in_flight", name);
		return false;
	}
	return true;
}

control_plane_config *
config_from_json(const char *json, char *errbuf, size_t errbuf_size)
{
	json_error_t jerr;
	json_t *root = json_loads(json, 0, &jerr);
	json_t *settings;
	json_t *destinations;
	control_plane_config *config;
	size_t i;
	json_t *item;

	if (root == NULL)
	{
		snprintf(errbuf, errbuf_size, "config is not JSON: %s (line %d)", jerr.text, jerr.line);
		return NULL;
	}
	settings = json_object_get(root, "settings");
	destinations = json_object_get(root, "destinations");
	if (!json_is_object(settings) || !json_is_array(destinations) ||
		!json_is_integer(json_object_get(root, "version")))
	{
		snprintf(errbuf, errbuf_size, "config lacks version, settings or destinations");
		json_decref(root);
		return NULL;
	}
	config = calloc(1, sizeof(*config));
	config->version = json_integer_value(json_object_get(root, "version"));
	config->published_version = json_integer_value(json_object_get(root, "published_version"));
	config->kafka_bootstrap_servers =
		dup_or_null(json_string_value(json_object_get(settings, "kafka_bootstrap_servers")));
	config->retry_topic_prefix =
		dup_or_null(json_string_value(json_object_get(settings, "retry_topic_prefix")));
	config->dlq_topic = dup_or_null(json_string_value(json_object_get(settings, "dlq_topic")));
	config->dlq_alert_url =
		dup_or_null(json_string_value(json_object_get(settings, "dlq_alert_url")));
	config->consumer_dedupe_ttl_ms =
		(long) json_integer_value(json_object_get(settings, "consumer_dedupe_ttl_ms"));
	config->destinations = calloc(json_array_size(destinations) + 1, sizeof(destination_config));
	json_array_foreach(destinations, i, item)
	{
		if (!parse_destination(item, &config->destinations[config->n_destinations++], errbuf,
							   errbuf_size))
		{
			json_decref(root);
			config_free(config);
			return NULL;
		}
	}
	if (config->retry_topic_prefix == NULL || config->dlq_topic == NULL)
	{
		snprintf(errbuf, errbuf_size, "config lacks retry_topic_prefix or dlq_topic");
		json_decref(root);
		config_free(config);
		return NULL;
	}
	config->json = strdup(json);
	json_decref(root);
	return config;
}

static void
free_strings(char **strings, int n)
{
	for (int i = 0; i < n; i++)
		free(strings[i]);
	free(strings);
}

void
config_free(control_plane_config *config)
{
	if (config == NULL)
		return;
	for (int i = 0; i < config->n_destinations; i++)
	{
		destination_config *d = &config->destinations[i];

		free(d->name);
		free(d->endpoint);
		free(d->method);
		json_decref(d->headers);
		free_strings(d->transient_statuses, d->n_transient_statuses);
		free(d->signing_secret);
		free_strings(d->topics, d->n_topics);
	}
	free(config->destinations);
	free(config->kafka_bootstrap_servers);
	free(config->retry_topic_prefix);
	free(config->dlq_topic);
	free(config->dlq_alert_url);
	free(config->json);
	free(config);
}

control_plane_config *
config_load_from_db(PGconn *conn, char *errbuf, size_t errbuf_size)
{
	return config_load_document(conn, "worker_config", errbuf, errbuf_size);
}

control_plane_config *
config_load_document(PGconn *conn, const char *function, char *errbuf, size_t errbuf_size)
{
	char query[128];
	PGresult *res;

	snprintf(query, sizeof(query), "SELECT wal_delivery.%s()::text", function);
	res = PQexec(conn, query);
	control_plane_config *config = NULL;

	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	/* The database answered: say what is wrong with it rather than "unreachable". */
	if (state && (strcmp(state, "3F000") == 0 || strcmp(state, "42883") == 0))
		snprintf(errbuf, errbuf_size,
				 "the database is up but has no wal_delivery extension (run CREATE EXTENSION "
				 "wal_delivery in the database the worker connects to, %s): %s",
				 PQdb(conn), PQresultErrorMessage(res));
	else if (state && strcmp(state, "42501") == 0)
		snprintf(errbuf, errbuf_size,
				 "the worker's role %s may not read the config (grant it wal_delivery_worker): %s",
				 PQuser(conn), PQresultErrorMessage(res));
	else if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		snprintf(errbuf, errbuf_size, "reading wal_delivery.%s(): %s", function,
				 PQerrorMessage(conn));
	else
		config = config_from_json(PQgetvalue(res, 0, 0), errbuf, errbuf_size);
	PQclear(res);
	return config;
}

/* A peer's document is a few KB per destination; more is a broken or hostile peer. */
#define PEER_CONFIG_MAX_BYTES (16 * 1024 * 1024)

typedef struct
{
	char *data;
	size_t len;
	bool too_large;
} response_buffer;

static size_t
collect_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	response_buffer *buf = userdata;
	size_t n = size * nmemb;
	char *grown;

	if (buf->len + n > PEER_CONFIG_MAX_BYTES)
	{
		buf->too_large = true;
		return 0; /* ends the transfer with CURLE_WRITE_ERROR */
	}
	grown = realloc(buf->data, buf->len + n + 1);
	if (grown == NULL)
		return 0;
	buf->data = grown;
	memcpy(buf->data + buf->len, ptr, n);
	buf->len += n;
	buf->data[buf->len] = '\0';
	return n;
}

control_plane_config *
config_load_from_peer(const char *base_url, const char *peer_token, long timeout_ms,
					  long *http_status, char *errbuf, size_t errbuf_size)
{
	CURL *curl = curl_easy_init();
	response_buffer body = {0};
	struct curl_slist *headers = NULL;
	char url[1024];
	char auth[512];
	long status = 0;
	CURLcode rc;
	control_plane_config *config = NULL;

	snprintf(url, sizeof(url), "%s/config", base_url);
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect_body);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t) PEER_CONFIG_MAX_BYTES);
	if (peer_token != NULL && peer_token[0] != '\0')
	{
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s", peer_token);
		headers = curl_slist_append(headers, auth);
		curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
	}
	rc = curl_easy_perform(curl);
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	*http_status = status;
	if (body.too_large || rc == CURLE_FILESIZE_EXCEEDED)
		snprintf(errbuf, errbuf_size, "peer %s: config larger than %d bytes, refused", url,
				 PEER_CONFIG_MAX_BYTES);
	else if (rc != CURLE_OK)
		snprintf(errbuf, errbuf_size, "peer %s: %s", url, curl_easy_strerror(rc));
	else if (status != 200 || body.data == NULL)
		snprintf(errbuf, errbuf_size, "peer %s answered HTTP %ld", url, status);
	else
		config = config_from_json(body.data, errbuf, errbuf_size);
	curl_slist_free_all(headers);
	curl_easy_cleanup(curl);
	free(body.data);
	return config;
}

const destination_config *
config_find_destination(const control_plane_config *config, const char *name)
{
	for (int i = 0; i < config->n_destinations; i++)
		if (strcmp(config->destinations[i].name, name) == 0)
			return &config->destinations[i];
	return NULL;
}

bool
destination_subscribes(const destination_config *destination, const char *topic)
{
	for (int i = 0; i < destination->n_topics; i++)
		if (strcmp(destination->topics[i], topic) == 0)
			return true;
	return false;
}
