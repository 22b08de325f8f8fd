/* Work-stealing pool.
 *
 * Queues. Every worker owns a task_queue (an intrusive singly linked list
 * with head and tail) with its own mutex, held only for pointer moves; `n`
 * mirrors the list length so that idle workers and thieves can skip empty
 * queues without locking (a stale `n` only delays a steal, the sleep
 * protocol below catches the rest). Locks are never nested: a thief
 * unlinks a batch under the victim's lock, releases it, then links the
 * batch into its own queue under its own lock.
 *
 * Stealing waits for staleness. A thief takes from a victim whose queue
 * is long (>= STEAL_MAX) at once, but from a short queue only when the
 * victim made no progress (its `takes` count did not move) between two of
 * the thief's looks, about half a microsecond apart. An owner that gets
 * to its own tasks that fast does not need help, and a steal costs cache
 * traffic on both sides (the task's inputs, the counters it updates); a
 * busy owner is relieved within a poll interval.
 *
 * Threads outside the pool submit to two lock-free stacks (normal and
 * urgent): a submitter pushes its chain with one CAS (release), a worker
 * takes the whole stack with one exchange (acquire), restores FIFO order
 * and moves what it does not run at once into its own queue, where the
 * others can steal it (waking a sleeper for it: see move_rest). Nobody pops
 * single nodes, so there is no ABA problem, and an outside submitter never
 * waits for a lock a worker holds.
 *
 * Sleeping without lost wake-ups (an eventcount). Shared state: `seq`, a
 * 32-bit futex word bumped on every wake-up, and `idle`, whose low 32 bits
 * count the workers that are about to sleep or sleeping ("sleepers") and
 * whose high bits count how often a worker left that state (an epoch, for
 * shutdown below).
 *
 *   worker going idle                      submitter
 *   s = seq (acquire)                      push task (queue lock; n++)
 *   stopping = stop (acquire)              fence(seq_cst)
 *   sleepers++ ; fence(seq_cst)            if sleepers > 0:
 *   if some queue has n > 0: retry            seq++ (release)
 *   else if stopping and drained: exit        futex_wake(seq, k)
 *   else futex_wait(seq, s)
 *   sleepers-- (epoch++)
 *
 * The two seq_cst fences order "n++ then read sleepers" against "sleepers++
 * then read n": at least one side sees the other's write. If the worker
 * sees n > 0 it does not sleep. Otherwise the submitter sees sleepers > 0
 * and bumps seq; a worker that read the old seq either is already in
 * futex_wait (woken by futex_wake) or will call futex_wait with a stale
 * value, which the kernel refuses (EAGAIN), so it rescans.
 *
 * Shutdown. pe_pool_free stores stop (release), bumps seq and wakes
 * everyone; a worker that read the new seq also reads stop == true
 * (acquire on seq), one that read the old seq cannot block. Workers exit
 * only once the pool is drained: every worker idle and nothing queued,
 * so a task that waits for work it submitted is never left alone. A
 * stopping worker checks that by reading `idle` (all n idle, epoch e),
 * scanning the queues, and reading `idle` again: if it is unchanged, no
 * worker left the idle state during the scan, so no task was taken or run
 * and none could be pushed (no outside submissions after free; idle
 * workers run nothing). The first read acquires every registration, and
 * each worker registers after its last push, so the scan sees those
 * pushes. It then sets `drained`, bumps seq and wakes everyone to exit. */
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
#define STEAL_MAX 32       /* tasks moved by one steal */
#define DEFAULT_SPIN_US 50 /* idle polling before sleeping */

typedef struct task_queue {
  pthread_mutex_t mu;
  pe_task *head, *tail; /* guarded by mu */
  atomic_int n;         /* written under mu; read anywhere as a hint */
  atomic_uint takes;    /* successful takes (under mu); progress hint */
} task_queue;

typedef struct worker {
  alignas(64) task_queue q; /* own cache line: thieves touch it */
  pe_pool *pool;
  pthread_t thread;
  int id;
  uint32_t rng;                       /* victim choice; this worker only */
  unsigned looks;                     /* find_task calls; this worker only */
  unsigned seen[PE_POOL_MAX_THREADS]; /* victims' takes at our last look */
} worker;

struct pe_pool {
  /* Workers running or being started: slots [0, n) of w. n only grows
   * (pe_pool_grow, release after the slot is set up); readers load it with
   * acquire and may see the old value, which leaves out a worker that
   * serves its own queue anyway. */
  atomic_int n;
  int cap;                 /* slots of w (pe_pool_opts.max_threads) */
  int inited;              /* slots whose queue is set up; under grow_mu */
  pthread_mutex_t grow_mu; /* one pe_pool_grow at a time */
  worker *w;
  alignas(64) _Atomic(pe_task *) inject; /* stack, newest first */
  _Atomic(pe_task *) urgent;             /* stack, taken before inject */
  alignas(64) atomic_uint seq;           /* futex word, see top of file */
  _Atomic uint64_t idle;                 /* epoch << 32 | sleepers, see top of file */
  atomic_bool stop;
  atomic_bool drained;
  atomic_int started; /* workers created (fewer if pe_pool_new failed) */
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

/* Queue and variable locks are held for a few pointer moves: an adaptive
 * mutex spins briefly before it sleeps in the kernel, which keeps a
 * contended hand-off out of the futex path. */
static void short_mutex_init(pthread_mutex_t *mu) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
  pthread_mutex_init(mu, &a);
  pthread_mutexattr_destroy(&a);
}

static void queue_init(task_queue *q) {
  short_mutex_init(&q->mu);
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
  atomic_store_explicit(&q->takes, atomic_load_explicit(&q->takes, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  pthread_mutex_unlock(&q->mu);
  *last = t;
  *k = got;
  return first;
}

/* --- finding work ---------------------------------------------------------------- */

static inline int n_workers(const pe_pool *p) {
  return atomic_load_explicit(&p->n, memory_order_acquire);
}

static bool any_work(pe_pool *p) {
  if (atomic_load_explicit(&p->urgent, memory_order_relaxed) ||
      atomic_load_explicit(&p->inject, memory_order_relaxed))
    return true;
  int n = n_workers(p);
  for (int i = 0; i < n; i++)
    if (queue_hint(&p->w[i].q)) return true;
  return false;
}

/* --- inject stacks -------------------------------------------------------------- */

/* Push first..last (in FIFO order) so that after take_all's reversal they
 * come out in that order: the chain goes on reversed. */
static void stack_push(_Atomic(pe_task *) *top, pe_task *first, pe_task *last) {
  pe_task *prev = NULL, *t = first;
  for (;;) { /* reverse first..last */
    pe_task *next = t == last ? NULL : t->next;
    t->next = prev;
    prev = t;
    if (!next) break;
    t = next;
  }
  /* now last..first, first->next == NULL */
  pe_task *old = atomic_load_explicit(top, memory_order_relaxed);
  do first->next = old;
  while (!atomic_compare_exchange_weak_explicit(top, &old, last, memory_order_release,
                                                memory_order_relaxed));
}

/* Take everything, oldest first. *lastp and *k describe the chain. */
static pe_task *stack_take_all(_Atomic(pe_task *) *top, pe_task **lastp, int *k) {
  if (!atomic_load_explicit(top, memory_order_relaxed)) return NULL;
  pe_task *t = atomic_exchange_explicit(top, NULL, memory_order_acquire);
  if (!t) return NULL;
  pe_task *prev = NULL;
  *lastp = t;
  *k = 0;
  while (t) {
    pe_task *next = t->next;
    t->next = prev;
    prev = t;
    t = next;
    ++*k;
  }
  return prev;
}

static uint32_t xorshift(uint32_t *s) {
  uint32_t x = *s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

static void wake(pe_pool *p, int k);

/* The tasks a worker took beyond the one it runs go to the front of its
 * queue. Between the take and this push they were in no queue, so a worker
 * that looked for work then may have gone to sleep: wake it, or the moved
 * tasks wait behind the one this worker runs. */
static void move_rest(pe_pool *p, worker *self, pe_task *first, pe_task *last, int k) {
  queue_push(&self->q, first, last, k, true);
  wake(p, k);
}

/* Own queue, urgent and inject stacks, then the others starting at a
 * random victim. self is NULL for a thread outside the pool: it only
 * steals single tasks from the workers (it has no queue to keep the rest
 * of a stack in). */
/* The urgent stack, else the inject stack: the oldest task, the rest to
 * the front of self's queue. */
static pe_task *take_stacks(pe_pool *p, worker *self) {
  pe_task *last, *t;
  int k;
  if ((t = stack_take_all(&p->urgent, &last, &k)) || (t = stack_take_all(&p->inject, &last, &k))) {
    if (k > 1) move_rest(p, self, t->next, last, k - 1);
    return t;
  }
  return NULL;
}

/* Every FAIR_EVERY-th look a worker takes the stacks before its own queue.
 * Its own submissions go to the queue's front, so while runs keep it busy
 * (one worker, two long runs) the queue never empties, and without this an
 * outside submission (a new run's first step, the engine ops of a model
 * freed by a close) would wait for seconds. */
#define FAIR_EVERY 8

static pe_task *find_task(pe_pool *p, worker *self) {
  pe_task *last;
  int k;
  pe_task *t;
  if (self && ++self->looks % FAIR_EVERY == 0 && (t = take_stacks(p, self))) return t;
  if (self && (t = queue_take(&self->q, 1, &last, &k))) return t;
  if (self && (t = take_stacks(p, self))) return t;
  int n = n_workers(p);
  if (n == 1 && self) return NULL;
  uint32_t seed = self ? xorshift(&self->rng) : (uint32_t)(uintptr_t)&last;
  int start = (int)(seed % (uint32_t)n);
  for (int i = 0; i < n; i++) {
    int vi = (start + i) % n;
    worker *v = &p->w[vi];
    if (v == self) continue;
    int qn = queue_hint(&v->q);
    if (!qn) continue;
    if (self && qn < STEAL_MAX) {
      unsigned tk = atomic_load_explicit(&v->q.takes, memory_order_relaxed);
      if (self->seen[vi] != tk) { /* moved since we last looked: wait */
        self->seen[vi] = tk;
        continue;
      }
    }
    t = queue_take(&v->q, self ? STEAL_MAX : 1, &last, &k);
    if (!t) continue;
    if (k > 1) move_rest(p, self, t->next, last, k - 1);
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

/* The submitter's half of the protocol: read the sleepers after the push.
 * ThreadSanitizer does not model fences, so its builds use the other
 * standard form: an acq_rel RMW on `idle` itself. It reads the latest
 * value; if it comes before the worker's increment, that increment
 * acquires our push instead. (Release builds keep the fence, which does
 * not make every submitter write the shared `idle` line.) */
static inline int sleepers_after_push(pe_pool *p) {
#ifdef __SANITIZE_THREAD__
  return (int)(uint32_t)atomic_fetch_add_explicit(&p->idle, 0, memory_order_acq_rel);
#else
  atomic_thread_fence(memory_order_seq_cst); /* pairs with worker_idle's */
  return (int)(uint32_t)atomic_load_explicit(&p->idle, memory_order_relaxed);
#endif
}

static void wake(pe_pool *p, int k) {
  int sl = sleepers_after_push(p);
  if (sl == 0) return;
  /* Release: a worker that reads the new seq with acquire sees the task. */
  atomic_fetch_add_explicit(&p->seq, 1, memory_order_release);
  futex_wake(&p->seq, k < sl ? k : sl);
}

/* Stopping: every worker idle and nothing queued, observed over a scan
 * that no worker interrupted (see top of file). */
static bool pool_drained(pe_pool *p) {
  uint64_t a = atomic_load_explicit(&p->idle, memory_order_acquire);
  int n = atomic_load_explicit(&p->started, memory_order_relaxed);
  if ((uint32_t)a != (uint32_t)n || any_work(p)) return false;
  return atomic_load_explicit(&p->idle, memory_order_acquire) == a;
}

/* Returns false when the worker should exit. */
static bool worker_idle(pe_pool *p) {
  /* One poll interval even without spinning: a thief watching a victim
   * (see find_task) comes back here until the victim looks stalled. */
  long deadline = now_ns() + p->spin_ns;
  int rounds = 0;
  do {
    for (int i = 0; i < 32; i++) cpu_relax();
    if (any_work(p)) return true;
    /* Other threads may want this core (tests run 8 workers on 2). */
    if ((++rounds & 15) == 0) sched_yield();
  } while (now_ns() < deadline);
  unsigned s = atomic_load_explicit(&p->seq, memory_order_acquire);
  bool stopping = atomic_load_explicit(&p->stop, memory_order_acquire);
  /* acq_rel: a stopping worker that acquires `idle` sees our pushes;
   * acquire is the TSan-build half of sleepers_after_push. */
  atomic_fetch_add_explicit(&p->idle, 1, memory_order_acq_rel);
#ifndef __SANITIZE_THREAD__
  atomic_thread_fence(memory_order_seq_cst); /* pairs with wake() */
#endif
  bool go_on = true;
  if (atomic_load_explicit(&p->drained, memory_order_acquire)) {
    go_on = false;
  } else if (any_work(p)) {
  } else if (stopping && pool_drained(p)) {
    atomic_store_explicit(&p->drained, true, memory_order_release);
    atomic_fetch_add_explicit(&p->seq, 1, memory_order_release);
    futex_wake(&p->seq, INT32_MAX);
    go_on = false;
  } else {
    futex_wait(&p->seq, s);
  }
  /* sleepers - 1, epoch + 1 (sleepers >= 1: no borrow) */
  atomic_fetch_add_explicit(&p->idle, (UINT64_C(1) << 32) - 1, memory_order_relaxed);
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

/* Set up worker slot i (its queue, identity and victim state). */
static void slot_init(pe_pool *p, int i) {
  worker *w = &p->w[i];
  queue_init(&w->q);
  w->pool = p;
  w->id = i;
  w->rng = 0x9e3779b9u * (uint32_t)(i + 1);
  memset(w->seen, 0xff, sizeof w->seen);
  p->inited = i + 1;
}

static void pool_destroy(pe_pool *p, int started) {
  atomic_store_explicit(&p->stop, true, memory_order_release);
  atomic_fetch_add_explicit(&p->seq, 1, memory_order_release);
  futex_wake(&p->seq, INT32_MAX);
  for (int i = 0; i < started; i++) pthread_join(p->w[i].thread, NULL);
  for (int i = 0; i < p->inited; i++) pthread_mutex_destroy(&p->w[i].q.mu);
  pthread_mutex_destroy(&p->grow_mu);
  free(p->w);
  free(p);
}

pe_status *pe_pool_new(int n_threads, const pe_pool_opts *opts, pe_pool **out) {
  *out = NULL;
  if (n_threads < 1 || n_threads > PE_POOL_MAX_THREADS)
    return pe_error(PE_EINVAL, "thread pool: %d threads (want 1..%d)", n_threads,
                    PE_POOL_MAX_THREADS);
  int cap = opts && opts->max_threads > n_threads ? opts->max_threads : n_threads;
  if (cap > PE_POOL_MAX_THREADS) cap = PE_POOL_MAX_THREADS;
  pe_pool *p = aligned_alloc(64, (sizeof(pe_pool) + 63) / 64 * 64);
  worker *w = aligned_alloc(64, sizeof(worker) * (size_t)cap);
  if (!p || !w) {
    free(p);
    free(w);
    return pe_error(PE_ENOMEM, "thread pool: %d workers", n_threads);
  }
  memset(p, 0, sizeof *p);
  memset(w, 0, sizeof(worker) * (size_t)cap);
  atomic_init(&p->n, n_threads);
  p->cap = cap;
  p->w = w;
  pthread_mutex_init(&p->grow_mu, NULL);
  if (opts) p->opts = *opts;
  int spin_us = p->opts.spin_us == 0 ? DEFAULT_SPIN_US : p->opts.spin_us;
  p->spin_ns = spin_us > 0 ? spin_us * 1000L : 0;
  atomic_init(&p->inject, NULL);
  atomic_init(&p->urgent, NULL);
  atomic_init(&p->seq, 0);
  atomic_init(&p->idle, 0);
  atomic_init(&p->stop, false);
  atomic_init(&p->drained, false);
  atomic_init(&p->started, 0);
  for (int i = 0; i < n_threads; i++) slot_init(p, i);
  for (int i = 0; i < n_threads; i++) {
    int rc = pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
    if (!rc) atomic_fetch_add_explicit(&p->started, 1, memory_order_relaxed);
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
  pool_destroy(pool, n_workers(pool));
}

pe_status *pe_pool_grow(pe_pool *pool, int n_threads) {
  pthread_mutex_lock(&pool->grow_mu);
  pe_status *st = NULL;
  if (n_threads > pool->cap)
    st = pe_error(PE_EINVAL, "thread pool: %d workers asked, at most %d (max_threads)", n_threads,
                  pool->cap);
  int to = n_threads < pool->cap ? n_threads : pool->cap;
  for (int i = n_workers(pool); i < to; i++) {
    slot_init(pool, i);
    int rc = pthread_create(&pool->w[i].thread, NULL, worker_main, &pool->w[i]);
    if (rc) {
      pe_status_free(st);
      st = pe_error(PE_EINTERNAL, "thread pool: starting worker %d: %s", i, strerror(rc));
      break;
    }
    atomic_fetch_add_explicit(&pool->started, 1, memory_order_relaxed);
    atomic_store_explicit(&pool->n, i + 1, memory_order_release);
  }
  pthread_mutex_unlock(&pool->grow_mu);
  return st;
}

int pe_pool_threads(const pe_pool *pool) {
  return n_workers(pool);
}

int pe_pool_current_worker(void) {
  return tl_worker;
}

bool pe_pool_is_worker(const pe_pool *pool) {
  return tl_pool == pool;
}

void pe_pool_submit_batch(pe_pool *pool, pe_task *first, pe_task *last, int n) {
  if (n <= 0) return;
  if (tl_pool == pool)
    queue_push(&pool->w[tl_worker].q, first, last, n, true);
  else
    stack_push(&pool->inject, first, last);
  wake(pool, n);
}

/* Worker w mod threads's queue (w may be any int). */
static task_queue *home_queue(pe_pool *pool, int w) {
  int n = n_workers(pool);
  return &pool->w[(w % n + n) % n].q;
}

void pe_pool_submit_to(pe_pool *pool, int w, pe_task *first, pe_task *last, int n) {
  if (n <= 0) return;
  queue_push(home_queue(pool, w), first, last, n, false);
  wake(pool, n_workers(pool)); /* any sleeper may be the one: wake them all */
}

void pe_pool_submit_to_front(pe_pool *pool, int w, pe_task *task) {
  queue_push(home_queue(pool, w), task, task, 1, true);
  wake(pool, n_workers(pool));
}

void pe_pool_submit(pe_pool *pool, pe_task *task) {
  pe_pool_submit_batch(pool, task, task, 1);
}

void pe_pool_submit_local(pe_pool *pool, pe_task *task) {
  pe_pool_submit_batch(pool, task, task, 1);
}

void pe_pool_submit_urgent(pe_pool *pool, pe_task *task) {
  if (tl_pool == pool)
    queue_push(&pool->w[tl_worker].q, task, task, 1, true);
  else
    stack_push(&pool->urgent, task, task);
  wake(pool, 1);
}

bool pe_pool_run_one(pe_pool *pool) {
  pe_task *t = find_task(pool, tl_pool == pool ? &pool->w[tl_worker] : NULL);
  if (!t) return false;
  run_task(t);
  return true;
}
