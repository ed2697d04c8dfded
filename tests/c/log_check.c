/*
 * log_check.c: writes events whose values are hostile (line breaks, quotes, a forged
 * "level=error event=forged" field, control bytes) through the workers' logger, plus
 * numbers of every width the workers log, and lines about a record (log_record);
 * test_log.py reads stderr back.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "common/log.h"

int
main(void)
{
	const char *forged = "k\nlevel=error event=forged";
	const char *quote = "a\" event=forged b=\"";
	const char *volatile missing = NULL; /* volatile: keeps -Wformat-overflow quiet */
	const char *libpq_error = "FATAL:  database \"x\" does not exist\nDETAIL: second line\r\n";

	log_set_role("check");
	log_info("event=hostile_key key=%s", forged);
	log_info("event=hostile_quoted key=\"%s\"", quote);
	log_warn("event=libpq_error error=\"%s\"", libpq_error);
	log_info("event=bare_with_space value=%s", "two words");
	log_info("event=control_bytes value=%s", "a\x01\x1b[31mred\x7f");
	log_info("event=empty value=%s", "");
	log_info("event=null value=%s", missing);
	log_info("event=precision value=%.*s", 3, "abcdef");
	log_info("event=numbers i=%d l=%ld z=%zu i64=%" PRId64 " g=%g f=%.0f pct=100%%", -7,
			 12345678901L, (size_t) 42, INT64_C(-9000000000), 0.5, 2.6);
	log_info("event=not_utf8 value=%s text=\"%s\"",
			 "a\xff\xc3"
			 "(b",
			 "ok \xc3\xa9 \xe2\x82");
	{
		static char huge[20000];

		memset(huge, 'k', sizeof(huge) - 1);
		log_info("event=huge_values a=%s b=\"%s\" c=%s d=\"%s\" e=%s f=\"%s\" g=%s h=\"%s\" "
				 "i=%s j=\"%s\" after=%s",
				 huge, huge, huge, huge, huge, huge, huge, huge, huge, huge, "end");
	}
	log_info("event=plain value=%s", "simple");
	/* A line about a record: its topic, key and trace id after the event's fields. */
	log_record(LOG_WARN, "orders.events", forged, "4bf92f3577b34da6a3ce929d0e0e4736",
			   "event=about_record destination=%s error=\"%s\"", "billing", quote);
	log_record(LOG_INFO, "orders.events", "k 1", NULL, "event=untraced_record");
	return 0;
}
