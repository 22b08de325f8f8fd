/* Helpers shared by the pool and dependency-engine tests
 * (test_threadpool.c, test_dep_engine.c, test_dep_engine_sched.c):
 * deadline waits, an OK() check for statuses, a pool + engine pair.
 * Header-only; each suite is its own executable. */
#ifndef PE_TESTS_ENGINE_TEST_UTIL_H
#define PE_TESTS_ENGINE_TEST_UTIL_H

#include <check.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "engine/dep_engine.h"
#include "engine/threadpool.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SCALE 4 /* sanitizers are slow: fewer rounds */
#else
#define SCALE 1
#endif

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Spin (yielding) until *v >= want or the deadline passes: a lost wake-up
 * fails the test instead of hanging it. */
static inline bool wait_at_least(atomic_int *v, int want, double seconds) {
  double end = now_s() + seconds;
  while (atomic_load(v) < want) {
    if (now_s() > end) return false;
    sched_yield();
  }
  return true;
}

#define OK(expr)                                                         \
  do {                                                                   \
    pe_status *st_ = (expr);                                             \
    ck_assert_msg(!st_, "%s: %s", #expr, st_ ? pe_status_msg(st_) : ""); \
  } while (0)

typedef struct env {
  pe_pool *pool;
  pe_engine *eng;
} env;

static inline env env_new(int threads) {
  env e;
  OK(pe_pool_new(threads, NULL, &e.pool));
  OK(pe_engine_new(e.pool, &e.eng));
  return e;
}

static inline void env_free(env *e) {
  pe_engine_free(e->eng);
  pe_pool_free(e->pool);
}

/* An engine op that counts its calls and completions (and fails when
 * `fail`), pushed with one optional read and one optional mutation. */
typedef struct probe {
  atomic_int calls, done_calls;
  atomic_int done_code;
  bool fail;
} probe;

static inline pe_status *probe_fn(void *arg) {
  probe *p = arg;
  atomic_fetch_add(&p->calls, 1);
  return p->fail ? pe_error(PE_ESHAPE, "op boom: x has shape [2,3]") : NULL;
}

static inline void probe_done(void *arg, const pe_status *st) {
  probe *p = arg;
  atomic_store(&p->done_code, pe_status_code(st));
  atomic_fetch_add(&p->done_calls, 1);
}

static inline void push_probe(pe_engine *eng, probe *p, pe_engine_var *rd, pe_engine_var *mu) {
  pe_engine_op_args a = {.fn = probe_fn,
                         .arg = p,
                         .on_done = probe_done,
                         .reads = &rd,
                         .n_reads = rd ? 1 : 0,
                         .mutates = &mu,
                         .n_mutates = mu ? 1 : 0};
  OK(pe_engine_op_new(eng, &a, NULL));
}

/* A pool task that holds the worker running it until `open`, and says
 * which worker that is (placement tests block one worker with it). */
typedef struct worker_block {
  pe_task task;
  atomic_int open, entered, worker;
} worker_block;

static inline void worker_block_fn(void *arg) {
  worker_block *b = arg;
  atomic_store(&b->worker, pe_pool_current_worker());
  atomic_store(&b->entered, 1);
  wait_at_least(&b->open, 1, 10);
}

/* Submit b to the pool and wait until a worker holds it; returns that
 * worker. */
static inline int worker_block_start(pe_pool *pool, worker_block *b) {
  b->task = (pe_task){worker_block_fn, b, NULL};
  pe_pool_submit(pool, &b->task);
  ck_assert(wait_at_least(&b->entered, 1, 10));
  return atomic_load(&b->worker);
}

#endif
