/*
 * random_bytes.h: random bytes from the kernel for what must not be guessed or repeat:
 * ingest's generated idempotency keys and each delivery attempt's span id.
 */
#ifndef WAL_RANDOM_BYTES_H
#define WAL_RANDOM_BYTES_H

#include <stddef.h>

/* Fills out with n bytes (n at most 4096); exits the worker if the kernel cannot give any. */
void random_bytes(unsigned char *out, size_t n);

#endif
