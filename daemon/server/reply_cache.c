/* Reply cache (see reply_cache.h): a chained hash table on (client, request) plus
 * a FIFO list of finished entries for eviction. */
#include "server/reply_cache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
  uint64_t client, request;
  bool done;
  uint8_t *reply;
  size_t len;
  uint64_t top_seq; /* newest copy answered */
  pe_reply_cache_copy *parked; /* copies waiting for the reply, by receive order */
  int n_parked, cap_parked;
  struct entry *chain;                 /* hash bucket */
  struct entry *fifo_prev, *fifo_next; /* finished entries, oldest first */
} entry;

struct pe_reply_cache {
  pthread_mutex_t mu;
  entry **buckets;
  size_t n_buckets; /* power of two */
  entry *oldest, *newest;
  size_t max_entries, max_bytes;
  pe_reply_cache_send_fn send;
  void *send_ctx;
  pe_reply_cache_stats st;
};

static size_t hash_key(uint64_t c, uint64_t r) {
  uint64_t h = c * 0x9E3779B97F4A7C15ull ^ (r + 0x632BE59BD9B4E019ull + (c << 6) + (c >> 2));
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return (size_t)h;
}

pe_reply_cache *pe_reply_cache_new(size_t max_entries, size_t max_bytes, pe_reply_cache_send_fn send, void *ctx) {
  pe_reply_cache *d = calloc(1, sizeof *d);
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
  d->send = send;
  d->send_ctx = ctx;
  return d;
}

static void entry_free(entry *e) {
  free(e->reply);
  free(e->parked);
  free(e);
}

void pe_reply_cache_free(pe_reply_cache *d) {
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

static entry **find_slot(pe_reply_cache *d, uint64_t c, uint64_t r) {
  entry **pp = &d->buckets[hash_key(c, r) & (d->n_buckets - 1)];
  while (*pp && !((*pp)->client == c && (*pp)->request == r)) pp = &(*pp)->chain;
  return pp;
}

static void fifo_unlink(pe_reply_cache *d, entry *e) {
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

static void remove_entry(pe_reply_cache *d, entry *e) {
  entry **pp = find_slot(d, e->client, e->request);
  if (*pp == e) *pp = e->chain;
  fifo_unlink(d, e);
  d->st.entries--;
  d->st.bytes -= e->len;
  entry_free(e);
}

static void evict(pe_reply_cache *d) {
  while (d->oldest && (d->st.entries > d->max_entries || d->st.bytes > d->max_bytes)) {
    remove_entry(d, d->oldest);
    d->st.evictions++;
  }
}

/* Under d->mu: insert job into e's parked copies, kept sorted by seq. */
static bool park(entry *e, uint64_t seq, void *job) {
  if (e->n_parked == e->cap_parked) {
    int cap = e->cap_parked ? 2 * e->cap_parked : 4;
    pe_reply_cache_copy *p = realloc(e->parked, (size_t)cap * sizeof *p);
    if (!p) return false;
    e->parked = p;
    e->cap_parked = cap;
  }
  int i = e->n_parked++;
  for (; i > 0 && e->parked[i - 1].seq > seq; i--) e->parked[i] = e->parked[i - 1];
  e->parked[i] = (pe_reply_cache_copy){seq, job};
  return true;
}

pe_reply_cache_state pe_reply_cache_begin(pe_reply_cache *d, uint64_t client, uint64_t request, uint64_t seq,
                              void *job) {
  if (client == 0) return PE_DEDUP_NEW;
  pthread_mutex_lock(&d->mu);
  entry **pp = find_slot(d, client, request);
  entry *e = *pp;
  pe_reply_cache_state out;
  if (!e) {
    out = PE_DEDUP_NEW;
    if ((e = calloc(1, sizeof *e))) {
      e->client = client;
      e->request = request;
      *pp = e;
      d->st.in_flight++;
    }
  } else if (!e->done) {
    out = park(e, seq, job) ? PE_DEDUP_WAITING : PE_DEDUP_STALE;
    if (out == PE_DEDUP_WAITING) d->st.waits++;
  } else if (seq > e->top_seq) {
    out = PE_DEDUP_DONE;
    e->top_seq = seq;
    d->st.hits++;
    d->send(d->send_ctx, job, e->reply, e->len);
  } else {
    out = PE_DEDUP_STALE;
  }
  if (out == PE_DEDUP_STALE) d->st.stale++;
  pthread_mutex_unlock(&d->mu);
  return out;
}

/* Under d->mu: keep a copy of the reply on e (dropping e when out of memory:
 * a later resend is then handled as new). */
static void store_reply(pe_reply_cache *d, entry **pp, const uint8_t *reply, size_t len) {
  entry *e = *pp;
  if (!(e->reply = malloc(len ? len : 1))) {
    *pp = e->chain;
    entry_free(e);
    return;
  }
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

int pe_reply_cache_finish(pe_reply_cache *d, uint64_t client, uint64_t request, uint64_t seq, void *job,
                    const uint8_t *reply, size_t len, pe_reply_cache_copy **parked_out) {
  *parked_out = NULL;
  if (client == 0) {
    d->send(d->send_ctx, job, reply, len);
    return 0;
  }
  pthread_mutex_lock(&d->mu);
  entry **pp = find_slot(d, client, request);
  entry *e = *pp;
  int n = 0;
  pe_reply_cache_copy *ps = NULL;
  if (e && !e->done) {
    d->st.in_flight--;
    ps = e->parked;
    n = e->n_parked;
    e->parked = NULL;
    e->n_parked = e->cap_parked = 0;
    e->top_seq = n && ps[n - 1].seq > seq ? ps[n - 1].seq : seq;
    store_reply(d, pp, reply, len);
  }
  /* job and the parked copies, oldest first (job's place among them by seq). */
  bool job_sent = false;
  for (int i = 0; i < n; i++) {
    if (!job_sent && seq < ps[i].seq) {
      d->send(d->send_ctx, job, reply, len);
      job_sent = true;
    }
    d->send(d->send_ctx, ps[i].job, reply, len);
  }
  if (!job_sent) d->send(d->send_ctx, job, reply, len);
  pthread_mutex_unlock(&d->mu);
  *parked_out = ps;
  return n;
}

void pe_reply_cache_forget_client(pe_reply_cache *d, uint64_t client) {
  pthread_mutex_lock(&d->mu);
  entry *e = d->oldest;
  while (e) {
    entry *next = e->fifo_next;
    if (e->client == client) remove_entry(d, e);
    e = next;
  }
  pthread_mutex_unlock(&d->mu);
}

void pe_reply_cache_stats_get(pe_reply_cache *d, pe_reply_cache_stats *out) {
  pthread_mutex_lock(&d->mu);
  *out = d->st;
  pthread_mutex_unlock(&d->mu);
}

void pe_reply_cache_set_limits(pe_reply_cache *d, size_t max_entries, size_t max_bytes) {
  pthread_mutex_lock(&d->mu);
  d->max_entries = max_entries ? max_entries : 1;
  d->max_bytes = max_bytes;
  evict(d);
  pthread_mutex_unlock(&d->mu);
}
