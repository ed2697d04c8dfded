/*
 * console.c: `wal-worker console`, the on-call console: a page and a JSON API over the
 * control plane for the person woken by a dead-letter alert (see what fails, why, for
 * which destination; replay, resolve, pause, resume).
 *
 * It holds no database connection and no user list of its own: a person signs in with a
 * Postgres role and its password, and every query of theirs runs on a connection opened
 * as that role (console_signin.h, console_session.h), so Postgres's grants decide what
 * each one sees and does (wal_delivery_admin, wal_delivery_oncall, ...), and the SQL
 * functions audit each change under that login.
 */
#include <unistd.h>

#include "common/log.h"
#include "common/role_setup.h"
#include "common/sd_notify.h"
#include "common/stop_signal.h"
#include "console/console_http.h"
#include "console/console_session.h"
#include "console/console_signin.h"
#include "roles.h"

#define DEFAULT_LISTEN       "127.0.0.1:8090"
#define DEFAULT_IDLE_S       (30 * 60)
#define DEFAULT_MAX_AGE_S    (12 * 60 * 60)
#define DEFAULT_MAX_SESSIONS 64
#define LOOP_MS              200

int
run_console(const worker_options *opts)
{
	console_session_limits limits = {
		opts->session_idle_s > 0 ? opts->session_idle_s : DEFAULT_IDLE_S,
		opts->session_max_age_s > 0 ? opts->session_max_age_s : DEFAULT_MAX_AGE_S,
		opts->max_sessions > 0 ? opts->max_sessions : DEFAULT_MAX_SESSIONS};
	console_http_settings settings = {opts->listen ? opts->listen : DEFAULT_LISTEN,
									  opts->behind_tls, limits.idle_s, limits.max_age_s};
	admin_handlers handlers = {NULL, NULL, NULL};
	admin_server *admin = NULL;
	console_http *http;
	char errbuf[512];

	stop_on_signals();
	console_sessions_init(&limits);
	console_signin_init(opts->conninfo);
	if (!role_start_admin(opts, &handlers, &admin))
		return 1;
	http = console_http_start(&settings, errbuf, sizeof(errbuf));
	if (http == NULL)
	{
		log_error("event=listen_failed error=\"%s\"", errbuf);
		admin_server_stop(admin);
		return 1;
	}
	log_info("event=started listen=%s port=%d secure_cookie=%s idle_s=%d max_age_s=%d "
			 "max_sessions=%d",
			 settings.listen, console_http_port(http), settings.secure_cookie ? "yes" : "no",
			 limits.idle_s, limits.max_age_s, limits.max_sessions);
	while (!stop_requested)
	{
		sd_notify_loop();
		console_sessions_expire();
		usleep(LOOP_MS * 1000);
	}
	log_info("event=stopping");
	console_http_stop(http);
	console_sessions_end_all();
	admin_server_stop(admin);
	log_info("event=stopped");
	return 0;
}
