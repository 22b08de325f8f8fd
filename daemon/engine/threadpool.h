/* The worker pool: N threads, one task queue per worker, work stealing.
 *
 * Tasks are intrusive (pe_task: fn, arg, next): the pool never allocates,
 * so submitting cannot fail. The submitter owns the task memory; the pool
 * reads task->fn and task->arg, unlinks the task and then calls fn(arg).
 * From that call on the pool never touches the task again, so fn may free
 * or resubmit it.
 *
 * Where a task goes:
 *  - pe_pool_submit from a thread outside the pool goes to the shared
 *    inject queue (a lock-free stack that workers empty in one step,
 *    oldest first);
 *  - pe_pool_submit from a worker of this pool, or pe_pool_submit_local,
 *    pushes to the front of that worker's own queue (LIFO: the next task it
 *    runs is the one it just made ready, whose inputs are still in cache).
 * A worker looks for work in its own queue, then the inject queue (taking
 * all of it into its own queue; every 8th look the inject queue comes
 * first, so that a queue kept busy by its own submissions does not starve
 * outside ones), then steals from the other workers (a
 * batch of up to half a victim's queue; from a short queue only once the
 * victim has not taken a task for one poll interval, ~0.5 us, so that
 * owners that keep up are not slowed by thieves). Each worker queue has
 * its own mutex, held for a few pointer moves: there is no global lock on
 * the hot path.
 *
 * Idle workers spin briefly, then sleep on a futex; threadpool.c explains
 * the protocol that keeps wake-ups from being lost.
 *
 * pe_pool_free runs every task already submitted (and every task those
 * submit) before it joins the threads; no worker leaves while another one
 * is still running a task. */
#ifndef PE_ENGINE_THREADPOOL_H
#define PE_ENGINE_THREADPOOL_H

#include <stdbool.h>

#include "core/status.h"

typedef struct pe_task {
  void (*fn)(void *arg);
  void *arg;
  struct pe_task *next; /* owned by the pool while the task is queued */
} pe_task;

typedef struct pe_pool_opts {
  /* Called on each worker thread before it takes any task, and after it
   * took its last one (both may be NULL). The executor binds per-thread
   * state here (for example the OpenMP team size of that worker). */
  void (*on_start)(int worker, void *ctx);
  void (*on_stop)(int worker, void *ctx);
  void *ctx;
  /* Microseconds an idle worker polls the queues before it sleeps (0: the
   * default, 50; negative: sleep at once). Spinning trades CPU for the
   * latency of a futex wake-up (several microseconds). */
  int spin_us;
  /* The most workers pe_pool_grow may bring the pool to (<= n_threads: it
   * cannot grow). Slots for them are allocated at pe_pool_new. */
  int max_threads;
} pe_pool_opts;

typedef struct pe_pool pe_pool;

/* n_threads >= 1 (at most 256). opts may be NULL. */
pe_status *pe_pool_new(int n_threads, const pe_pool_opts *opts, pe_pool **out);
/* Waits until the pool is drained (every task submitted so far, and every
 * task those submit, has run and all workers are idle), then joins the
 * workers. No submission from outside the pool may race with or follow
 * this call. NULL is a no-op. */
void pe_pool_free(pe_pool *pool);

/* Workers now (grows with pe_pool_grow, never shrinks). */
int pe_pool_threads(const pe_pool *pool);
/* Start workers until the pool has n_threads (nothing when it has that
 * many); the pool never shrinks. Beyond opts.max_threads it grows to that
 * and says so; a thread that cannot be started stops the growth with its
 * reason. Any thread, while tasks run; not with or after pe_pool_free. */
pe_status *pe_pool_grow(pe_pool *pool, int n_threads);

/* Any thread. Routes to the caller's own queue when it is a worker of
 * this pool, to the inject queue otherwise. */
void pe_pool_submit(pe_pool *pool, pe_task *task);
/* Any thread: first..last linked through ->next (last->next is ignored),
 * n tasks. Same routing as pe_pool_submit; one lock and one wake-up check
 * for the whole batch. Order is kept: first runs first if one thread
 * takes them all. */
void pe_pool_submit_batch(pe_pool *pool, pe_task *first, pe_task *last, int n);
/* Like pe_pool_submit, but from outside the pool the task goes to a
 * second inject queue that workers empty before the normal one. */
void pe_pool_submit_urgent(pe_pool *pool, pe_task *task);
/* From a worker of this pool: push to its own queue. Called from another
 * thread it behaves like pe_pool_submit. */
void pe_pool_submit_local(pe_pool *pool, pe_task *task);
/* Any thread: first..last (n tasks) to the back of worker (w mod threads)'s
 * queue, after the tasks it has. Placement, not a promise: an idle worker
 * may still steal them. For work that should stay on one core across runs
 * (a place's ops: its inputs and replicas stay in that core's cache). */
void pe_pool_submit_to(pe_pool *pool, int w, pe_task *first, pe_task *last, int n);
/* pe_pool_submit_to, but to the front of the queue, before the tasks it
 * has: a step's first ops ahead of background work queued there earlier
 * (the next batches' rows, pe_prefetch). */
void pe_pool_submit_to_front(pe_pool *pool, int w, pe_task *task);

/* Pop one task the caller could run (own queue, inject queue, steal) and
 * run it. Returns false when none was found. For threads that must wait
 * for work of this pool to finish while being one of its workers. */
bool pe_pool_run_one(pe_pool *pool);

/* The calling thread's worker index in its pool, -1 outside any pool. */
int pe_pool_current_worker(void);
/* Whether the calling thread is a worker of this pool. */
bool pe_pool_is_worker(const pe_pool *pool);

#endif
