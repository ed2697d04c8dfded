/*
 * ingest_fault_hook.c: the test-only fatal-error trigger (see ingest_fault_hook.h).
 */
#include "ingest_fault_hook.h"

#include <stdlib.h>
#include <unistd.h>

#include "common/log.h"

#define HOOK_ENV "WAL_INGEST_TEST_FATAL_FILE"

bool
ingest_fault_hook_due(void)
{
	static int state = -1; /* -1 not read yet, 0 off, 1 on */
	static const char *path;

	if (state < 0)
	{
		path = getenv(HOOK_ENV);
		state = path != NULL && path[0] != '\0';
		if (state)
			log_warn("event=test_hook_enabled hook=fatal_error file=\"%s\" msg=\"for tests only\"",
					 path);
	}
	if (!state || unlink(path) != 0)
		return false;
	log_warn("event=test_fatal_error_injected");
	return true;
}
