#include "allocator.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Size classes: powers of two from 64 B up to 2^40. A free block of class k
 * is reused for any request whose rounded size is class k. */
#define N_CLASSES 41
#define MIN_SHIFT 6

typedef struct free_block {
  struct free_block *next;
} free_block;

struct pe_allocator {
  pthread_mutex_t mu;
  free_block *free_list[N_CLASSES];
  pe_alloc_stats st;
  const pe_allocator_impl *impl; /* set: everything is delegated to it */
  void *self;
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

pe_allocator *pe_allocator_new(void) {
  pe_allocator *a = calloc(1, sizeof(*a));
  if (a) pthread_mutex_init(&a->mu, NULL);
  return a;
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
  for (int k = 0; k < N_CLASSES; k++) {
    free_block *b = a->free_list[k];
    while (b) {
      free_block *n = b->next;
      free(b);
      b = n;
    }
    a->free_list[k] = NULL;
  }
  a->st.bytes_cached = 0;
  pthread_mutex_unlock(&a->mu);
}

void pe_allocator_free(pe_allocator *a) {
  if (!a) return;
  if (a->impl && a->impl->destroy) a->impl->destroy(a->self);
  else pe_allocator_trim(a);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

static pe_allocator *host_alloc;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static void host_init(void) { host_alloc = pe_allocator_new(); }

pe_allocator *pe_host_allocator(void) {
  pthread_once(&host_once, host_init);
  return host_alloc;
}

void *pe_alloc(pe_allocator *a, size_t bytes, size_t *cap) {
  if (a->impl) return a->impl->alloc(a->self, bytes, cap);
  size_t rounded;
  if (bytes == 0) bytes = 1;
  if (bytes > ((size_t)1 << (MIN_SHIFT + N_CLASSES - 1))) return NULL;
  int k = size_class(bytes, &rounded);
  pthread_mutex_lock(&a->mu);
  a->st.n_alloc++;
  free_block *b = a->free_list[k];
  if (b) {
    a->free_list[k] = b->next;
    a->st.bytes_cached -= rounded;
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
  size_t rounded;
  int k = size_class(cap, &rounded);
  free_block *b = p;
  pthread_mutex_lock(&a->mu);
  b->next = a->free_list[k];
  a->free_list[k] = b;
  a->st.bytes_in_use -= rounded;
  a->st.bytes_cached += rounded;
  pthread_mutex_unlock(&a->mu);
}

pe_alloc_stats pe_allocator_stats(pe_allocator *a) {
  if (a->impl) return a->impl->stats(a->self);
  pthread_mutex_lock(&a->mu);
  pe_alloc_stats s = a->st;
  pthread_mutex_unlock(&a->mu);
  return s;
}
