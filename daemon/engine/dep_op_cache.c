/* The dependency engine's op memory: ops are allocated by the threads that
 * push them and freed by the workers that complete them, so that hand-over
 * goes through per-thread caches and a lock-free depot instead of malloc.
 *
 * Split from dep_engine.c, which keeps the scheduling: the cache knows an
 * op only by its size (dep_engine_internal.h) and nothing of grants,
 * queues or completion. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "dep_engine_internal.h"

/* --- op memory --------------------------------------------------------------------- *
 *
 * Ops are allocated by pushing threads and freed by workers. With malloc
 * that hand-over contends on the allocator's arena lock on every op, so ops
 * with up to SMALL_DEPS variables come from a cache: a thread frees blocks
 * into its own list and, every CACHE_BATCH blocks, moves the whole list to
 * a process-wide depot (one lock-free CAS push of a chain). A thread that
 * runs out takes the entire depot with one exchange. Nobody ever pops a
 * single node from the shared stack, so there is no ABA problem. A
 * thread's lists go back to the depot when it exits. Blocks are never
 * returned to malloc (the cache holds the peak number of ops in flight).
 * AddressSanitizer builds use plain malloc so that it sees every free. */
#define SMALL_DEPS 6
#define CACHE_BATCH 64

typedef struct block {
  struct block *next;
} block;

typedef struct op_cache {
  block *own; /* freed by this thread */
  int n_own;
  block *taken; /* taken from the depot */
  bool registered;
} op_cache;

static _Atomic(block *) depot;
static _Thread_local op_cache tl_cache;
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static size_t op_size(int n_deps) {
  return sizeof(pe_engine_op) + sizeof(dep) * (size_t)n_deps;
}

/* Release: the chain's links are visible to the thread that takes it. */
static void depot_push(block *first) {
  if (!first) return;
  block *last = first;
  while (last->next) last = last->next;
  block *top = atomic_load_explicit(&depot, memory_order_relaxed);
  do last->next = top;
  while (!atomic_compare_exchange_weak_explicit(&depot, &top, first, memory_order_release,
                                                memory_order_relaxed));
}

static void cache_flush(void *arg) {
  op_cache *c = arg;
  depot_push(c->own);
  depot_push(c->taken);
  c->own = c->taken = NULL;
  c->n_own = 0;
}

static void cache_key_make(void) {
  pthread_key_create(&cache_key, cache_flush);
}

static op_cache *cache_get(void) {
  op_cache *c = &tl_cache;
  if (!c->registered) { /* so that the lists are flushed at thread exit */
    pthread_once(&cache_once, cache_key_make);
    pthread_setspecific(cache_key, c);
    c->registered = true;
  }
  return c;
}

#ifdef __SANITIZE_ADDRESS__
#define OP_CACHE 0
#else
#define OP_CACHE 1
#endif

pe_engine_op *op_alloc(int n_deps) {
  if (!OP_CACHE || n_deps > SMALL_DEPS) return malloc(op_size(n_deps));
  op_cache *c = cache_get();
  block *b = c->own;
  if (b) {
    c->own = b->next;
    c->n_own--;
  } else {
    if (!c->taken) c->taken = atomic_exchange_explicit(&depot, NULL, memory_order_acquire);
    if (!(b = c->taken)) return malloc(op_size(SMALL_DEPS));
    c->taken = b->next;
  }
  /* Blocks come back from other cores: fetch the next one ahead. */
  if (c->own)
    __builtin_prefetch(c->own, 1);
  else if (c->taken)
    __builtin_prefetch(c->taken, 1);
  return (pe_engine_op *)b;
}

void op_release_mem(pe_engine_op *op, int n_deps) {
  if (!OP_CACHE || n_deps > SMALL_DEPS) {
    free(op);
    return;
  }
  op_cache *c = cache_get();
  block *b = (block *)op;
  b->next = c->own;
  c->own = b;
  if (++c->n_own >= CACHE_BATCH) {
    depot_push(c->own);
    c->own = NULL;
    c->n_own = 0;
  }
}
