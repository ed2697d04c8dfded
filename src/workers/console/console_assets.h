/*
 * console_assets.h: the console's page (web/: index.html, app.js, app.css), built into
 * the binary by embed_web.sh (the Makefile's build/workers/console/web_assets.c), so the
 * console serves exactly the page it was built with and reads no file at run time.
 */
#ifndef WAL_CONSOLE_ASSETS_H
#define WAL_CONSOLE_ASSETS_H

#include <stddef.h>

typedef struct
{
	const char *path; /* "/app.js" */
	const char *content_type;
	const unsigned char *data;
	size_t len;
} console_asset;

/* Ends with a NULL path. */
extern const console_asset console_assets[];

/* The asset served at path ("/" is /index.html), or NULL. */
const console_asset *console_asset_find(const char *path);

#endif
