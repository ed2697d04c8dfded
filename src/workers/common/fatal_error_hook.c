/*
 * fatal_error_hook.c: the test-only fatal-error trigger (see fatal_error_hook.h).
 */
#include "fatal_error_hook.h"

#include <stdlib.h>
#include <unistd.h>

#include "common/log.h"

#define HOOK_ENV "WAL_TEST_FATAL_FILE"

void
fatal_error_hook_poll(rd_kafka_t *rk)
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
		return;
	log_warn("event=test_fatal_error_injected client=%s", rd_kafka_name(rk));
	rd_kafka_test_fatal_error(rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
							  "injected by the test hook (" HOOK_ENV ")");
}
