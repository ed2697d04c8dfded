/*
 * metric_value.h: for the test drivers in tests/c that read the worker's metrics
 * (common/metrics) as the admin server renders them.
 */
#ifndef TESTS_C_METRIC_VALUE_H
#define TESTS_C_METRIC_VALUE_H

#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"

/* The value of a rendered metric line that starts with `series` followed by a space; 0 if none. */
static inline double
metric_value(const char *series)
{
	char *text = metrics_render();
	const char *p = text;
	double v = 0;

	while (p && *p)
	{
		if (strncmp(p, series, strlen(series)) == 0 && p[strlen(series)] == ' ')
		{
			v = atof(p + strlen(series) + 1);
			break;
		}
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	free(text);
	return v;
}

#endif
