/* Out-of-band size-class cache; see cuda_alloc.h. */
#include "cuda_alloc.h"

#include <pthread.h>
#include <stdlib.h>

#define N_CLASSES 41
#define MIN_SHIFT 8 /* 256 B */

typedef struct cache_node {
  void *p;
  struct cache_node *next;
} cache_node;

struct pe_cuda_cache {
  pthread_mutex_t mu;
  pe_cuda_backend b;
  cache_node *free_list[N_CLASSES]; /* cached blocks per class */
  cache_node *spare;                /* recycled nodes */
  pe_alloc_stats st;
};

static int size_class(size_t bytes, size_t *rounded) {
  size_t sz = (size_t)1 << MIN_SHIFT;
  int k = 0;
  while (sz < bytes && k < N_CLASSES - 1) {
    sz <<= 1;
    k++;
  }
  *rounded = sz;
  return k;
}

pe_cuda_cache *pe_cuda_cache_new(pe_cuda_backend b) {
  pe_cuda_cache *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  c->b = b;
  return c;
}

void pe_cuda_cache_trim(pe_cuda_cache *c) {
  /* Detach the cached blocks under the lock, give them back outside it:
   * cudaFree/cudaFreeHost synchronise with the device, and a stream's host
   * function (device_cuda.c's staged copies) may be waiting for this lock
   * to release its pinned buffer, so calling them under it can deadlock. */
  cache_node *all = NULL;
  pthread_mutex_lock(&c->mu);
  for (int k = 0; k < N_CLASSES; k++) {
    cache_node *n = c->free_list[k];
    while (n) {
      cache_node *next = n->next;
      n->next = all;
      all = n;
      n = next;
    }
    c->free_list[k] = NULL;
  }
  c->st.bytes_cached = 0;
  pthread_mutex_unlock(&c->mu);
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
  int k = size_class(bytes ? bytes : 1, &rounded);
  if (rounded < bytes) return NULL; /* larger than the largest class */
  pthread_mutex_lock(&c->mu);
  c->st.n_alloc++;
  cache_node *n = c->free_list[k];
  void *p = NULL;
  if (n) {
    c->free_list[k] = n->next;
    p = n->p;
    n->next = c->spare;
    c->spare = n;
    c->st.bytes_cached -= rounded;
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
  int k = size_class(cap, &rounded);
  pthread_mutex_lock(&c->mu);
  cache_node *n = c->spare;
  if (n)
    c->spare = n->next;
  else
    n = malloc(sizeof(*n));
  c->st.bytes_in_use -= rounded;
  if (n) {
    n->p = p;
    n->next = c->free_list[k];
    c->free_list[k] = n;
    c->st.bytes_cached += rounded;
  }
  pthread_mutex_unlock(&c->mu);
  if (!n) c->b.free(p, c->b.arg); /* no node to cache it: return it */
}

pe_alloc_stats pe_cuda_cache_stats(pe_cuda_cache *c) {
  pthread_mutex_lock(&c->mu);
  pe_alloc_stats s = c->st;
  pthread_mutex_unlock(&c->mu);
  return s;
}
