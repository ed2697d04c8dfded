/*
 * otlp_sender.h: the relay's span export over OTLP/HTTP (wal_delivery.otlp_endpoint).
 *
 * A relay is a background worker: no threads. Its finished spans go into a bounded buffer
 * in its own memory (the newest is dropped, and counted, when it is full), and one
 * request at a time is sent with libcurl's multi interface, driven without waiting from
 * the relay's loop (otlp_sender_drive), so a slow, hung or down collector never holds up a
 * pass: it costs dropped spans and a counter. The counters are in shared memory, summed
 * over the relays, for wal_delivery.relay_span_export().
 */
#ifndef OTLP_SENDER_H
#define OTLP_SENDER_H

#include "postgres.h"

#include "shared/otlp_span.h"

#define RELAY_SPAN_BUFFER 2048 /* spans waiting; a newer one is dropped when it is full */
#define RELAY_SPAN_BATCH  512  /* spans per request */

void otlp_sender_request_shmem(void);
void otlp_sender_init_shmem(void);

/*
 * Whether spans are exported: wal_delivery.otlp_endpoint is set. Read per record, so it
 * is a plain variable; otlp_sender_configure sets it.
 */
extern bool otlp_sender_enabled;

/*
 * Takes the setting (at start and after each reload): a changed endpoint abandons the
 * request in flight and the spans waiting (counted as dropped), an empty one turns the
 * export off and frees the buffer.
 */
void otlp_sender_configure(const char *endpoint);

/* Copies a finished span into the buffer, or drops and counts it when the buffer is full. */
void otlp_sender_add(const otlp_span *span);

/*
 * Moves the export on without waiting: reaps a finished request, starts the next when a
 * batch is full or its oldest span has waited a second. Returns how soon (ms) it wants to
 * be driven again, or -1 when nothing is waiting.
 */
int otlp_sender_drive(void);

/* At the relay's exit: what is still waiting is dropped and counted, nothing is sent. */
void otlp_sender_discard(void);

#endif
