/*
 * console_api_dead_letters.c: the dead-letter endpoints of the console's API
 * (console_api.h): the filtered list by keyset, counts, one entry with its payload, the
 * payload as a download, and single and bulk replay and resolve.
 *
 * Lists page newest first by id: the next page is `id < the last id shown`, which the
 * indexes of dead_letters.sql read from where the last page ended, however deep; never
 * OFFSET, which reads and drops every row before the page.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console/console_api.h"
#include "console/console_payload.h"

/* The filters' parameters, in the order of FILTER_SQL's $1..$7. */
#define N_FILTERS 7
static const char *const filter_names[N_FILTERS] = {"topic", "destination", "reason", "since",
													"until", "key",         "state"};

/* NULL parameters match everything (libpq plans unnamed statements with their values). */
#define FILTER_SQL                                                                                 \
	" ($1::text IS NULL OR topic = $1) AND ($2::text IS NULL OR destination = $2)"                 \
	" AND ($3::text IS NULL OR strpos(lower(last_error), lower($3)) > 0)"                          \
	" AND ($4::timestamptz IS NULL OR failed_at >= $4)"                                            \
	" AND ($5::timestamptz IS NULL OR failed_at < $5)"                                             \
	" AND ($6::text IS NULL OR idempotency_key = $6)"                                              \
	" AND CASE coalesce($7, 'unresolved') WHEN 'unresolved' THEN resolved_at IS NULL"              \
	" WHEN 'resolved' THEN resolved_at IS NOT NULL ELSE true END"

typedef struct
{
	char values[N_FILTERS][512];
	const char *params[N_FILTERS + 2];
} filters;

/* Reads the filters from the query; false with a 400 answered. */
static bool
read_filters(const console_request *r, console_answer *a, filters *f)
{
	for (int i = 0; i < N_FILTERS; i++)
	{
		int got = console_query_arg(r, filter_names[i], f->values[i], sizeof(f->values[i]));

		if (got < 0)
		{
			console_answer_error(a, 400, "the filter %s is not valid UTF-8 or is too long",
								 filter_names[i]);
			return false;
		}
		f->params[i] = got ? f->values[i] : NULL;
	}
	if (f->params[6] && strcmp(f->params[6], "unresolved") != 0 &&
		strcmp(f->params[6], "resolved") != 0 && strcmp(f->params[6], "all") != 0)
	{
		console_answer_error(a, 400, "state must be unresolved, resolved or all");
		return false;
	}
	return true;
}

/* A positive id from text; 0 when it is not one. */
static long long
parse_id(const char *s)
{
	char *end;
	long long id;

	errno = 0;
	id = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || id <= 0 || s[0] == '+' || s[0] == ' ')
		return 0;
	return id;
}

static void
list(console_request *r, console_answer *a)
{
	filters f;
	char before[32], limit[32];
	int got_before, got_limit;
	long long n = 50;

	if (!read_filters(r, a, &f))
		return;
	got_before = console_query_arg(r, "before", before, sizeof(before));
	got_limit = console_query_arg(r, "limit", limit, sizeof(limit));
	if (got_before < 0 || (got_before && parse_id(before) == 0))
		return console_answer_error(a, 400, "before must be a dead letter id");
	if (got_limit < 0 || (got_limit && ((n = parse_id(limit)) == 0 || n > CONSOLE_PAGE_MAX)))
		return console_answer_error(a, 400, "limit must be 1 to %d", CONSOLE_PAGE_MAX);
	snprintf(limit, sizeof(limit), "%lld", n);
	f.params[7] = got_before ? before : NULL;
	f.params[8] = limit;
	console_answer_query(
		r, a,
		"SELECT json_build_object('dead_letters', coalesce(json_agg(d ORDER BY d.id DESC), '[]'),"
		" 'next_before', CASE WHEN count(*) = $9::int THEN min(d.id) END)::text FROM ("
		" SELECT id, origin, topic, destination, idempotency_key, attempts,"
		" left(last_error, 500) AS last_error, failed_at, resolved_at, left(resolution, 200)"
		" AS resolution, replay_requested_at, replays, octet_length(payload) AS payload_bytes,"
		" archived_at FROM wal_delivery.dead_letters WHERE" FILTER_SQL
		" AND ($8::bigint IS NULL OR id < $8) ORDER BY id DESC LIMIT $9::int) d",
		9, f.params);
}

static void
count(console_request *r, console_answer *a)
{
	filters f;

	if (!read_filters(r, a, &f))
		return;
	console_answer_query(r, a,
						 "SELECT json_build_object('count', count(*))::text"
						 " FROM wal_delivery.dead_letters WHERE" FILTER_SQL,
						 N_FILTERS, f.params);
}

static void
show(console_request *r, console_answer *a, const char *id)
{
	const char *params[] = {id, NULL};
	char shown[16];
	PGresult *res;
	json_t *entry;
	unsigned char *bytes;
	size_t hex_len;

	snprintf(shown, sizeof(shown), "%d", CONSOLE_PAYLOAD_SHOWN);
	params[1] = shown;
	res = console_query(
		r, a,
		"SELECT (to_jsonb(d) - 'payload' || jsonb_build_object('payload_bytes',"
		" octet_length(payload)))::text, encode(substring(payload FROM 1 FOR $2::int), 'hex'),"
		" octet_length(payload) FROM wal_delivery.dead_letters d WHERE id = $1::bigint",
		2, params);
	if (res == NULL)
		return;
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		return console_answer_error(a, 404, "dead letter %s does not exist", id);
	}
	entry = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
	hex_len = (size_t) PQgetlength(res, 0, 1);
	bytes = malloc(hex_len / 2 + 1);
	if (entry == NULL || bytes == NULL || !console_unhex(PQgetvalue(res, 0, 1), hex_len, bytes))
	{
		json_decref(entry);
		free(bytes);
		PQclear(res);
		return console_answer_error(a, 500, "the dead letter could not be read");
	}
	json_object_set_new(entry, "payload",
						console_payload_view(bytes, hex_len / 2,
											 (size_t) strtoull(PQgetvalue(res, 0, 2), NULL, 10)));
	free(bytes);
	PQclear(res);
	console_answer_json(a, 200, entry);
}

/* The whole payload, as bytes to save: never rendered by the browser. */
static void
download(console_request *r, console_answer *a, const char *id)
{
	const char *params[] = {id};
	PGresult *res = console_query(
		r, a, "SELECT encode(payload, 'hex') FROM wal_delivery.dead_letters WHERE id = $1::bigint",
		1, params);
	size_t hex_len;

	if (res == NULL)
		return;
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		return console_answer_error(a, 404, "dead letter %s does not exist", id);
	}
	hex_len = (size_t) PQgetlength(res, 0, 0);
	a->body = malloc(hex_len / 2 + 1);
	if (a->body == NULL ||
		!console_unhex(PQgetvalue(res, 0, 0), hex_len, (unsigned char *) a->body))
	{
		PQclear(res);
		return console_answer_error(a, 500, "the payload could not be read");
	}
	a->body_len = hex_len / 2;
	a->status = 200;
	a->content_type = "application/octet-stream";
	snprintf(a->disposition, sizeof(a->disposition), "attachment; filename=\"dead-letter-%s.bin\"",
			 id);
	PQclear(res);
}

/* The note of a resolve body; NULL with a 400 answered. */
static const char *
body_note(json_t *body, console_answer *a)
{
	const char *note = json_string_value(json_object_get(body, "note"));

	if (note == NULL)
		console_answer_error(a, 400, "send {\"note\": \"how it was handled\"}");
	return note;
}

static void
act_on_one(console_request *r, console_answer *a, const char *id, const char *action)
{
	if (strcmp(action, "replay") == 0)
	{
		const char *params[] = {id};

		return console_answer_query(r, a,
									"SELECT json_build_object('outcome', "
									"wal_delivery.replay_dead_letter($1::bigint))::text",
									1, params);
	}
	if (strcmp(action, "resolve") == 0)
	{
		json_t *body = console_body_object(r, a);
		const char *note = body ? body_note(body, a) : NULL;

		if (note != NULL)
		{
			const char *params[] = {id, note};

			console_answer_query(r, a,
								 "SELECT json_build_object('resolved', true)::text FROM (SELECT"
								 " wal_delivery.resolve_dead_letter($1::bigint, $2)) done",
								 2, params);
		}
		json_decref(body);
		return;
	}
	console_answer_error(a, 404, "no such action: replay or resolve");
}

/* {"ids": [1, 2]} as a Postgres array literal; NULL with a 400 answered. */
static char *
ids_literal(json_t *ids, console_answer *a)
{
	size_t n = json_array_size(ids), i;
	char *lit, *p;
	json_t *v;

	if (!json_is_array(ids) || n == 0 || n > CONSOLE_BULK_IDS_MAX)
	{
		console_answer_error(a, 400, "ids must be a list of 1 to %d dead letter ids",
							 CONSOLE_BULK_IDS_MAX);
		return NULL;
	}
	p = lit = malloc(n * 21 + 3);
	*p++ = '{';
	json_array_foreach(ids, i, v)
	{
		if (!json_is_integer(v) || json_integer_value(v) <= 0)
		{
			free(lit);
			console_answer_error(a, 400, "ids must be a list of dead letter ids");
			return NULL;
		}
		p += sprintf(p, "%s%lld", i ? "," : "", (long long) json_integer_value(v));
	}
	strcpy(p, "}");
	return lit;
}

/* A filter member as text, NULL when absent; false when not a string. */
static bool
filter_member(json_t *filter, const char *name, const char **out)
{
	json_t *v = json_object_get(filter, name);

	*out = v && !json_is_null(v) ? json_string_value(v) : NULL;
	return v == NULL || json_is_null(v) || json_is_string(v);
}

static void
act_on_many(console_request *r, console_answer *a, const char *action)
{
	json_t *body = console_body_object(r, a), *filter;
	bool replay = strcmp(action, "replay") == 0;
	const char *note = NULL;

	if (body == NULL)
		return;
	if (!replay && (note = body_note(body, a)) == NULL)
		return json_decref(body);
	if (json_object_get(body, "ids"))
	{
		char *lit = ids_literal(json_object_get(body, "ids"), a);
		const char *params[] = {lit, note};

		if (lit)
			console_answer_query(
				r, a,
				replay ? "SELECT json_build_object('count', "
						 "wal_delivery.replay_dead_letters_by_id($1::bigint[]))::text"
					   : "SELECT json_build_object('count', "
						 "wal_delivery.resolve_dead_letters_by_id($1::bigint[], $2))::text",
				replay ? 1 : 2, params);
		free(lit);
	}
	else if (json_is_object(filter = json_object_get(body, "filter")))
	{
		const char *topic, *destination, *since, *until;

		if (!filter_member(filter, "topic", &topic) ||
			!filter_member(filter, "destination", &destination) ||
			!filter_member(filter, "since", &since) || !filter_member(filter, "until", &until) ||
			json_object_size(filter) > 4 || (!replay && since != NULL))
			console_answer_error(a, 400,
								 "a bulk filter takes topic, destination, since (replay only) "
								 "and until, as strings");
		else if (replay)
		{
			const char *params[] = {destination, topic, since, until};

			console_answer_query(
				r, a,
				"SELECT json_build_object('count', wal_delivery.replay_dead_letters("
				"$1, $2, $3::timestamptz, $4::timestamptz))::text",
				4, params);
		}
		else
		{
			const char *params[] = {note, destination, topic, until};

			console_answer_query(
				r, a,
				"SELECT json_build_object('count', wal_delivery.resolve_dead_letters("
				"$1, $2, $3, $4::timestamptz))::text",
				4, params);
		}
	}
	else
		console_answer_error(a, 400, "send {\"ids\": [...]} or {\"filter\": {...}}");
	json_decref(body);
}

void
console_api_dead_letters(console_request *r, console_answer *a, const char *rest)
{
	bool get = strcmp(r->method, "GET") == 0;
	char id[24];
	const char *slash = strchr(rest, '/');
	size_t id_len = slash ? (size_t) (slash - rest) : strlen(rest);

	if (rest[0] == '\0')
		return get ? list(r, a) : console_answer_error(a, 405, "GET only");
	if (strcmp(rest, "count") == 0)
		return get ? count(r, a) : console_answer_error(a, 405, "GET only");
	if (strcmp(rest, "replay") == 0 || strcmp(rest, "resolve") == 0)
		return get ? console_answer_error(a, 405, "POST only") : act_on_many(r, a, rest);
	if (id_len == 0 || id_len >= sizeof(id))
		return console_answer_error(a, 404, "no such dead letter");
	memcpy(id, rest, id_len);
	id[id_len] = '\0';
	if (parse_id(id) == 0)
		return console_answer_error(a, 404, "no such dead letter");
	if (slash == NULL)
		return get ? show(r, a, id) : console_answer_error(a, 405, "GET only");
	if (strcmp(slash, "/payload") == 0)
		return get ? download(r, a, id) : console_answer_error(a, 405, "GET only");
	if (get)
		return console_answer_error(a, 405, "POST only");
	act_on_one(r, a, id, slash + 1);
}
