/* Reply cache keyed by (client id, request id): a client resends a request
 * it got no reply to (its resend interval, or nanomsg after a reconnect), and
 * a resend must never be applied twice.
 *
 * Every copy of a request carries its receive sequence number (the main
 * thread numbers messages as they come off the socket), and the replies for
 * one key go out in that order: never to an older copy after a newer one.
 * Copies from one REQ socket need this: the socket accepts the reply to the
 * last copy it sent, and nanomsg 1.1.5 frees a stored reply when a reply to
 * an older copy arrives after it (nn_req_in; the client then aborts in
 * nn_recv). Copies from different sockets each get their reply.
 *
 *   begin(key, seq, job)
 *     NEW:      first sighting; the caller handles the request and calls
 *               finish(key) with the reply.
 *     DONE:     already answered; the stored reply is sent to job (send()
 *               under the cache's lock). The caller frees the job.
 *     WAITING:  the request is being handled right now: job is parked.
 *     STALE:    answered already, and a newer copy got its reply before this
 *               one was looked at (request threads take copies out of order):
 *               not answered (its client resends if it still waits); the
 *               caller frees the job.
 *   finish(key, seq, job, reply) stores a copy of the reply and sends it to
 *     job and every parked copy in receive order (under the lock); the
 *     parked copies are handed back for the caller to free.
 *
 * send() runs with the cache's mutex held, so it must only queue the bytes
 * (the server's queue_reply), never block on the socket.
 *
 * Bounded: at most max_entries finished replies and max_bytes of reply
 * bytes; the oldest finished entries are evicted first (in-flight entries
 * are never evicted). A request whose reply was evicted would be applied
 * again if resent after that; the bounds are sized so that this needs
 * thousands of later requests in between (conf: dedup_entries/dedup_bytes).
 *
 * Client id 0 opts out (no caching; finish sends to job). Thread-safe (one
 * mutex). */
#ifndef PE_SERVER_REPLY_CACHE_H
#define PE_SERVER_REPLY_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct pe_reply_cache pe_reply_cache;

typedef enum pe_reply_cache_state {
  PE_DEDUP_NEW = 0,
  PE_DEDUP_DONE,
  PE_DEDUP_WAITING,
  PE_DEDUP_STALE
} pe_reply_cache_state;

/* One copy of a request: its receive number and the caller's job. */
typedef struct pe_reply_cache_copy {
  uint64_t seq;
  void *job;
} pe_reply_cache_copy;

/* Queue reply (len bytes, the caller keeps them) for the copy job. */
typedef void (*pe_reply_cache_send_fn)(void *ctx, void *job, const uint8_t *reply, size_t len);

/* NULL on out of memory. */
pe_reply_cache *pe_reply_cache_new(size_t max_entries, size_t max_bytes, pe_reply_cache_send_fn send, void *ctx);
void pe_reply_cache_free(pe_reply_cache *d); /* parked copies are not freed (caller's) */

/* seq: the copy's receive number, increasing in arrival order. On out of
 * memory NEW is returned without tracking (a resend could then apply twice),
 * or, for a copy that cannot be parked, STALE. */
pe_reply_cache_state pe_reply_cache_begin(pe_reply_cache *d, uint64_t client, uint64_t request, uint64_t seq,
                              void *job);
/* The reply to a NEW request (job, seq: the copy begin returned NEW for).
 * *parked (malloc'd, caller frees it and the jobs) gets the parked copies,
 * already answered; returns their count. */
int pe_reply_cache_finish(pe_reply_cache *d, uint64_t client, uint64_t request, uint64_t seq, void *job,
                    const uint8_t *reply, size_t len, pe_reply_cache_copy **parked);
/* Forget every finished reply of one client (session expiry). */
void pe_reply_cache_forget_client(pe_reply_cache *d, uint64_t client);

typedef struct pe_reply_cache_stats {
  size_t entries, bytes, in_flight;
  uint64_t hits;      /* copies answered from a stored reply */
  uint64_t waits;     /* copies parked behind the original */
  uint64_t stale;     /* copies not answered: a newer copy was answered first */
  uint64_t evictions;
} pe_reply_cache_stats;
void pe_reply_cache_stats_get(pe_reply_cache *d, pe_reply_cache_stats *out);
/* Change the bounds (SIGHUP); evicts down to them. */
void pe_reply_cache_set_limits(pe_reply_cache *d, size_t max_entries, size_t max_bytes);

#endif
