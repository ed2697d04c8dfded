/*
 * file_limit.c: raising the open-file limit (see file_limit.h).
 */
#include "file_limit.h"

#include <sys/resource.h>

long
file_limit_raise(long wanted)
{
	struct rlimit limit;

	if (getrlimit(RLIMIT_NOFILE, &limit) != 0)
		return 1024;
	if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < (rlim_t) wanted &&
		limit.rlim_cur < limit.rlim_max)
	{
		limit.rlim_cur = limit.rlim_max != RLIM_INFINITY && limit.rlim_max < (rlim_t) wanted
							 ? limit.rlim_max
							 : (rlim_t) wanted;
		if (setrlimit(RLIMIT_NOFILE, &limit) != 0)
			getrlimit(RLIMIT_NOFILE, &limit);
	}
	if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= (rlim_t) wanted)
		return wanted;
	return (long) limit.rlim_cur;
}
