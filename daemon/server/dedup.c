/* Reply cache (see dedup.h): a chained hash table on (client, request) plus
 * a FIFO list of finished entries for eviction. */
#include "server/dedup.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
  uint64_t client, request;
  bool done;
  uint8_t *reply;
  size_t len;
  void **waiters;
  int n_waiters, cap_waiters;
  struct entry *chain;                 /* hash bucket */
  struct entry *fifo_prev, *fifo_next; /* finished entries, oldest first */
} entry;

struct pe_dedup {
  pthread_mutex_t mu;
  entry **buckets;
  size_t n_buckets; /* power of two */
  entry *oldest, *newest;
  size_t max_entries, max_bytes;
  pe_dedup_stats st;
};

static size_t hash_key(uint64_t c, uint64_t r) {
  uint64_t h = c * 0x9E3779B97F4A7C15ull ^ (r + 0x632BE59BD9B4E019ull + (c << 6) + (c >> 2));
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return (size_t)h;
}

pe_dedup *pe_dedup_new(size_t max_entries, size_t max_bytes) {
  pe_dedup *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->n_buckets = 1024;
  while (d->n_buckets < max_entries && d->n_buckets < (1u << 22)) d->n_buckets *= 2;
  d->buckets = calloc(d->n_buckets, sizeof *d->buckets);
  if (!d->buckets) {
    free(d);
    return NULL;
  }
  pthread_mutex_init(&d->mu, NULL);
  d->max_entries = max_entries ? max_entries : 1;
  d->max_bytes = max_bytes;
  return d;
}

static void entry_free(entry *e) {
  free(e->reply);
  free(e->waiters);
  free(e);
}

void pe_dedup_free(pe_dedup *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n_buckets; i++) {
    entry *e = d->buckets[i];
    while (e) {
      entry *next = e->chain;
      entry_free(e);
      e = next;
    }
  }
  free(d->buckets);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

static entry **find_slot(pe_dedup *d, uint64_t c, uint64_t r) {
  entry **pp = &d->buckets[hash_key(c, r) & (d->n_buckets - 1)];
  while (*pp && !((*pp)->client == c && (*pp)->request == r)) pp = &(*pp)->chain;
  return pp;
}

static void fifo_unlink(pe_dedup *d, entry *e) {
  if (e->fifo_prev)
    e->fifo_prev->fifo_next = e->fifo_next;
  else
    d->oldest = e->fifo_next;
  if (e->fifo_next)
    e->fifo_next->fifo_prev = e->fifo_prev;
  else
    d->newest = e->fifo_prev;
  e->fifo_prev = e->fifo_next = NULL;
}

static void remove_entry(pe_dedup *d, entry *e) {
  entry **pp = find_slot(d, e->client, e->request);
  if (*pp == e) *pp = e->chain;
  fifo_unlink(d, e);
  d->st.entries--;
  d->st.bytes -= e->len;
  entry_free(e);
}

static void evict(pe_dedup *d) {
  while (d->oldest && (d->st.entries > d->max_entries || d->st.bytes > d->max_bytes)) {
    remove_entry(d, d->oldest);
    d->st.evictions++;
  }
}

pe_dedup_state pe_dedup_begin(pe_dedup *d, uint64_t client, uint64_t request, void *waiter,
                              uint8_t **reply, size_t *len) {
  if (client == 0) return PE_DEDUP_NEW;
  pthread_mutex_lock(&d->mu);
  entry **pp = find_slot(d, client, request);
  pe_dedup_state out = PE_DEDUP_NEW;
  if (*pp) {
    entry *e = *pp;
    if (e->done) {
      uint8_t *copy = malloc(e->len ? e->len : 1);
      if (copy) {
        memcpy(copy, e->reply, e->len);
        *reply = copy;
        *len = e->len;
        d->st.hits++;
        out = PE_DEDUP_DONE;
      } else {
        /* Cannot copy: answering nothing lets the client retry later. */
        *reply = NULL;
        *len = 0;
        out = PE_DEDUP_DONE;
      }
    } else {
      if (e->n_waiters == e->cap_waiters) {
        int cap = e->cap_waiters ? 2 * e->cap_waiters : 4;
        void **w = realloc(e->waiters, (size_t)cap * sizeof *w);
        if (w) {
          e->waiters = w;
          e->cap_waiters = cap;
        }
      }
      if (e->n_waiters < e->cap_waiters) {
        e->waiters[e->n_waiters++] = waiter;
        d->st.waits++;
        out = PE_DEDUP_WAITING;
      } else {
        /* Cannot park: drop this copy; the original's reply still goes out. */
        *reply = NULL;
        *len = 0;
        out = PE_DEDUP_DONE;
      }
    }
  } else {
    entry *e = calloc(1, sizeof *e);
    if (e) {
      e->client = client;
      e->request = request;
      *pp = e;
      d->st.in_flight++;
    }
  }
  pthread_mutex_unlock(&d->mu);
  return out;
}

void pe_dedup_finish(pe_dedup *d, uint64_t client, uint64_t request, const uint8_t *reply,
                     size_t len, void ***waiters, int *n_waiters) {
  *waiters = NULL;
  *n_waiters = 0;
  if (client == 0) return;
  pthread_mutex_lock(&d->mu);
  entry **pp = find_slot(d, client, request);
  entry *e = *pp;
  if (e && !e->done) {
    d->st.in_flight--;
    *waiters = e->waiters;
    *n_waiters = e->n_waiters;
    e->waiters = NULL;
    e->n_waiters = e->cap_waiters = 0;
    e->reply = malloc(len ? len : 1);
    if (!e->reply) {
      *pp = e->chain;
      entry_free(e);
    } else {
      memcpy(e->reply, reply, len);
      e->len = len;
      e->done = true;
      e->fifo_prev = d->newest;
      if (d->newest)
        d->newest->fifo_next = e;
      else
        d->oldest = e;
      d->newest = e;
      d->st.entries++;
      d->st.bytes += len;
      evict(d);
    }
  }
  pthread_mutex_unlock(&d->mu);
}

void pe_dedup_forget_client(pe_dedup *d, uint64_t client) {
  pthread_mutex_lock(&d->mu);
  entry *e = d->oldest;
  while (e) {
    entry *next = e->fifo_next;
    if (e->client == client) remove_entry(d, e);
    e = next;
  }
  pthread_mutex_unlock(&d->mu);
}

void pe_dedup_stats_get(pe_dedup *d, pe_dedup_stats *out) {
  pthread_mutex_lock(&d->mu);
  *out = d->st;
  pthread_mutex_unlock(&d->mu);
}

void pe_dedup_set_limits(pe_dedup *d, size_t max_entries, size_t max_bytes) {
  pthread_mutex_lock(&d->mu);
  d->max_entries = max_entries ? max_entries : 1;
  d->max_bytes = max_bytes;
  evict(d);
  pthread_mutex_unlock(&d->mu);
}
