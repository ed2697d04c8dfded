/*
 * role_setup.c: see role_setup.h.
 */
#include "role_setup.h"

#include <stdlib.h>

#include "log.h"

bool
role_start_admin(const worker_options *opts, const admin_handlers *handlers, admin_server **admin)
{
	/* The token peers send (config_watch) is the token this server asks of them. */
	admin_listen listen = {opts->admin_listen, opts->admin_port, getenv("WAL_PEER_TOKEN")};
	char errbuf[512];

	*admin = NULL;
	if (opts->admin_port < 0)
		return true;
	*admin = admin_server_start(&listen, handlers, errbuf, sizeof(errbuf));
	if (*admin == NULL)
	{
		log_error("event=admin_server_failed msg=\"%s\"", errbuf);
		return false;
	}
	log_info("event=admin_server_started address=%s port=%d config=%s",
			 opts->admin_listen ? opts->admin_listen : "127.0.0.1", admin_server_port(*admin),
			 listen.config_token && listen.config_token[0] ? "served-with-token" : "not-served");
	return true;
}
