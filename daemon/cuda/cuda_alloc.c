/* Out-of-band size-class cache; see cuda_alloc.h. */
#include "cuda_alloc.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/cache_policy.h"

#define MIN_SHIFT 8 /* 256 B */

typedef struct cache_node {
  void *p;
  struct cache_node *next;
} cache_node;

struct pe_cuda_cache {
  pthread_mutex_t mu;
  pe_cuda_backend b;
  cache_node *free_list[PE_CACHE_CLASSES]; /* cached blocks per class */
  cache_node *spare;                       /* recycled nodes */
  pe_cache_policy cache;                   /* what the lists hold, their bound */
  pe_alloc_stats st;                       /* bytes_cached: cache.cached */
};

pe_cuda_cache *pe_cuda_cache_new(pe_cuda_backend b, size_t limit) {
  pe_cuda_cache *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  c->b = b;
  pe_cache_policy_init(&c->cache, MIN_SHIFT, limit);
  return c;
}

/* Unlink cached blocks, largest first, until the cache holds at most
 * `limit` bytes (lock held); the list for give_back. */
static cache_node *evict_locked(pe_cuda_cache *c, size_t limit) {
  cache_node *out = NULL;
  size_t keep = c->cache.limit;
  c->cache.limit = limit;
  for (int k; (k = pe_cache_victim(&c->cache)) >= 0;) {
    cache_node *n = c->free_list[k];
    c->free_list[k] = n->next;
    n->next = out;
    out = n;
    pe_cache_take(&c->cache, k);
  }
  c->cache.limit = keep;
  c->st.bytes_cached = c->cache.cached;
  return out;
}

/* Give evicted blocks back to the backend with no lock held: cudaFree and
 * cudaFreeHost synchronise with the device, and a stream's host function
 * (device_cuda.c's staged copies) may be waiting for this lock to release
 * its pinned buffer, so calling them under it can deadlock. */
static void give_back(pe_cuda_cache *c, cache_node *all) {
  if (!all) return;
  cache_node *last = all;
  for (cache_node *n = all; n; n = n->next) {
    c->b.free(n->p, c->b.arg);
    last = n;
  }
  pthread_mutex_lock(&c->mu);
  last->next = c->spare;
  c->spare = all;
  pthread_mutex_unlock(&c->mu);
}

void pe_cuda_cache_trim(pe_cuda_cache *c) {
  pthread_mutex_lock(&c->mu);
  cache_node *all = evict_locked(c, 0);
  pthread_mutex_unlock(&c->mu);
  give_back(c, all);
}

void pe_cuda_cache_set_limit(pe_cuda_cache *c, size_t bytes) {
  pthread_mutex_lock(&c->mu);
  c->cache.limit = bytes;
  cache_node *out = evict_locked(c, bytes);
  pthread_mutex_unlock(&c->mu);
  give_back(c, out);
}

void pe_cuda_cache_free(pe_cuda_cache *c) {
  if (!c) return;
  pe_cuda_cache_trim(c);
  cache_node *n = c->spare;
  while (n) {
    cache_node *next = n->next;
    free(n);
    n = next;
  }
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void *pe_cuda_cache_alloc(pe_cuda_cache *c, size_t bytes, size_t *cap) {
  size_t rounded;
  int k = pe_cache_class(&c->cache, bytes, &rounded);
  if (k < 0) return NULL; /* larger than the largest class */
  pthread_mutex_lock(&c->mu);
  c->st.n_alloc++;
  cache_node *n = c->free_list[k];
  void *p = NULL;
  if (n) {
    c->free_list[k] = n->next;
    p = n->p;
    n->next = c->spare;
    c->spare = n;
    pe_cache_take(&c->cache, k);
    c->st.bytes_cached = c->cache.cached;
  }
  pthread_mutex_unlock(&c->mu);
  if (!p) {
    /* The backend call runs outside the lock: cudaMalloc can take long. */
    p = c->b.alloc(rounded, c->b.arg);
    if (!p) { /* cached blocks of other classes may be what is missing */
      pe_cuda_cache_trim(c);
      p = c->b.alloc(rounded, c->b.arg);
    }
    if (!p) return NULL;
    pthread_mutex_lock(&c->mu);
    c->st.n_system++;
    pthread_mutex_unlock(&c->mu);
  }
  pthread_mutex_lock(&c->mu);
  c->st.bytes_in_use += rounded;
  if (c->st.bytes_in_use > c->st.peak_in_use) c->st.peak_in_use = c->st.bytes_in_use;
  pthread_mutex_unlock(&c->mu);
  *cap = rounded;
  return p;
}

void pe_cuda_cache_release(pe_cuda_cache *c, void *p, size_t cap) {
  if (!p) return;
  size_t rounded;
  int k = pe_cache_class(&c->cache, cap, &rounded); /* cap came from alloc: a class */
  pthread_mutex_lock(&c->mu);
  cache_node *n = c->spare;
  if (n)
    c->spare = n->next;
  else
    n = malloc(sizeof(*n));
  c->st.bytes_in_use -= rounded;
  cache_node *evicted = NULL;
  if (n) {
    n->p = p;
    n->next = c->free_list[k];
    c->free_list[k] = n;
    pe_cache_put(&c->cache, k);
    evicted = evict_locked(c, c->cache.limit);
  }
  pthread_mutex_unlock(&c->mu);
  if (!n) c->b.free(p, c->b.arg); /* no node to cache it: return it */
  give_back(c, evicted);
}

pe_alloc_stats pe_cuda_cache_stats(pe_cuda_cache *c) {
  pthread_mutex_lock(&c->mu);
  pe_alloc_stats s = c->st;
  pthread_mutex_unlock(&c->mu);
  return s;
}
