/*
 * console_api.h: the console's JSON API. Every query runs on the signed-in person's own
 * connection (console_session.h), so their grants decide what they see and do; the
 * console adds no rule of its own. Postgres's errors become answers:
 *   42501 (insufficient privilege)                       403
 *   42704, P0002 (no such object)                        404
 *   55000 (not in a state for it)                        409
 *   22xxx, 23xxx (bad value, constraint)                 400
 *   57014 (statement timeout)                            503
 *   anything else                                        500
 * each as {"error": message, "sqlstate": code, "hint": hint}. A connection the server
 * closed ends the session (401: sign in again).
 *
 *   GET  /api/overview[?chart=no]           topics and destinations with their rates; the
 *                                           charts: dead letters per hour, deliveries per
 *                                           5 minutes (delivery_stats)
 *   GET  /api/dead-letters?FILTERS&before=ID&limit=N
 *                                           newest first, by keyset (id < before)
 *   GET  /api/dead-letters/count?FILTERS    how many match (for a bulk action's confirmation)
 *   GET  /api/dead-letters/ID               one entry, the payload as text or hex (64 KiB)
 *   GET  /api/dead-letters/ID/payload       the whole payload as a download
 *   POST /api/dead-letters/ID/replay        replay_dead_letter
 *   POST /api/dead-letters/ID/resolve       {"note"}: resolve_dead_letter
 *   POST /api/dead-letters/replay           {"ids": [...]} or {"filter": {...}}
 *   POST /api/dead-letters/resolve          the same with "note"
 *   GET  /api/destinations                  destination_status
 *   GET  /api/destinations/NAME             its status, retry steps, pause history, dead letters
 *   POST /api/destinations/NAME/pause       {"reason"}: hold_destination
 *   POST /api/destinations/NAME/resume      resume_destination
 *   GET  /api/archive?before_day=D&before_object=K&limit=N
 *                                           archive objects, newest day first, by keyset
 *   POST /api/archive/restore               {"object"}: restore_dead_letters
 *   GET  /api/audit?before=ID               the audit log, newest first
 * FILTERS: topic, destination, reason (a part of last_error), since, until (timestamps),
 * key (an idempotency key), state (unresolved, the default; resolved; all).
 */
#ifndef WAL_CONSOLE_API_H
#define WAL_CONSOLE_API_H

#include <libpq-fe.h>

#include "console/console_request.h"

#define CONSOLE_PAGE_MAX      200
#define CONSOLE_PAYLOAD_SHOWN 65536
#define CONSOLE_BULK_IDS_MAX  1000
/* Unresolved dead letters per topic are counted up to this (console_api_overview). */
#define CONSOLE_COUNT_CAP "10001"
/* The overview's delivery charts cover this many hours, per 5 minutes. */
#define CONSOLE_CHART_HOURS "6"

/* r->session is set (signed in); POSTs passed the CSRF and Origin checks. */
void console_api_dispatch(console_request *r, console_answer *a);

/*
 * Runs sql with text params on the session's connection. The result, or NULL with the
 * error answered as above. The caller PQclears it.
 */
PGresult *console_query(console_request *r, console_answer *a, const char *sql, int n_params,
						const char *const *params);

/* Runs sql, which returns one JSON text, and answers it with 200 (or 404 when NULL). */
void console_answer_query(console_request *r, console_answer *a, const char *sql, int n_params,
						  const char *const *params);

/* The handlers, by page (console_api_dead_letters.c, console_api_status.c). */
void console_api_dead_letters(console_request *r, console_answer *a, const char *rest);
void console_api_overview(console_request *r, console_answer *a);
void console_api_destinations(console_request *r, console_answer *a, const char *rest);
void console_api_archive(console_request *r, console_answer *a, const char *rest);
void console_api_audit(console_request *r, console_answer *a);

#endif
