#include "allocator.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/cache_policy.h"

/* Size classes (cache_policy.h): powers of two from 64 B up to 2^46. A free
 * block of class k is reused for any request whose rounded size is class k. */
#define MIN_SHIFT 6

typedef struct free_block {
  struct free_block *next;
} free_block;

struct pe_allocator {
  pthread_mutex_t mu;
  free_block *free_list[PE_CACHE_CLASSES];
  pe_cache_policy cache;         /* what the free lists hold, their bound */
  pe_alloc_stats st;             /* bytes_cached: cache.cached */
  const pe_allocator_impl *impl; /* set: everything is delegated to it */
  void *self;
};

pe_allocator *pe_allocator_new(void) {
  pe_allocator *a = calloc(1, sizeof(*a));
  if (a) {
    pthread_mutex_init(&a->mu, NULL);
    pe_cache_policy_init(&a->cache, MIN_SHIFT, PE_ALLOC_CACHE_LIMIT);
  }
  return a;
}

/* Free a list of evicted blocks (no lock held); a large eviction also
 * hands glibc's free heap pages back to the kernel (blocks under its mmap
 * threshold live in the heap, where free() keeps them resident). */
static void release_blocks(free_block *b, size_t bytes) {
  while (b) {
    free_block *n = b->next;
    free(b);
    b = n;
  }
#ifdef __GLIBC__
  if (bytes >= PE_ALLOC_TRIM_BYTES) malloc_trim(0);
#else
  (void)bytes;
#endif
}

/* Unlink cached blocks, largest first, until the cache fits the limit
 * (lock held); the list to release_blocks and its bytes. */
static free_block *evict_locked(pe_allocator *a, size_t *bytes) {
  free_block *out = NULL;
  *bytes = 0;
  for (int k; (k = pe_cache_victim(&a->cache)) >= 0;) {
    free_block *b = a->free_list[k];
    a->free_list[k] = b->next;
    b->next = out;
    out = b;
    pe_cache_take(&a->cache, k);
    *bytes += pe_cache_class_bytes(&a->cache, k);
  }
  a->st.bytes_cached = a->cache.cached;
  return out;
}

void pe_allocator_set_cache_limit(pe_allocator *a, size_t bytes) {
  if (a->impl) return;
  pthread_mutex_lock(&a->mu);
  a->cache.limit = bytes;
  pthread_mutex_unlock(&a->mu);
}

pe_allocator *pe_allocator_new_impl(const pe_allocator_impl *impl, void *self) {
  pe_allocator *a = pe_allocator_new();
  if (a) {
    a->impl = impl;
    a->self = self;
  }
  return a;
}

void pe_allocator_trim(pe_allocator *a) {
  if (a->impl) {
    a->impl->trim(a->self);
    return;
  }
  pthread_mutex_lock(&a->mu);
  size_t limit = a->cache.limit, bytes;
  a->cache.limit = 0;
  free_block *b = evict_locked(a, &bytes);
  a->cache.limit = limit;
  pthread_mutex_unlock(&a->mu);
  release_blocks(b, bytes);
}

void pe_allocator_free(pe_allocator *a) {
  if (!a) return;
  if (a->impl && a->impl->destroy)
    a->impl->destroy(a->self);
  else
    pe_allocator_trim(a);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

static pe_allocator *host_alloc;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static void host_init(void) {
  host_alloc = pe_allocator_new();
}

pe_allocator *pe_host_allocator(void) {
  pthread_once(&host_once, host_init);
  return host_alloc;
}

void *pe_alloc(pe_allocator *a, size_t bytes, size_t *cap) {
  if (a->impl) return a->impl->alloc(a->self, bytes, cap);
  size_t rounded;
  int k = pe_cache_class(&a->cache, bytes, &rounded);
  if (k < 0) return NULL;
  pthread_mutex_lock(&a->mu);
  a->st.n_alloc++;
  free_block *b = a->free_list[k];
  if (b) {
    a->free_list[k] = b->next;
    pe_cache_take(&a->cache, k);
    a->st.bytes_cached = a->cache.cached;
  }
  pthread_mutex_unlock(&a->mu);
  if (!b) {
    b = aligned_alloc(64, rounded);
    if (!b) return NULL;
    pthread_mutex_lock(&a->mu);
    a->st.n_system++;
    pthread_mutex_unlock(&a->mu);
  }
  pthread_mutex_lock(&a->mu);
  a->st.bytes_in_use += rounded;
  if (a->st.bytes_in_use > a->st.peak_in_use) a->st.peak_in_use = a->st.bytes_in_use;
  pthread_mutex_unlock(&a->mu);
  *cap = rounded;
  return b;
}

void pe_free(pe_allocator *a, void *p, size_t cap) {
  if (!p) return;
  if (a->impl) {
    a->impl->free(a->self, p, cap);
    return;
  }
  size_t rounded, bytes;
  int k = pe_cache_class(&a->cache, cap, &rounded); /* cap came from pe_alloc: a class */
  free_block *b = p;
  pthread_mutex_lock(&a->mu);
  b->next = a->free_list[k];
  a->free_list[k] = b;
  a->st.bytes_in_use -= rounded;
  pe_cache_put(&a->cache, k);
  free_block *evicted = evict_locked(a, &bytes);
  pthread_mutex_unlock(&a->mu);
  release_blocks(evicted, bytes);
}

pe_alloc_stats pe_allocator_stats(pe_allocator *a) {
  if (a->impl) return a->impl->stats(a->self);
  pthread_mutex_lock(&a->mu);
  pe_alloc_stats s = a->st;
  pthread_mutex_unlock(&a->mu);
  return s;
}
