/* Work-stealing pool.
 *
 * Queues. Every worker owns a task_queue (an intrusive singly linked list
 * with head and tail) and there is one inject queue for threads outside the
 * pool. Each queue has its own mutex, held only for pointer moves; `n`
 * mirrors the list length so that idle workers and thieves can skip empty
 * queues without locking (a stale `n` only delays a steal, the sleep
 * protocol below catches the rest). Locks are never nested: a thief
 * unlinks a batch under the victim's lock, releases it, then links the
 * batch into its own queue under its own lock.
 *
 * Sleeping without lost wake-ups (an eventcount). Shared state: `seq`, a
 * 32-bit futex word bumped on every wake-up, and `sleepers`, the number of
 * workers that are about to sleep or sleeping.
 *
 *   worker going idle                      submitter
 *   s = seq (acquire)                      push task (queue lock; n++)
 *   stopping = stop (acquire)              fence(seq_cst)
 *   sleepers++ ; fence(seq_cst)            if sleepers > 0:
 *   if some queue has n > 0: retry            seq++ (release)
 *   else if stopping: exit                    futex_wake(seq, k)
 *   else futex_wait(seq, s)
 *   sleepers--
 *
 * The two seq_cst fences order "n++ then read sleepers" against "sleepers++
 * then read n": at least one side sees the other's write. If the worker
 * sees n > 0 it does not sleep. Otherwise the submitter sees sleepers > 0
 * and bumps seq; a worker that read the old seq either is already in
 * futex_wait (woken by futex_wake) or will call futex_wait with a stale
 * value, which the kernel refuses (EAGAIN), so it rescans. The same
 * argument covers shutdown: pe_pool_free stores stop (release) and then
 * bumps seq and wakes everyone. A worker that read the new seq also reads
 * stop == true (acquire on seq); one that read the old seq cannot block.
 * A worker exits only when stop was set and, after that, no queue had
 * work: since no outside thread may submit once free has begun, later
 * tasks can only be pushed by running workers to their own queues, and
 * those workers drain them before they go idle themselves. */
#define _GNU_SOURCE
#include "threadpool.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

#define PE_POOL_MAX_THREADS 256
#define STEAL_MAX 32          /* tasks moved by one steal */
#define DEFAULT_SPIN_US 50    /* idle polling before sleeping */

typedef struct task_queue {
  pthread_mutex_t mu;
  pe_task *head, *tail; /* guarded by mu */
  atomic_int n;         /* written under mu; read anywhere as a hint */
} task_queue;

typedef struct worker {
  alignas(64) task_queue q; /* own cache line: thieves touch it */
  pe_pool *pool;
  pthread_t thread;
  int id;
  uint32_t rng; /* victim choice; this worker only */
} worker;

struct pe_pool {
  int n;
  worker *w;
  alignas(64) task_queue inject;
  alignas(64) atomic_uint seq; /* futex word, see top of file */
  atomic_int sleepers;
  atomic_bool stop;
  pe_pool_opts opts;
  long spin_ns;
};

static _Thread_local pe_pool *tl_pool;
static _Thread_local int tl_worker = -1;

/* --- futex ------------------------------------------------------------------ */

/* _Atomic unsigned has the layout of a plain 32-bit unsigned on Linux
 * targets; the kernel compares and sleeps atomically. */
static void futex_wait(atomic_uint *addr, unsigned val) {
  syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr, int n) {
  syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* --- queues ------------------------------------------------------------------- */

static void queue_init(task_queue *q) {
  pthread_mutex_init(&q->mu, NULL);
  q->head = q->tail = NULL;
  atomic_init(&q->n, 0);
}

/* The relaxed loads/stores of n: n is a hint, the list itself is only read
 * under the mutex, which provides the ordering for the task contents. */
static inline int queue_hint(task_queue *q) {
  return atomic_load_explicit(&q->n, memory_order_relaxed);
}

static void queue_push(task_queue *q, pe_task *first, pe_task *last, int k, bool front) {
  pthread_mutex_lock(&q->mu);
  if (front) {
    last->next = q->head;
    q->head = first;
    if (!q->tail) q->tail = last;
  } else {
    last->next = NULL;
    if (q->tail)
      q->tail->next = first;
    else
      q->head = first;
    q->tail = last;
  }
  atomic_store_explicit(&q->n, queue_hint(q) + k, memory_order_relaxed);
  pthread_mutex_unlock(&q->mu);
}

/* Unlink up to max tasks from the front (at least one if any, at most half
 * of the queue rounded up). Returns the first; *last and *k describe the
 * chain, which stays linked through ->next. */
static pe_task *queue_take(task_queue *q, int max, pe_task **last, int *k) {
  if (queue_hint(q) == 0) return NULL;
  pthread_mutex_lock(&q->mu);
  pe_task *first = q->head;
  if (!first) {
    pthread_mutex_unlock(&q->mu);
    return NULL;
  }
  int n = queue_hint(q);
  int want = (n + 1) / 2;
  if (want > max) want = max;
  if (want < 1) want = 1;
  pe_task *t = first;
  int got = 1;
  while (got < want && t->next) {
    t = t->next;
    got++;
  }
  q->head = t->next;
  if (!q->head) q->tail = NULL;
  atomic_store_explicit(&q->n, n - got, memory_order_relaxed);
  pthread_mutex_unlock(&q->mu);
  *last = t;
  *k = got;
  return first;
}

/* --- finding work ---------------------------------------------------------------- */

static bool any_work(pe_pool *p) {
  if (queue_hint(&p->inject)) return true;
  for (int i = 0; i < p->n; i++)
    if (queue_hint(&p->w[i].q)) return true;
  return false;
}

static uint32_t xorshift(uint32_t *s) {
  uint32_t x = *s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

/* Own queue, inject queue, then the others starting at a random victim.
 * self is NULL for a thread outside the pool (it takes one task at a time
 * and keeps none). */
static pe_task *find_task(pe_pool *p, worker *self) {
  pe_task *last;
  int k;
  pe_task *t;
  if (self && (t = queue_take(&self->q, 1, &last, &k))) return t;
  if ((t = queue_take(&p->inject, 1, &last, &k))) return t;
  if (p->n == 1 && self) return NULL;
  uint32_t seed = self ? xorshift(&self->rng) : (uint32_t)(uintptr_t)&last;
  int start = (int)(seed % (uint32_t)p->n);
  for (int i = 0; i < p->n; i++) {
    worker *v = &p->w[(start + i) % p->n];
    if (v == self) continue;
    t = queue_take(&v->q, self ? STEAL_MAX : 1, &last, &k);
    if (!t) continue;
    if (k > 1) queue_push(&self->q, t->next, last, k - 1, true);
    return t;
  }
  return NULL;
}

static inline void run_task(pe_task *t) {
  void (*fn)(void *) = t->fn;
  void *arg = t->arg;
  fn(arg); /* t may be freed or reused from here on */
}

/* --- wake-ups ------------------------------------------------------------------------ */

static void wake(pe_pool *p, int k) {
  /* Pairs with the fence after sleepers++ in worker_idle. */
  atomic_thread_fence(memory_order_seq_cst);
  int sl = atomic_load_explicit(&p->sleepers, memory_order_relaxed);
  if (sl == 0) return;
  /* Release: a worker that reads the new seq with acquire sees the task. */
  atomic_fetch_add_explicit(&p->seq, 1, memory_order_release);
  futex_wake(&p->seq, k < sl ? k : sl);
}

/* Returns false when the worker should exit. */
static bool worker_idle(pe_pool *p) {
  if (p->spin_ns > 0) {
    long deadline = now_ns() + p->spin_ns;
    int rounds = 0;
    do {
      for (int i = 0; i < 32; i++) cpu_relax();
      if (any_work(p)) return true;
      /* Other threads may want this core (tests run 8 workers on 2). */
      if ((++rounds & 15) == 0) sched_yield();
    } while (now_ns() < deadline);
  }
  unsigned s = atomic_load_explicit(&p->seq, memory_order_acquire);
  bool stopping = atomic_load_explicit(&p->stop, memory_order_acquire);
  atomic_fetch_add_explicit(&p->sleepers, 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst); /* pairs with wake() */
  bool go_on = true;
  if (any_work(p))
    ;
  else if (stopping)
    go_on = false;
  else
    futex_wait(&p->seq, s);
  atomic_fetch_sub_explicit(&p->sleepers, 1, memory_order_relaxed);
  return go_on;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  pe_pool *p = w->pool;
  tl_pool = p;
  tl_worker = w->id;
  if (p->opts.on_start) p->opts.on_start(w->id, p->opts.ctx);
  for (;;) {
    pe_task *t = find_task(p, w);
    if (t) {
      run_task(t);
      continue;
    }
    if (!worker_idle(p)) break;
  }
  if (p->opts.on_stop) p->opts.on_stop(w->id, p->opts.ctx);
  tl_pool = NULL;
  tl_worker = -1;
  return NULL;
}

/* --- public -------------------------------------------------------------------------- */

static void pool_destroy(pe_pool *p, int started) {
  atomic_store_explicit(&p->stop, true, memory_order_release);
  atomic_fetch_add_explicit(&p->seq, 1, memory_order_release);
  futex_wake(&p->seq, INT32_MAX);
  for (int i = 0; i < started; i++) pthread_join(p->w[i].thread, NULL);
  for (int i = 0; i < p->n; i++) pthread_mutex_destroy(&p->w[i].q.mu);
  pthread_mutex_destroy(&p->inject.mu);
  free(p->w);
  free(p);
}

pe_status *pe_pool_new(int n_threads, const pe_pool_opts *opts, pe_pool **out) {
  *out = NULL;
  if (n_threads < 1 || n_threads > PE_POOL_MAX_THREADS)
    return pe_error(PE_EINVAL, "thread pool: %d threads (want 1..%d)", n_threads,
                    PE_POOL_MAX_THREADS);
  pe_pool *p = aligned_alloc(64, (sizeof(pe_pool) + 63) / 64 * 64);
  worker *w = aligned_alloc(64, sizeof(worker) * (size_t)n_threads);
  if (!p || !w) {
    free(p);
    free(w);
    return pe_error(PE_ENOMEM, "thread pool: %d workers", n_threads);
  }
  memset(p, 0, sizeof *p);
  memset(w, 0, sizeof(worker) * (size_t)n_threads);
  p->n = n_threads;
  p->w = w;
  if (opts) p->opts = *opts;
  int spin_us = p->opts.spin_us == 0 ? DEFAULT_SPIN_US : p->opts.spin_us;
  p->spin_ns = spin_us > 0 ? spin_us * 1000L : 0;
  queue_init(&p->inject);
  atomic_init(&p->seq, 0);
  atomic_init(&p->sleepers, 0);
  atomic_init(&p->stop, false);
  for (int i = 0; i < n_threads; i++) {
    queue_init(&w[i].q);
    w[i].pool = p;
    w[i].id = i;
    w[i].rng = 0x9e3779b9u * (uint32_t)(i + 1);
  }
  for (int i = 0; i < n_threads; i++) {
    int rc = pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
    if (rc) {
      pool_destroy(p, i);
      return pe_error(PE_EINTERNAL, "thread pool: starting worker %d: %s", i, strerror(rc));
    }
  }
  *out = p;
  return NULL;
}

void pe_pool_free(pe_pool *pool) {
  if (!pool) return;
  pool_destroy(pool, pool->n);
}

int pe_pool_threads(const pe_pool *pool) { return pool->n; }

int pe_pool_current_worker(void) { return tl_worker; }

bool pe_pool_is_worker(const pe_pool *pool) { return tl_pool == pool; }

void pe_pool_submit_batch(pe_pool *pool, pe_task *first, pe_task *last, int n) {
  if (n <= 0) return;
  if (tl_pool == pool)
    queue_push(&pool->w[tl_worker].q, first, last, n, true);
  else
    queue_push(&pool->inject, first, last, n, false);
  wake(pool, n);
}

void pe_pool_submit(pe_pool *pool, pe_task *task) { pe_pool_submit_batch(pool, task, task, 1); }

void pe_pool_submit_local(pe_pool *pool, pe_task *task) {
  pe_pool_submit_batch(pool, task, task, 1);
}

void pe_pool_submit_urgent(pe_pool *pool, pe_task *task) {
  if (tl_pool == pool)
    queue_push(&pool->w[tl_worker].q, task, task, 1, true);
  else
    queue_push(&pool->inject, task, task, 1, true);
  wake(pool, 1);
}

bool pe_pool_run_one(pe_pool *pool) {
  pe_task *t = find_task(pool, tl_pool == pool ? &pool->w[tl_worker] : NULL);
  if (!t) return false;
  run_task(t);
  return true;
}
