/*
 * dedupe_check.c: a test driver for common/dedupe (tests/integration/test_dedupe.py).
 * Runs fixed scenarios and prints one "name ok" or "name FAILED: why" line each; exits 1
 * if any failed. Also prints the process's RSS after creating a large set and after
 * filling it, so the test can check the footprint does not grow as the set fills.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consume/dedupe.h"

static int failures = 0;

static void
check(const char *name, bool ok, const char *why)
{
	printf("%s %s%s%s\n", name, ok ? "ok" : "FAILED: ", ok ? "" : why, "");
	failures += !ok;
}

static long
rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;

	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, "VmRSS:", 6) == 0)
			kb = strtol(line + 6, NULL, 10);
	if (f)
		fclose(f);
	return kb;
}

int
main(void)
{
	dedupe_set *s = dedupe_new(3, 1000);
	char key[64];
	long before, after;

	/* Pairs are (key, destination): the same key for another destination is not seen. */
	dedupe_remember(s, "k1", "a", 0);
	check("remembered", dedupe_seen(s, "k1", "a", 1), "k1/a not seen");
	check("other_destination", !dedupe_seen(s, "k1", "b", 1), "k1/b seen");
	check("no_concatenation_clash", !dedupe_seen(s, "k", "1a", 1), "k/1a seen as k1/a");
	{
		/* A record is (topic, key): the same key on another topic is another record. */
		dedupe_pair on_a = dedupe_hash_pair(dedupe_hash_record("topic.a", "order-42"), "d");
		dedupe_pair on_b = dedupe_hash_pair(dedupe_hash_record("topic.b", "order-42"), "d");
		dedupe_pair split = dedupe_hash_pair(dedupe_hash_record("topic.", "aorder-42"), "d");
		dedupe_set *t = dedupe_new(4, 1000);

		dedupe_remember_pair(t, on_a, 0);
		check("key_per_topic",
			  dedupe_seen_pair(t, on_a, 1) && !dedupe_seen_pair(t, on_b, 1) &&
				  !dedupe_seen_pair(t, split, 1),
			  "the same key on another topic was seen");
		dedupe_free(t);
	}
	dedupe_remember(s, "k1", "a", 2);
	check("no_double_entry", dedupe_size(s) == 1, "remembering twice added twice");
	/* TTL: gone at 1000 ms after it was remembered. */
	check("expires", !dedupe_seen(s, "k1", "a", 1000) && dedupe_size(s) == 0, "still there");
	/* Cap: the oldest goes first. */
	dedupe_remember(s, "k1", "a", 10);
	dedupe_remember(s, "k2", "a", 11);
	dedupe_remember(s, "k3", "a", 12);
	dedupe_remember(s, "k4", "a", 13);
	check("cap_evicts_oldest",
		  !dedupe_seen(s, "k1", "a", 14) && dedupe_seen(s, "k2", "a", 14) &&
			  dedupe_seen(s, "k4", "a", 14) && dedupe_size(s) == 3,
		  "wrong entries after the cap");
	dedupe_set_ttl(s, 0);
	dedupe_remember(s, "k9", "a", 15);
	check("ttl_zero_remembers_nothing", !dedupe_seen(s, "k9", "a", 16), "k9 remembered");
	dedupe_free(s);

	/* Many entries through a small set: every recent one is found, evicted ones are not. */
	s = dedupe_new(1000, 1000000);
	for (int i = 0; i < 100000; i++)
	{
		snprintf(key, sizeof(key), "key-%d", i);
		dedupe_remember(s, key, "dest", i);
	}
	{
		int found = 0, stale = 0;

		for (int i = 99000; i < 100000; i++)
		{
			snprintf(key, sizeof(key), "key-%d", i);
			found += dedupe_seen(s, key, "dest", 100000);
		}
		for (int i = 0; i < 99000; i++)
		{
			snprintf(key, sizeof(key), "key-%d", i);
			stale += dedupe_seen(s, key, "dest", 100000);
		}
		check("recent_found", found == 1000, "a recent entry was lost");
		check("evicted_gone", stale == 0, "an evicted entry was found");
	}
	dedupe_free(s);

	/* Footprint: allocated up front, so filling it costs no memory. */
	s = dedupe_new(200000, 1000000);
	before = rss_kb();
	for (int i = 0; i < 400000; i++)
	{
		snprintf(key, sizeof(key), "fill-%d", i);
		dedupe_remember(s, key, "dest", i);
	}
	after = rss_kb();
	printf("rss_kb_empty %ld\nrss_kb_full %ld\n", before, after);
	check("flat_footprint", after - before < 256, "RSS grew while filling");
	dedupe_free(s);
	return failures ? 1 : 0;
}
