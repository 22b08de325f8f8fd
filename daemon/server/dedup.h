/* Reply cache keyed by (client id, request id): a REQ socket resends a
 * request after a reconnect, and a resend must never be applied twice
 * (architecture property 6).
 *
 *   begin(key)  NEW:     first sighting; the caller handles the request and
 *                        must call finish(key) with the reply.
 *               DONE:    a stored reply (a copy is returned): send it.
 *               WAITING: the same request is being handled right now; the
 *                        waiter is parked and finish() returns it, so the
 *                        caller of finish sends the reply to it too.
 *   finish(key) stores a copy of the reply and returns the parked waiters.
 *
 * Bounded: at most max_entries finished replies and max_bytes of reply
 * bytes; the oldest finished entries are evicted first (in-flight entries
 * are never evicted). A request whose reply was evicted would be applied
 * again if resent after that; the bounds are sized so that this needs
 * thousands of later requests in between (conf: dedup_entries/dedup_bytes).
 *
 * Client id 0 opts out (no caching). Thread-safe (one mutex). */
#ifndef PE_SERVER_DEDUP_H
#define PE_SERVER_DEDUP_H

#include <stddef.h>
#include <stdint.h>

typedef struct pe_dedup pe_dedup;

typedef enum pe_dedup_state { PE_DEDUP_NEW = 0, PE_DEDUP_DONE, PE_DEDUP_WAITING } pe_dedup_state;

/* NULL on out of memory. */
pe_dedup *pe_dedup_new(size_t max_entries, size_t max_bytes);
void pe_dedup_free(pe_dedup *d); /* parked waiters are not freed (caller's) */

/* DONE: *reply (*len bytes) is a malloc'd copy (caller frees). WAITING: waiter is
 * kept. On out of memory, NEW is returned without tracking (the request is
 * then handled as if never seen: a resend could apply twice, logged). */
pe_dedup_state pe_dedup_begin(pe_dedup *d, uint64_t client, uint64_t request, void *waiter,
                              uint8_t **reply, size_t *len);
/* Store the reply of a NEW request. *waiters (malloc'd, caller frees) gets
 * the parked waiters, *n_waiters their count. */
void pe_dedup_finish(pe_dedup *d, uint64_t client, uint64_t request, const uint8_t *reply,
                     size_t len, void ***waiters, int *n_waiters);
/* Forget every finished reply of one client (session expiry). */
void pe_dedup_forget_client(pe_dedup *d, uint64_t client);

typedef struct pe_dedup_stats {
  size_t entries, bytes, in_flight;
  uint64_t hits, waits, evictions;
} pe_dedup_stats;
void pe_dedup_stats_get(pe_dedup *d, pe_dedup_stats *out);
/* Change the bounds (SIGHUP); evicts down to them. */
void pe_dedup_set_limits(pe_dedup *d, size_t max_entries, size_t max_bytes);

#endif
