/*
 * console_assets.c: see console_assets.h.
 */
#include "console/console_assets.h"

#include <string.h>

const console_asset *
console_asset_find(const char *path)
{
	if (strcmp(path, "/") == 0)
		path = "/index.html";
	for (const console_asset *a = console_assets; a->path != NULL; a++)
		if (strcmp(a->path, path) == 0)
			return a;
	return NULL;
}
