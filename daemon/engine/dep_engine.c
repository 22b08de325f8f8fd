/* Dependency engine: per-variable FIFO queues, one atomic counter per op.
 * The ops' memory is dep_op_cache.c.
 *
 * Variable state (guarded by var->mu, except as noted):
 *   writer   a granted mutation not yet completed
 *   head     accesses waiting to be granted, in push order
 *   state    atomic: (granted reads not yet completed) << 1 | (queue not
 *            empty). Reads are added and the bit changed under mu only;
 *            completing reads subtract without the lock.
 * Invariant: when !writer, the head of the queue (if any) is a mutation
 * (leading reads are granted as soon as a mutation completes).
 *
 * Why one word: a completing read does a single fetch_sub and, unless
 * it was the last read while a mutation waits (old state == 3), never
 * touches the variable again, so a delete pushed meanwhile can free it.
 * When it is the last read with a waiter it takes the lock and grants the
 * mutation at the head; nobody else can grant it, so the variable is
 * alive until then. A mutation that queues behind granted reads sets the
 * bit with fetch_or, whose result says whether the reads have all
 * finished in the meantime; then it grants itself (same word, so the two
 * RMWs are totally ordered: exactly one side sees the other).
 *
 * An access is granted at push when nothing is queued and it does not
 * conflict with the granted ones; otherwise it waits in the queue and
 * counts in its op's `pending`. Completing an op releases each of its
 * accesses (one variable lock at a time) and grants what follows; each
 * grant decrements the waiting op's counter (acq_rel: the completer's
 * writes, including those of fn, become visible to whoever runs the op).
 *
 * Ownership: an op, with its dependency entries (struct dep) in the same
 * allocation, belongs to the engine from push until it completes; its
 * entries sit in variable queues while waiting. A grant unlinks the entry
 * before it touches the op's counter, because the op may run and be freed
 * as soon as the counter reaches zero. var->err is written only by the
 * op holding the variable's mutation grant (or under var->mu during that
 * op's release), so ops holding a grant read it without the lock.
 *
 * An op whose fn returned PE_ENGINE_PENDING keeps its grants and its place
 * in n_ops; the thread that calls pe_engine_op_complete does the completion
 * (op_finish) in the worker's stead, so from fn's return on only that
 * thread may touch the op. */
#define _GNU_SOURCE
#include "dep_engine.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "dep_engine_internal.h"

enum {
  OP_ALWAYS = 1, /* internal: runs even when its variables carry errors */
  OP_DELETE = 2, /* internal: frees its (single) mutated variable */
  OP_KEEP = 4,   /* pe_engine_op_keep: its owner frees it, not its completion */
};

struct pe_engine_var {
  pthread_mutex_t mu;
  struct dep *head, *tail;    /* waiting accesses (mu) */
  atomic_uint state;          /* reads << 1 | queued (see above) */
  bool writer;                /* granted mutation (mu) */
  pe_status *err;             /* see the ownership note above */
  pe_engine_var *prev, *next; /* engine's list of live variables (eng->mu) */
};

struct pe_engine {
  pe_pool *pool; /* read-only after creation */
  /* Pushed and not completed; 1 -> 0 only under mu. Written by pushers
   * and completers on every op: on a cache line of its own. */
  alignas(64) atomic_int n_ops;
  alignas(64) pthread_mutex_t mu;
  pthread_cond_t idle; /* broadcast when n_ops reaches 0 */
  pe_status *err;      /* first failure since the last wait_all (mu) */
  pe_engine_var *vars; /* live variables (mu) */
};

static pe_status *status_copy(const pe_status *st) {
  return pe_error(pe_status_code(st), "%s", pe_status_msg(st));
}

/* --- variables --------------------------------------------------------------------- */

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

pe_status *pe_engine_new_var(pe_engine *eng, pe_engine_var **out) {
  *out = NULL;
  pe_engine_var *v = calloc(1, sizeof *v);
  if (!v) return pe_error(PE_ENOMEM, "engine: new variable");
  short_mutex_init(&v->mu);
  pthread_mutex_lock(&eng->mu);
  v->next = eng->vars;
  if (eng->vars) eng->vars->prev = v;
  eng->vars = v;
  pthread_mutex_unlock(&eng->mu);
  *out = v;
  return NULL;
}

int pe_engine_var_count(pe_engine *eng) {
  int n = 0;
  pthread_mutex_lock(&eng->mu);
  for (pe_engine_var *v = eng->vars; v; v = v->next) n++;
  pthread_mutex_unlock(&eng->mu);
  return n;
}

static void var_destroy(pe_engine *eng, pe_engine_var *v) {
  pthread_mutex_lock(&eng->mu);
  if (v->prev)
    v->prev->next = v->next;
  else
    eng->vars = v->next;
  if (v->next) v->next->prev = v->prev;
  pthread_mutex_unlock(&eng->mu);
  pe_status_free(v->err);
  pthread_mutex_destroy(&v->mu);
  free(v);
}

static inline unsigned var_reads(const pe_engine_var *v, memory_order mo) {
  return atomic_load_explicit(&v->state, mo) >> 1;
}

/* Append under mu. Returns the state before the queued bit was set. */
static unsigned var_enqueue(pe_engine_var *v, dep *d) {
  d->next = NULL;
  bool was_empty = !v->head;
  if (v->tail)
    v->tail->next = d;
  else
    v->head = d;
  v->tail = d;
  /* acq_rel: if the reads turn out finished, we acquire their effects. */
  return was_empty ? atomic_fetch_or_explicit(&v->state, 1u, memory_order_acq_rel)
                   : atomic_load_explicit(&v->state, memory_order_acquire);
}

static dep *var_dequeue(pe_engine_var *v) {
  dep *d = v->head;
  v->head = d->next;
  if (!v->head) {
    v->tail = NULL;
    atomic_fetch_and_explicit(&v->state, ~1u, memory_order_relaxed);
  }
  return d;
}

/* --- ready lists ------------------------------------------------------------------- */

typedef struct ready_list {
  pe_engine_op *head, *tail;
  int n;
  bool mixed; /* priorities differ */
} ready_list;

static void ready_add(ready_list *r, pe_engine_op *op) {
  op->ready_next = NULL;
  if (r->tail) {
    if (op->priority != r->head->priority) r->mixed = true;
    r->tail->ready_next = op;
  } else {
    r->head = op;
  }
  r->tail = op;
  r->n++;
}

/* Stable merge sort by descending priority (only when priorities differ;
 * a fan-out can release many ops at once, so no quadratic sort). */
static pe_engine_op *sort_by_priority(pe_engine_op *h, int n) {
  if (n < 2) return h;
  pe_engine_op *mid = h;
  for (int i = 1; i < n / 2; i++) mid = mid->ready_next;
  pe_engine_op *b = mid->ready_next;
  mid->ready_next = NULL;
  pe_engine_op *a = sort_by_priority(h, n / 2);
  b = sort_by_priority(b, n - n / 2);
  pe_engine_op head = {0}, *t = &head;
  while (a && b) {
    if (b->priority > a->priority) {
      t->ready_next = b;
      b = b->ready_next;
    } else {
      t->ready_next = a;
      a = a->ready_next;
    }
    t = t->ready_next;
  }
  t->ready_next = a ? a : b;
  return head.ready_next;
}

/* --- scheduling ---------------------------------------------------------------------- */

static void op_task(void *arg);

/* Drop one of op's dependencies; true when op became ready (the caller
 * now owns scheduling it). acq_rel: releases our writes to the op's
 * eventual runner and acquires everyone else's. */
static inline bool op_dep_drop(pe_engine_op *op, int k) {
  return atomic_fetch_sub_explicit(&op->pending, k, memory_order_acq_rel) == k;
}

static void grant(dep *d, ready_list *r) {
  pe_engine_op *op = d->op; /* d is unlinked already; op may be freed after the drop */
  if (op_dep_drop(op, 1)) ready_add(r, op);
}

/* homed: the op goes to its affinity worker from any thread (a start, not
 * a completing predecessor's worker). */
static void op_submit(pe_engine *eng, pe_engine_op *op, bool at_push, bool homed) {
  op->task.fn = op_task;
  op->task.arg = op;
  if (at_push && op->priority > 0)
    pe_pool_submit_urgent(eng->pool, &op->task);
  else if (op->affinity > 0 && homed)
    pe_pool_submit_to_front(eng->pool, op->affinity - 1, &op->task);
  else if (op->affinity > 0 && !pe_pool_is_worker(eng->pool))
    pe_pool_submit_to(eng->pool, op->affinity - 1, &op->task, &op->task, 1);
  else
    pe_pool_submit(eng->pool, &op->task);
}

/* Schedule a ready list: returns the op to run inline (highest priority),
 * submits the rest as one batch, highest priority first. */
static pe_engine_op *schedule(pe_engine *eng, ready_list *r) {
  if (!r->head) return NULL;
  pe_engine_op *h = r->mixed ? sort_by_priority(r->head, r->n) : r->head;
  pe_engine_op *first = h->ready_next;
  if (first) {
    pe_engine_op *last = first;
    first->task.fn = op_task;
    first->task.arg = first;
    for (pe_engine_op *o = first->ready_next; o; o = o->ready_next) {
      o->task.fn = op_task;
      o->task.arg = o;
      last->task.next = &o->task;
      last = o;
    }
    pe_pool_submit_batch(eng->pool, &first->task, &last->task, r->n - 1);
  }
  return h;
}

/* --- completion ------------------------------------------------------------------------ */

/* Release one access. fail: the op's outcome (borrowed), stored on
 * mutated variables that have no error yet. */
static void release(dep *d, const pe_status *fail, ready_list *r) {
  pe_engine_var *v = d->var;
  if (!d->write) {
    /* acq_rel: the last read acquires the other reads' releases and
     * passes them on to the mutation it grants. Unless this was the last
     * read with a waiter (1 read, queued bit), v must not be touched. */
    if (atomic_fetch_sub_explicit(&v->state, 2u, memory_order_acq_rel) != 3u) return;
    pthread_mutex_lock(&v->mu);
    if (v->head && !v->writer && var_reads(v, memory_order_relaxed) == 0) {
      v->writer = true; /* the head is a mutation (invariant) */
      grant(var_dequeue(v), r);
    }
    pthread_mutex_unlock(&v->mu);
    return;
  }
  pthread_mutex_lock(&v->mu);
  if (fail && !v->err) v->err = status_copy(fail);
  v->writer = false;
  if (v->head && v->head->write) {
    v->writer = true;
    grant(var_dequeue(v), r);
  } else {
    while (v->head && !v->head->write) {
      atomic_fetch_add_explicit(&v->state, 2u, memory_order_relaxed);
      grant(var_dequeue(v), r);
    }
  }
  pthread_mutex_unlock(&v->mu);
}

static void record_error(pe_engine *eng, pe_status *st) {
  pthread_mutex_lock(&eng->mu);
  if (!eng->err) {
    eng->err = st;
    st = NULL;
  }
  pthread_mutex_unlock(&eng->mu);
  pe_status_free(st);
}

/* The last touch of engine memory by a completing op. 1 -> 0 happens
 * under mu so that a waiter that sees 0 under mu knows no completer is
 * still about to use mu (pe_engine_free may follow at once). Release:
 * wait_all's acquire sees the effects of every completed op. */
static void op_count_done(pe_engine *eng) {
  /* Start with a guess instead of a load: the first CAS then fetches the
   * line for writing at once (one cache transfer instead of two). */
  int n = 2;
  for (;;) {
    if (n == 1) {
      pthread_mutex_lock(&eng->mu);
      if (atomic_fetch_sub_explicit(&eng->n_ops, 1, memory_order_release) == 1)
        pthread_cond_broadcast(&eng->idle);
      pthread_mutex_unlock(&eng->mu);
      return;
    }
    if (atomic_compare_exchange_weak_explicit(&eng->n_ops, &n, n - 1, memory_order_release,
                                              memory_order_relaxed))
      return;
  }
}

/* Complete op with outcome st (owned): release its variables, call
 * on_done, record the error, free the op. Returns one newly ready op for
 * the caller to run next (or to submit); the rest are queued. */
static pe_engine_op *op_finish(pe_engine_op *op, pe_status *st) {
  pe_engine *eng = op->eng;
  ready_list r = {0};
  pe_engine_var *dead = NULL;
  for (int i = 0; i < op->n_deps; i++) {
    release(&op->deps[i], (op->flags & OP_ALWAYS) ? NULL : st, &r);
    if (op->flags & OP_DELETE) dead = op->deps[i].var;
  }
  pe_engine_op *next = schedule(eng, &r);
  if (dead) {
    /* Our release left the variable idle unless ops were pushed on it
     * after the delete; then it must stay alive for them. */
    pthread_mutex_lock(&dead->mu);
    bool idle = !dead->head && !dead->writer &&
                atomic_load_explicit(&dead->state, memory_order_relaxed) == 0;
    pthread_mutex_unlock(&dead->mu);
    if (idle)
      var_destroy(eng, dead);
    else
      PE_LOGE("engine: variable %p used after pe_engine_delete_var; not freed", (void *)dead);
  }
  /* A kept op may be pushed again (or freed) by its owner as soon as
   * on_done ran: from there on only these copies are used. */
  int flags = op->flags, n_alloc = op->n_alloc;
  if (op->on_done) op->on_done(op->arg, st);
  if (st && !(flags & OP_ALWAYS))
    record_error(eng, st);
  else
    pe_status_free(st);
  if (!(flags & OP_KEEP)) op_release_mem(op, n_alloc);
  op_count_done(eng); /* next (if any) is still counted: eng stays alive */
  return next;
}

/* The sentinel's value is never read; only its address matters. Aligned
 * so that the cast to pe_status * in PE_ENGINE_PENDING is well defined. */
alignas(max_align_t) const char pe_engine_pending_tag = 0;

/* The op whose fn runs on this thread (see pe_engine_op_current). Saved and
 * restored around fn because a waiting fn may run other ops inline. */
static _Thread_local pe_engine_op *tl_current_op;

pe_engine_op *pe_engine_op_current(void) {
  return tl_current_op;
}

/* Run (or skip) op and complete it, returning one newly ready op for the
 * caller to run next; or, when fn returns PE_ENGINE_PENDING, leave it
 * running and return NULL (pe_engine_op_complete finishes it). */
static pe_engine_op *op_execute(pe_engine_op *op) {
  pe_status *st = NULL;
  bool skipped = false;
  if (!(op->flags & OP_ALWAYS)) {
    for (int i = 0; i < op->n_deps; i++) {
      pe_engine_var *v = op->deps[i].var;
      if (v->err) { /* we hold a grant on v: no writer can change err now */
        st = status_copy(v->err);
        skipped = true;
        break;
      }
    }
  }
  if (!skipped && op->fn) {
    pe_engine_op *outer = tl_current_op;
    tl_current_op = op;
    st = op->fn(op->arg);
    tl_current_op = outer;
    /* The op now belongs to whoever completes it, which may already have
     * happened on another thread (or inside fn): op may be freed, and so
     * may the engine if it was the last op. Touch neither. */
    if (st == PE_ENGINE_PENDING) return NULL;
  }
  return op_finish(op, st);
}

static void op_task(void *arg) {
  for (pe_engine_op *op = arg; op;) op = op_execute(op);
}

void pe_engine_op_complete(pe_engine *eng, pe_engine_op *op, pe_status *st) {
  /* Decide before op_finish: once it counted the op done, eng is kept
   * alive only by a returned successor. */
  bool on_worker = pe_pool_is_worker(eng->pool);
  if (st == PE_ENGINE_PENDING) /* a caller bug; never store the sentinel */
    st = pe_error(PE_EINVAL, "engine: pe_engine_op_complete given PE_ENGINE_PENDING as outcome");
  pe_engine_op *next = op_finish(op, st);
  if (!next) return;
  /* Inline only from a plain pool task (the last chunk): like a normal
   * completion, no queue hop. Inside an op's fn (an fn completing its own
   * op before returning PENDING, or completing another) running the
   * successors here would nest them in that fn, while it holds its grants,
   * and a chain of such completions would grow the stack without bound;
   * submitted from a worker, next still runs first on it (LIFO queue). */
  if (on_worker && !tl_current_op)
    op_task(next);
  else
    op_submit(eng, next, false, false); /* next is counted: eng is alive */
}

/* --- push -------------------------------------------------------------------------------- */

static int dep_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const dep *)a)->var, y = (uintptr_t)((const dep *)b)->var;
  return x < y ? -1 : x > y;
}

static void sort_deps(dep *d, int n) {
  if (n > 16) {
    qsort(d, (size_t)n, sizeof *d, dep_cmp);
    return;
  }
  for (int i = 1; i < n; i++) {
    dep x = d[i];
    int j = i;
    for (; j > 0 && (uintptr_t)d[j - 1].var > (uintptr_t)x.var; j--) d[j] = d[j - 1];
    d[j] = x;
  }
}

/* Build op's record from a: validated, its variables sorted and
 * deduplicated. Nothing is registered yet. */
static pe_status *op_build(pe_engine *eng, const pe_engine_op_args *a, int flags,
                           pe_engine_op **out) {
  *out = NULL;
  if (a->n_reads < 0 || a->n_mutates < 0 || a->extra_deps < 0 || (a->n_reads && !a->reads) ||
      (a->n_mutates && !a->mutates))
    return pe_error(PE_EINVAL, "engine: bad push (%d reads, %d mutates, %d extra deps)", a->n_reads,
                    a->n_mutates, a->extra_deps);
  int n = a->n_reads + a->n_mutates;
  pe_engine_op *op = op_alloc(n);
  if (!op) return pe_error(PE_ENOMEM, "engine: push (%d variables)", n);
  op->n_alloc = n;
  for (int i = 0; i < n; i++) {
    bool w = i >= a->n_reads;
    pe_engine_var *v = w ? a->mutates[i - a->n_reads] : a->reads[i];
    if (!v) {
      op_release_mem(op, n);
      return pe_error(PE_EINVAL, "engine: push: %s variable %d is NULL", w ? "mutated" : "read",
                      w ? i - a->n_reads : i);
    }
    op->deps[i] = (dep){.var = v, .next = NULL, .op = op, .write = w};
  }
  sort_deps(op->deps, n);
  int u = 0; /* deduplicate: a variable both read and mutated is mutated */
  for (int i = 0; i < n; i++) {
    if (u && op->deps[u - 1].var == op->deps[i].var)
      op->deps[u - 1].write |= op->deps[i].write;
    else
      op->deps[u++] = op->deps[i];
  }
  op->eng = eng;
  op->fn = a->fn;
  op->arg = a->arg;
  op->on_done = a->on_done;
  op->priority = a->priority;
  op->affinity = a->affinity;
  op->flags = flags;
  op->n_deps = u;
  *out = op;
  return NULL;
}

/* Register a built op: its counter is set in place, it takes its place in
 * its variables' queues and is submitted once ready. With extra_deps == 0
 * the op may be running (or done) when this returns. */
static void op_enqueue(pe_engine *eng, pe_engine_op *op, int extra_deps) {
  int u = op->n_deps;
  op->ready_next = NULL;
  op->task.next = NULL;
  /* Every dependency counted up front, plus one for the push itself; the
   * grants found below are subtracted in one step at the end. */
  atomic_store_explicit(&op->pending, u + extra_deps + 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&eng->n_ops, 1, memory_order_relaxed);

  /* Lock all variables in address order (deps are sorted), so that pushes
   * racing on shared variables enter every queue in the same order. */
  for (int i = 0; i < u; i++) pthread_mutex_lock(&op->deps[i].var->mu);
  int granted = 0;
  for (int i = 0; i < u; i++) {
    dep *d = &op->deps[i];
    pe_engine_var *v = d->var;
    bool idle = !v->head && !v->writer;
    if (!d->write) {
      if (idle)
        atomic_fetch_add_explicit(&v->state, 2u, memory_order_relaxed);
      else
        var_enqueue(v, d);
      granted += idle;
      continue;
    }
    /* Reads can only finish (not start) while we hold mu, so a zero
     * count stays zero. acquire: we see the finished reads' effects. */
    if (idle && var_reads(v, memory_order_acquire) == 0) {
      v->writer = true;
      granted++;
      continue;
    }
    unsigned before = var_enqueue(v, d);
    if (idle && (before >> 1) == 0) { /* the reads finished meanwhile */
      var_dequeue(v);
      v->writer = true;
      granted++;
    }
  }
  for (int i = u - 1; i >= 0; i--) pthread_mutex_unlock(&op->deps[i].var->mu);

  /* From here op may be completed by others unless it holds extra deps. */
  if (op_dep_drop(op, granted + 1)) op_submit(eng, op, true, false);
}

static pe_status *op_create(pe_engine *eng, const pe_engine_op_args *a, int flags,
                            pe_engine_op **out) {
  pe_engine_op *op;
  PE_TRY(op_build(eng, a, flags, &op));
  if (out) *out = a->extra_deps > 0 ? op : NULL;
  op_enqueue(eng, op, a->extra_deps);
  return NULL;
}

pe_status *pe_engine_op_new(pe_engine *eng, const pe_engine_op_args *args, pe_engine_op **out) {
  if (out) *out = NULL;
  return op_create(eng, args, 0, out);
}

void pe_engine_op_dep_done(pe_engine *eng, pe_engine_op *op) {
  if (op_dep_drop(op, 1)) op_submit(eng, op, false, false);
}

void pe_engine_op_start(pe_engine *eng, pe_engine_op *op) {
  if (op_dep_drop(op, 1)) op_submit(eng, op, false, true);
}

pe_status *pe_engine_op_keep(pe_engine *eng, const pe_engine_op_args *args, pe_engine_op **out) {
  return op_build(eng, args, OP_KEEP, out);
}

void pe_engine_op_push_kept(pe_engine *eng, pe_engine_op *op, int priority, int extra_deps) {
  op->priority = priority; /* read by completers once the op is queued or ready */
  op_enqueue(eng, op, extra_deps);
}

void pe_engine_op_free_kept(pe_engine_op *op) {
  if (op) op_release_mem(op, op->n_alloc);
}

pe_status *pe_engine_push(pe_engine *eng, pe_engine_fn fn, void *arg, pe_engine_var *const *reads,
                          int n_reads, pe_engine_var *const *mutates, int n_mutates, int priority) {
  pe_engine_op_args a = {.fn = fn,
                         .arg = arg,
                         .reads = reads,
                         .n_reads = n_reads,
                         .mutates = mutates,
                         .n_mutates = n_mutates,
                         .priority = priority};
  return op_create(eng, &a, 0, NULL);
}

/* --- internal ops -------------------------------------------------------------------------- */

static pe_status *clear_fn(void *arg) {
  pe_engine_var *v = arg; /* we hold v's mutation grant */
  pe_status_free(v->err);
  v->err = NULL;
  return NULL;
}

pe_status *pe_engine_clear_error(pe_engine *eng, pe_engine_var *var) {
  pe_engine_op_args a = {.fn = clear_fn, .arg = var, .mutates = &var, .n_mutates = 1};
  return op_create(eng, &a, OP_ALWAYS, NULL);
}

pe_status *pe_engine_delete_var(pe_engine *eng, pe_engine_var *var) {
  pe_engine_op_args a = {.mutates = &var, .n_mutates = 1};
  return op_create(eng, &a, OP_ALWAYS | OP_DELETE, NULL);
}

/* A waiter lives on the waiting thread's stack. A blocked thread waits on
 * the condition variable; a pool worker polls `flag` while it runs other
 * tasks. The signaller's last touch of the waiter is the unlock (blocked)
 * or the atomic store (polling), so the waiter may vanish right after. */
typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;        /* mu */
  atomic_bool flag; /* polling mode */
  bool polling;
  pe_engine_var *var;
  pe_status *err;
} waiter;

static pe_status *wait_fn(void *arg) {
  waiter *w = arg;
  /* We hold an exclusive grant on var: every earlier access is complete. */
  w->err = w->var->err ? status_copy(w->var->err) : NULL;
  if (w->polling) {
    atomic_store_explicit(&w->flag, true, memory_order_release);
  } else {
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
  }
  return NULL;
}

pe_status *pe_engine_wait_var(pe_engine *eng, pe_engine_var *var) {
  waiter w = {.var = var, .polling = pe_pool_is_worker(eng->pool)};
  atomic_init(&w.flag, false);
  if (!w.polling) {
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
  }
  /* Registered as a mutation so that it is granted only after every access
   * pushed before it, reads included (a read would be granted alongside
   * earlier pending reads). It changes nothing. */
  pe_engine_op_args a = {.fn = wait_fn, .arg = &w, .mutates = &var, .n_mutates = 1};
  pe_status *st = op_create(eng, &a, OP_ALWAYS, NULL);
  if (!st) {
    if (w.polling) {
      while (!atomic_load_explicit(&w.flag, memory_order_acquire))
        if (!pe_pool_run_one(eng->pool)) sched_yield();
    } else {
      pthread_mutex_lock(&w.mu);
      while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
      pthread_mutex_unlock(&w.mu);
    }
    st = w.err;
  }
  if (!w.polling) {
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
  }
  return st;
}

pe_status *pe_engine_wait_all(pe_engine *eng) {
  if (pe_pool_is_worker(eng->pool))
    return pe_error(PE_EINVAL, "engine: wait_all from a pool worker would wait for itself");
  pthread_mutex_lock(&eng->mu);
  while (atomic_load_explicit(&eng->n_ops, memory_order_acquire) > 0)
    pthread_cond_wait(&eng->idle, &eng->mu);
  pe_status *st = eng->err;
  eng->err = NULL;
  pthread_mutex_unlock(&eng->mu);
  return st;
}

/* --- engine ---------------------------------------------------------------------------------- */

pe_status *pe_engine_new(pe_pool *pool, pe_engine **out) {
  *out = NULL;
  if (!pool) return pe_error(PE_EINVAL, "engine: no pool");
  pe_engine *eng = aligned_alloc(64, (sizeof *eng + 63) / 64 * 64);
  if (!eng) return pe_error(PE_ENOMEM, "engine");
  memset(eng, 0, sizeof *eng);
  eng->pool = pool;
  atomic_init(&eng->n_ops, 0);
  pthread_mutex_init(&eng->mu, NULL);
  pthread_cond_init(&eng->idle, NULL);
  *out = eng;
  return NULL;
}

void pe_engine_free(pe_engine *eng) {
  if (!eng) return;
  if (pe_pool_is_worker(eng->pool)) {
    /* Cannot block here; help until every op has completed. */
    while (atomic_load_explicit(&eng->n_ops, memory_order_acquire) > 0)
      if (!pe_pool_run_one(eng->pool)) sched_yield();
    pthread_mutex_lock(&eng->mu); /* a completer may still hold mu */
    pthread_mutex_unlock(&eng->mu);
    pe_status_free(eng->err);
  } else {
    pe_status_free(pe_engine_wait_all(eng));
  }
  while (eng->vars) var_destroy(eng, eng->vars);
  pthread_cond_destroy(&eng->idle);
  pthread_mutex_destroy(&eng->mu);
  free(eng);
}
