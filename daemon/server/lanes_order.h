/* The order rule's bookkeeping (lanes.h: a request never starts before
 * its client's earlier requests have started), in O(1) per request.
 *
 * Since a client's requests start one after another in receive order, at
 * most one of them at a time is free to go (queued ready in its lane, or
 * taken and not started yet): its oldest unstarted one. The others wait
 * here, in a list per client, in receive order; when the free one starts,
 * the next is handed back to be queued in its lane. A map keyed by client
 * holds, for each client with an unstarted request, how many it has and
 * its waiting list; the entry goes when the count falls to 0, so the map
 * holds the clients with requests in flight, not every client seen.
 *
 * The map keeps this O(1) per request: walking every lane's queue to count
 * a client's unstarted requests on each receipt, and again on each start
 * to release the later ones, is quadratic in a client's pipelined requests.
 *
 * Threads: none of its own; the caller (lanes.c) holds the lanes' mutex
 * around every call. Waiting jobs belong to the map until handed back. */
#ifndef PE_SERVER_LANES_ORDER_H
#define PE_SERVER_LANES_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/lanes.h"

typedef struct pe_order_slot pe_order_slot;

typedef struct pe_lanes_order {
  pe_order_slot *slots; /* open addressing, linear probing; client 0: empty */
  size_t cap, n;        /* cap a power of 2 */
} pe_lanes_order;

/* false: out of memory (nothing allocated). */
bool pe_lanes_order_init(pe_lanes_order *o);
/* Frees the map and every job still waiting in it. */
void pe_lanes_order_destroy(pe_lanes_order *o);

typedef enum pe_order_verdict {
  PE_ORDER_GO,   /* no earlier request of its client is unstarted: queue j ready */
  PE_ORDER_WAIT, /* kept here until the earlier ones have started */
  PE_ORDER_NOMEM /* the map could not grow: j is not recorded (drop it) */
} pe_order_verdict;

/* A request j of client j->client (non-zero) was received. */
pe_order_verdict pe_lanes_order_add(pe_lanes_order *o, pe_job *j);

/* The free request of client (non-zero) has started: the client's next
 * request, now free to go (the caller queues it ready), or NULL. */
pe_job *pe_lanes_order_started(pe_lanes_order *o, uint64_t client);

#endif
