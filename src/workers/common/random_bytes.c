/*
 * random_bytes.c: getrandom through a per-thread pool (see random_bytes.h), so that a key
 * or a span id costs a memcpy, not a system call (RAND_bytes was 8% of the ingest
 * server's time under load).
 */
#include "random_bytes.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "log.h"

void
random_bytes(unsigned char *out, size_t n)
{
	static __thread unsigned char pool[4096];
	static __thread size_t left;

	if (left < n)
	{
		size_t got = 0;

		while (got < sizeof(pool))
		{
			ssize_t k = getrandom(pool + got, sizeof(pool) - got, 0);

			if (k < 0 && errno != EINTR)
				fatal("event=random_failed msg=\"cannot draw random bytes\" error=\"%s\"",
					  strerror(errno));
			if (k > 0)
				got += (size_t) k;
		}
		left = sizeof(pool);
	}
	memcpy(out, pool + sizeof(pool) - left, n);
	left -= n;
}
