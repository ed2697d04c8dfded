/*
 * console_api_status.c: the status endpoints of the console's API (console_api.h): the
 * overview, destinations with pause and resume, the archive and the audit log.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console/console_api.h"

/*
 * The overview. Unresolved dead letters are counted up to CONSOLE_COUNT_CAP per topic
 * (the page shows more as "10,000+"): past that the number changes nothing on-call
 * does, and counting a million entries on every refresh would. Rates come from
 * delivery_stats (topic_status, delivery_rates: the last hour of minutes). The charts
 * are left out with chart=no, which the page sends on most refreshes: dead letters per
 * topic and hour over 24 hours (failed_at's index), and deliveries, failed attempts and
 * dead-lettered copies per topic and 5 minutes over CONSOLE_CHART_HOURS hours
 * (delivery_stats's primary key, minutes first).
 */
void
console_api_overview(console_request *r, console_answer *a)
{
	char chart[8];
	int got = console_query_arg(r, "chart", chart, sizeof(chart));
	const char *params[] = {got > 0 && strcmp(chart, "no") == 0 ? "f" : "t"};

	if (strcmp(r->method, "GET") != 0)
		return console_answer_error(a, 405, "GET only");
	console_answer_query(
		r, a,
		"SELECT json_build_object('now', now(), 'count_cap', " CONSOLE_COUNT_CAP ","
		" 'chart_hours', " CONSOLE_CHART_HOURS ","
		" 'topics', (SELECT coalesce(json_agg(json_build_object("
		"   'topic', t.topic, 'waiting', t.waiting, 'oldest_waiting_age', t.oldest_waiting_age,"
		"   'delivered_5m', t.delivered_5m, 'failed_5m', t.failed_5m,"
		"   'dead_lettered_5m', t.dead_lettered_5m,"
		"   'delivered_per_second', t.delivered_per_second,"
		"   'failed_last_hour', t.failed_last_hour,"
		"   'dead_letters_last_hour', t.dead_letters_last_hour,"
		"   'unresolved_dead_letters', (SELECT count(*) FROM (SELECT 1 FROM"
		"     wal_delivery.dead_letters d WHERE d.topic = t.topic AND d.resolved_at IS NULL"
		"     LIMIT " CONSOLE_COUNT_CAP ") c)) ORDER BY t.topic), '[]')"
		"   FROM wal_delivery.topic_status t),"
		" 'destinations', (SELECT coalesce(json_agg(json_build_object("
		"   'destination', s.destination, 'breaker', s.breaker, 'since', s.since,"
		"   'next_probe_at', s.next_probe_at, 'pause_reason', left(s.pause_reason, 300),"
		"   'backlog', s.backlog, 'consecutive_failures', s.consecutive_failures,"
		"   'delivered', s.delivered, 'failed', s.failed, 'last_error', left(s.last_error, 300),"
		"   'last_error_at', s.last_error_at, 'last_success_at', s.last_success_at,"
		"   'delivered_5m', coalesce(dr.delivered_5m, 0), 'failed_5m', coalesce(dr.failed_5m, 0),"
		"   'delivered_per_second', round(coalesce(dr.delivered_5m / dr.window_seconds, 0), 3),"
		"   'failed_last_hour', coalesce(dr.failed_last_hour, 0),"
		"   'dead_lettered_last_hour', coalesce(dr.dead_lettered_last_hour, 0))"
		"   ORDER BY s.destination), '[]') FROM wal_delivery.destination_status s"
		"   LEFT JOIN (SELECT destination, sum(delivered_5m) AS delivered_5m,"
		"     sum(failed_5m) AS failed_5m, sum(failed_last_hour) AS failed_last_hour,"
		"     sum(dead_lettered_last_hour) AS dead_lettered_last_hour,"
		"     max(window_seconds) AS window_seconds"
		"     FROM wal_delivery.delivery_rates GROUP BY destination) dr"
		"   ON dr.destination = s.destination),"
		" 'dead_letters_per_hour', CASE WHEN $1::boolean THEN (SELECT"
		"   coalesce(json_agg(h ORDER BY h.hour, h.topic), '[]')"
		"   FROM (SELECT date_trunc('hour', failed_at) AS hour, topic, count(*) AS dead_letters"
		"           FROM wal_delivery.dead_letters"
		"          WHERE failed_at >= date_trunc('hour', now()) - interval '23 hours'"
		"          GROUP BY 1, 2) h) END,"
		" 'deliveries_per_5_minutes', CASE WHEN $1::boolean THEN (SELECT"
		"   coalesce(json_agg(b ORDER BY b.at, b.topic), '[]')"
		"   FROM (SELECT date_bin('5 minutes', minute, timestamptz '2000-01-01 00:00Z') AS at,"
		"                topic, sum(delivered) AS delivered, sum(failed) AS failed,"
		"                sum(dead_lettered) AS dead_lettered"
		"           FROM wal_delivery.delivery_stats"
		"          WHERE minute >= date_bin('5 minutes', now(), timestamptz '2000-01-01 00:00Z')"
		"                - interval '" CONSOLE_CHART_HOURS " hours' + interval '5 minutes'"
		"          GROUP BY 1, 2) b) END)::text",
		1, params);
}

/* A destination name as the control plane allows it, so it can stand in a path. */
static bool
destination_name_ok(const char *s, size_t n)
{
	if (n == 0 || n > 100)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
			  (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
			return false;
	return true;
}

static void
destination_page(console_request *r, console_answer *a, const char *name)
{
	const char *params[] = {name};

	console_answer_query(
		r, a,
		"SELECT json_build_object('status', row_to_json(s),"
		" 'pause', (SELECT row_to_json(p) FROM wal_delivery.destination_pauses p"
		"           WHERE p.destination = $1),"
		" 'steps', (SELECT coalesce(json_agg(st ORDER BY st.step), '[]')"
		"           FROM wal_delivery.destination_step_stats st WHERE st.destination = $1),"
		" 'history', (SELECT coalesce(json_agg(h ORDER BY h.id DESC), '[]') FROM ("
		"     SELECT id, at, who, action, target, count FROM wal_delivery.audit_log"
		"      WHERE target->>'destination' = $1 ORDER BY id DESC LIMIT 50) h),"
		" 'dead_letters', (SELECT coalesce(json_agg(d ORDER BY d.id DESC), '[]') FROM ("
		"     SELECT id, topic, idempotency_key, attempts, left(last_error, 300) AS last_error,"
		"            failed_at, resolved_at FROM wal_delivery.dead_letters"
		"      WHERE destination = $1 ORDER BY id DESC LIMIT 20) d))::text"
		" FROM wal_delivery.destination_status s WHERE s.destination = $1",
		1, params);
}

void
console_api_destinations(console_request *r, console_answer *a, const char *rest)
{
	bool get = strcmp(r->method, "GET") == 0;
	const char *slash = strchr(rest, '/');
	size_t n = slash ? (size_t) (slash - rest) : strlen(rest);
	char name[101];
	json_t *body;

	if (rest[0] == '\0')
	{
		if (!get)
			return console_answer_error(a, 405, "GET only");
		return console_answer_query(
			r, a,
			"SELECT coalesce(json_agg(d ORDER BY d.destination), '[]')::text"
			" FROM wal_delivery.destination_status d",
			0, NULL);
	}
	if (!destination_name_ok(rest, n))
		return console_answer_error(a, 404, "no such destination");
	memcpy(name, rest, n);
	name[n] = '\0';
	if (slash == NULL)
		return get ? destination_page(r, a, name) : console_answer_error(a, 405, "GET only");
	if (get)
		return console_answer_error(a, 405, "POST only");
	if (strcmp(slash, "/resume") == 0)
	{
		const char *params[] = {name};

		return console_answer_query(
			r, a, "SELECT json_build_object('changed', wal_delivery.resume_destination($1))::text",
			1, params);
	}
	if (strcmp(slash, "/pause") != 0)
		return console_answer_error(a, 404, "no such action: pause or resume");
	if ((body = console_body_object(r, a)) == NULL)
		return;
	{
		json_t *reason = json_object_get(body, "reason");
		const char *params[] = {name, json_string_value(reason)};

		if (reason != NULL && !json_is_string(reason))
			console_answer_error(a, 400, "reason must be a string");
		else
			console_answer_query(
				r, a,
				"SELECT json_build_object('changed', wal_delivery.hold_destination($1, $2))::text",
				2, params);
	}
	json_decref(body);
}

/*
 * The archive's objects, newest day first, by keyset: the next page starts after the
 * last (day, object) shown (before_day and before_object), read from archive_objects's
 * (day, object) index however deep.
 */
static void
archive_list(console_request *r, console_answer *a)
{
	char day[32], object[1024], limit[16];
	int got_day = console_query_arg(r, "before_day", day, sizeof(day));
	int got_object = console_query_arg(r, "before_object", object, sizeof(object));
	int got_limit = console_query_arg(r, "limit", limit, sizeof(limit));
	char *end;
	long n = got_limit > 0 ? strtol(limit, &end, 10) : 100;
	const char *params[3];

	if (got_day < 0 || got_object < 0 || (got_day > 0) != (got_object > 0))
		return console_answer_error(a, 400,
									"send before_day and before_object together: the last "
									"object shown and its day");
	if (got_limit < 0 || (got_limit > 0 && (*end != '\0' || n < 1 || n > CONSOLE_PAGE_MAX)))
		return console_answer_error(a, 400, "limit must be 1 to %d", CONSOLE_PAGE_MAX);
	snprintf(limit, sizeof(limit), "%ld", n);
	params[0] = got_day > 0 ? day : NULL;
	params[1] = got_object > 0 ? object : NULL;
	params[2] = limit;
	console_answer_query(
		r, a,
		"SELECT json_build_object('objects', coalesce(json_agg(o ORDER BY o.day DESC,"
		" o.object DESC), '[]'), 'next', CASE WHEN count(*) = $3::int THEN (array_agg("
		" json_build_object('day', o.day, 'object', o.object) ORDER BY o.day, o.object))[1]"
		" END)::text FROM ("
		" SELECT * FROM wal_delivery.archive_objects"
		"  WHERE $1::date IS NULL OR (day, object) < ($1::date, $2::text)"
		"  ORDER BY day DESC, object DESC LIMIT $3::int) o",
		3, params);
}

void
console_api_archive(console_request *r, console_answer *a, const char *rest)
{
	bool get = strcmp(r->method, "GET") == 0;
	json_t *body, *object;

	if (rest[0] == '\0')
		return get ? archive_list(r, a) : console_answer_error(a, 405, "GET only");
	if (strcmp(rest, "restore") != 0)
		return console_answer_error(a, 404, "no such endpoint");
	if (get)
		return console_answer_error(a, 405, "POST only");
	if ((body = console_body_object(r, a)) == NULL)
		return;
	object = json_object_get(body, "object");
	if (!json_is_string(object))
		console_answer_error(a, 400, "send {\"object\": \"the archive object's key\"}");
	else
	{
		const char *params[] = {json_string_value(object)};

		console_answer_query(
			r, a, "SELECT row_to_json(x)::text FROM wal_delivery.restore_dead_letters($1) x", 1,
			params);
	}
	json_decref(body);
}

void
console_api_audit(console_request *r, console_answer *a)
{
	char before[32];
	int got = console_query_arg(r, "before", before, sizeof(before));
	const char *params[] = {got > 0 ? before : NULL};

	if (got < 0)
		return console_answer_error(a, 400, "before must be an audit entry id");
	console_answer_query(
		r, a,
		"SELECT json_build_object('entries', coalesce(json_agg(x ORDER BY x.id DESC), '[]'),"
		" 'next_before', CASE WHEN count(*) = 100 THEN min(x.id) END)::text FROM ("
		" SELECT id, at, who, action, target, count FROM wal_delivery.audit_log"
		"  WHERE ($1::bigint IS NULL OR id < $1) ORDER BY id DESC LIMIT 100) x",
		1, params);
}
