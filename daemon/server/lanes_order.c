/* The order rule's map of clients with unstarted requests (lanes_order.h). */
#include "server/lanes_order.h"

#include <stdlib.h>

#define MIN_CAP 64

struct pe_order_slot {
  uint64_t client;     /* 0: empty */
  int unstarted;       /* the free request (1), plus the waiting ones */
  pe_job *head, *tail; /* waiting, in receive order (linked by next) */
};

/* Client ids are random 64-bit values, or small ones in tests: mixed
 * (the splitmix64 finalizer) so that either spreads over the slots. */
static size_t home(const pe_lanes_order *o, uint64_t c) {
  c ^= c >> 30;
  c *= 0xbf58476d1ce4e5b9ull;
  c ^= c >> 27;
  c *= 0x94d049bb133111ebull;
  c ^= c >> 31;
  return (size_t)c & (o->cap - 1);
}

/* The slot of client, or the empty slot where it would go. */
static pe_order_slot *find(const pe_lanes_order *o, uint64_t client) {
  size_t i = home(o, client);
  while (o->slots[i].client && o->slots[i].client != client) i = (i + 1) & (o->cap - 1);
  return &o->slots[i];
}

bool pe_lanes_order_init(pe_lanes_order *o) {
  o->cap = MIN_CAP;
  o->n = 0;
  o->slots = calloc(o->cap, sizeof *o->slots);
  return o->slots != NULL;
}

void pe_lanes_order_destroy(pe_lanes_order *o) {
  for (size_t i = 0; o->slots && i < o->cap; i++)
    while (o->slots[i].head) {
      pe_job *j = o->slots[i].head;
      o->slots[i].head = j->next;
      pe_job_free(j);
    }
  free(o->slots);
  o->slots = NULL;
}

/* Double the slots; false: no memory (the map is unchanged). */
static bool grow(pe_lanes_order *o) {
  pe_lanes_order bigger = {.cap = o->cap * 2, .n = o->n};
  bigger.slots = calloc(bigger.cap, sizeof *bigger.slots);
  if (!bigger.slots) return false;
  for (size_t i = 0; i < o->cap; i++)
    if (o->slots[i].client) *find(&bigger, o->slots[i].client) = o->slots[i];
  free(o->slots);
  *o = bigger;
  return true;
}

pe_order_verdict pe_lanes_order_add(pe_lanes_order *o, pe_job *j) {
  pe_order_slot *s = find(o, j->client);
  if (!s->client) {
    /* A new client: keep the load under 3/4; short of memory, go on while
     * a slot stays empty (probing ends at one). */
    if (4 * (o->n + 1) > 3 * o->cap && !grow(o) && o->n + 2 > o->cap) return PE_ORDER_NOMEM;
    s = find(o, j->client);
    *s = (pe_order_slot){.client = j->client};
    o->n++;
  }
  j->next = NULL;
  if (s->unstarted++ == 0) return PE_ORDER_GO;
  if (s->tail)
    s->tail->next = j;
  else
    s->head = j;
  s->tail = j;
  return PE_ORDER_WAIT;
}

/* Empty slot i, moving back the entries after it that probed past it
 * (deletion without tombstones). */
static void remove_at(pe_lanes_order *o, size_t i) {
  size_t mask = o->cap - 1;
  for (size_t k = (i + 1) & mask; o->slots[k].client; k = (k + 1) & mask) {
    size_t h = home(o, o->slots[k].client);
    /* k's entry may fill i if its home is not within (i, k] (cyclically). */
    if (((k - h) & mask) >= ((k - i) & mask)) {
      o->slots[i] = o->slots[k];
      i = k;
    }
  }
  o->slots[i] = (pe_order_slot){0};
  o->n--;
}

pe_job *pe_lanes_order_started(pe_lanes_order *o, uint64_t client) {
  pe_order_slot *s = find(o, client);
  if (!s->client) return NULL; /* cannot happen: its free request was added */
  if (--s->unstarted == 0) {
    remove_at(o, (size_t)(s - o->slots));
    return NULL;
  }
  pe_job *j = s->head;
  s->head = j->next;
  if (!s->head) s->tail = NULL;
  j->next = NULL;
  return j;
}
