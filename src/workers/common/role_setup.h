/*
 * role_setup.h: set-up steps every wal-worker role takes the same way.
 */
#ifndef WAL_ROLE_SETUP_H
#define WAL_ROLE_SETUP_H

#include <stdbool.h>

#include "admin_server.h"
#include "options.h"

/*
 * Starts the admin server when --admin-port asks for one; without it *admin stays NULL.
 * False when the port cannot be listened on, logged as event=admin_server_failed: the
 * role then exits 1 rather than run without the endpoints its operator asked for.
 */
bool role_start_admin(const worker_options *opts, const admin_handlers *handlers,
					  admin_server **admin);

#endif
