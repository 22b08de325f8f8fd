/* Dependency engine, how ops get onto and off the workers: asynchronous
 * completion (PE_ENGINE_PENDING completed from a pool task, from a plain
 * thread, with a failure, by the last of a fan-out of chunk tasks) and
 * worker affinity of ready ops. Every wait has a deadline. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "engine/dep_engine.h"
#include "engine_test_util.h"

/* --- asynchronous completion (PE_ENGINE_PENDING) ---------------------------------------- */

static void sleep_ms(int ms) {
  struct timespec ts = {0, ms * 1000L * 1000L};
  nanosleep(&ts, NULL);
}

/* One op on v whose fn hands its completion to someone else: a pool task
 * or a plain thread that sleeps, writes `value` and completes the op. */
typedef struct deferred {
  pe_engine *eng;
  pe_pool *pool;
  pe_task task;
  _Atomic(pe_engine_op *) op; /* handed from fn to the completer */
  int value;                  /* written by the completer while the op holds v */
  atomic_int completing;      /* 1 once the completer is about to complete */
  atomic_int done_calls, done_code, done_after_complete;
  pe_status *(*outcome)(void); /* NULL: success */
} deferred;

static void deferred_complete(deferred *d) {
  sleep_ms(20);
  d->value = 42;
  atomic_store(&d->completing, 1);
  pe_engine_op_complete(d->eng, atomic_load(&d->op), d->outcome ? d->outcome() : NULL);
}

static void deferred_task(void *arg) {
  deferred_complete(arg);
}

static pe_status *deferred_to_pool_fn(void *arg) {
  deferred *d = arg;
  atomic_store(&d->op, pe_engine_op_current());
  pe_pool_submit(d->pool, &d->task);
  return PE_ENGINE_PENDING;
}

/* For a plain thread: publish the handle, which the thread polls for. */
static pe_status *deferred_to_thread_fn(void *arg) {
  deferred *d = arg;
  atomic_store(&d->op, pe_engine_op_current());
  return PE_ENGINE_PENDING;
}

static void *deferred_thread(void *arg) {
  deferred *d = arg;
  while (!atomic_load(&d->op)) sched_yield();
  deferred_complete(d);
  return NULL;
}

static void deferred_done(void *arg, const pe_status *st) {
  deferred *d = arg;
  atomic_store(&d->done_after_complete, atomic_load(&d->completing));
  atomic_store(&d->done_code, pe_status_code(st));
  atomic_fetch_add(&d->done_calls, 1);
}

static void push_deferred(env *e, deferred *d, pe_engine_fn fn, pe_engine_var *v) {
  d->eng = e->eng;
  d->pool = e->pool;
  d->task = (pe_task){deferred_task, d, NULL};
  pe_engine_op_args a = {
      .fn = fn, .arg = d, .on_done = deferred_done, .mutates = &v, .n_mutates = 1};
  OK(pe_engine_op_new(e->eng, &a, NULL));
}

/* Reads d->value under a grant on v. */
typedef struct value_reader {
  deferred *d;
  atomic_int seen, calls;
} value_reader;

static pe_status *value_reader_fn(void *arg) {
  value_reader *r = arg;
  atomic_store(&r->seen, r->d->value);
  atomic_fetch_add(&r->calls, 1);
  return NULL;
}

START_TEST(pending_op_holds_its_variables_until_completed) {
  for (int threads = 1; threads <= 2; threads++) {
    env e = env_new(threads);
    pe_engine_var *v;
    OK(pe_engine_new_var(e.eng, &v));
    deferred d = {0};
    value_reader r = {.d = &d};
    push_deferred(&e, &d, deferred_to_pool_fn, v);
    OK(pe_engine_push(e.eng, value_reader_fn, &r, &v, 1, NULL, 0, 0));
    OK(pe_engine_wait_all(e.eng));
    /* wait_all returned after the completion and everything it released */
    ck_assert_int_eq(atomic_load(&d.completing), 1);
    ck_assert_int_eq(atomic_load(&d.done_calls), 1);
    ck_assert_int_eq(atomic_load(&d.done_after_complete), 1);
    ck_assert_int_eq(atomic_load(&d.done_code), PE_OK);
    ck_assert_int_eq(atomic_load(&r.calls), 1);
    ck_assert_int_eq(atomic_load(&r.seen), 42); /* the read waited for the completion */
    ck_assert_ptr_null(pe_engine_op_current()); /* not inside an op here */
    env_free(&e);
  }
}
END_TEST

START_TEST(pending_op_completed_from_outside_the_pool) {
  for (int threads = 1; threads <= 2; threads++) {
    env e = env_new(threads);
    pe_engine_var *v, *w;
    OK(pe_engine_new_var(e.eng, &v));
    OK(pe_engine_new_var(e.eng, &w));
    deferred d = {0};
    value_reader r[3] = {{.d = &d}, {.d = &d}, {.d = &d}};
    probe after = {0};
    push_deferred(&e, &d, deferred_to_thread_fn, v);
    /* several successors become ready together: all are submitted */
    for (int i = 0; i < 3; i++)
      OK(pe_engine_push(e.eng, value_reader_fn, &r[i], &v, 1, NULL, 0, i));
    push_probe(e.eng, &after, v, w);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, deferred_thread, &d), 0);
    ck_assert_ptr_null(pe_engine_wait_var(e.eng, w)); /* waits through the chain */
    ck_assert_int_eq(atomic_load(&after.calls), 1);
    ck_assert_int_eq(atomic_load(&d.completing), 1);
    OK(pe_engine_wait_all(e.eng)); /* the readers run beside `after`: wait for them too */
    for (int i = 0; i < 3; i++) {
      ck_assert_int_eq(atomic_load(&r[i].calls), 1);
      ck_assert_int_eq(atomic_load(&r[i].seen), 42);
    }
    pthread_join(t, NULL);
    ck_assert_int_eq(atomic_load(&d.done_calls), 1);
    ck_assert_int_eq(atomic_load(&d.done_after_complete), 1);
    env_free(&e);
  }
}
END_TEST

static pe_status *shape_failure(void) {
  return pe_error(PE_ESHAPE, "op allreduce: chunk 3 of grad w has shape [7] (want [8])");
}

START_TEST(pending_op_completed_with_a_failure) {
  for (int threads = 1; threads <= 2; threads++) {
    env e = env_new(threads);
    pe_engine_var *v, *y, *other;
    OK(pe_engine_new_var(e.eng, &v));
    OK(pe_engine_new_var(e.eng, &y));
    OK(pe_engine_new_var(e.eng, &other));
    deferred d = {.outcome = shape_failure};
    probe reader = {0}, writer = {0}, independent = {0};
    push_deferred(&e, &d, deferred_to_pool_fn, v);
    push_probe(e.eng, &reader, v, y);    /* skipped: y gets the error */
    push_probe(e.eng, &writer, NULL, v); /* skipped */
    push_probe(e.eng, &independent, NULL, other);
    pe_status *st = pe_engine_wait_var(e.eng, v);
    ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
    ck_assert_str_eq(pe_status_msg(st), "op allreduce: chunk 3 of grad w has shape [7] (want [8])");
    pe_status_free(st);
    st = pe_engine_wait_var(e.eng, y);
    ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
    pe_status_free(st);
    st = pe_engine_wait_all(e.eng);
    ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
    pe_status_free(st);
    ck_assert_ptr_null(pe_engine_wait_var(e.eng, other));
    ck_assert_int_eq(atomic_load(&d.done_calls), 1);
    ck_assert_int_eq(atomic_load(&d.done_code), PE_ESHAPE);
    ck_assert_int_eq(atomic_load(&reader.calls), 0);
    ck_assert_int_eq(atomic_load(&writer.calls), 0);
    ck_assert_int_eq(atomic_load(&reader.done_calls), 1);
    ck_assert_int_eq(atomic_load(&writer.done_code), PE_ESHAPE);
    ck_assert_int_eq(atomic_load(&independent.calls), 1);
    env_free(&e);
  }
}
END_TEST

/* Fan-out: the op's fn submits N chunk tasks and returns at once; the one
 * that brings the countdown to zero completes the op. fn holds one count
 * itself while it submits, so it may be the last one (then it completes its
 * own op before returning PENDING). Chunks write plain slots, so a checker
 * that ran early would see stale slots (and TSan would report the race). */
#define FAN_CHUNKS 8

typedef struct fan fan;

typedef struct chunk {
  pe_task task;
  fan *f;
  int index;
} chunk;

struct fan {
  pe_engine *eng;
  pe_pool *pool;
  pe_engine_op *op; /* written by fn before it submits the chunks */
  atomic_int countdown;
  atomic_int increments;
  int round;             /* the current rep (fn's and the checker's, under v) */
  int slot[FAN_CHUNKS];  /* chunk i writes slot[i] = round */
  int checked, bad;      /* checker's and fn's (under v) */
  pe_engine_op **expect; /* [round - 1]: the handle op_new gave, or NULL */
  atomic_int done_calls; /* on_done of the fan ops */
  chunk chunks[FAN_CHUNKS];
};

static void fan_countdown(fan *f) {
  /* acq_rel: the last one sees every chunk's slot before it completes */
  if (atomic_fetch_sub_explicit(&f->countdown, 1, memory_order_acq_rel) == 1)
    pe_engine_op_complete(f->eng, f->op, NULL);
}

static void chunk_task(void *arg) {
  chunk *c = arg;
  fan *f = c->f;
  f->slot[c->index] = f->round;
  atomic_fetch_add_explicit(&f->increments, 1, memory_order_relaxed);
  fan_countdown(f);
}

static pe_status *fan_fn(void *arg) {
  fan *f = arg; /* we hold v: the previous round's chunks are all done */
  f->round++;
  f->op = pe_engine_op_current();
  pe_engine_op *want = f->expect[f->round - 1];
  if (!f->op || (want && f->op != want)) f->bad++;
  atomic_store_explicit(&f->countdown, FAN_CHUNKS + 1, memory_order_relaxed);
  for (int i = 0; i < FAN_CHUNKS; i++) {
    f->chunks[i] = (chunk){{chunk_task, &f->chunks[i], NULL}, f, i};
    pe_pool_submit(f->pool, &f->chunks[i].task);
  }
  fan_countdown(f); /* fn's own count */
  return PE_ENGINE_PENDING;
}

static void fan_done(void *arg, const pe_status *st) {
  (void)st;
  atomic_fetch_add(&((fan *)arg)->done_calls, 1);
}

static pe_status *fan_check_fn(void *arg) {
  fan *f = arg;
  f->checked++;
  if (atomic_load_explicit(&f->increments, memory_order_relaxed) != f->round * FAN_CHUNKS) f->bad++;
  for (int i = 0; i < FAN_CHUNKS; i++)
    if (f->slot[i] != f->round) f->bad++;
  return NULL;
}

START_TEST(fan_out_completes_on_the_last_chunk) {
  const int reps = 300 / SCALE;
  const int pools[] = {1, 2, 4};
  for (int p = 0; p < 3; p++) {
    env e = env_new(pools[p]);
    pe_engine_var *v;
    OK(pe_engine_new_var(e.eng, &v));
    fan f = {.eng = e.eng, .pool = e.pool, .expect = calloc((size_t)reps, sizeof(pe_engine_op *))};
    ck_assert_ptr_nonnull(f.expect);
    for (int i = 0; i < reps; i++) {
      /* odd rounds: held by an extra dependency, as the executor does, so
       * that op_new hands out the handle fn must also see */
      pe_engine_op_args a = {.fn = fan_fn,
                             .arg = &f,
                             .on_done = fan_done,
                             .mutates = &v,
                             .n_mutates = 1,
                             .extra_deps = i % 2};
      pe_engine_op *h = NULL;
      OK(pe_engine_op_new(e.eng, &a, &h));
      if (h) {
        f.expect[i] = h; /* before dep_done: the op cannot run yet */
        pe_engine_op_dep_done(e.eng, h);
      }
      OK(pe_engine_push(e.eng, fan_check_fn, &f, NULL, 0, &v, 1, 0));
    }
    OK(pe_engine_wait_all(e.eng));
    ck_assert_int_eq(f.round, reps);
    ck_assert_int_eq(f.checked, reps);
    ck_assert_int_eq(f.bad, 0);
    ck_assert_int_eq(atomic_load(&f.increments), reps * FAN_CHUNKS);
    ck_assert_int_eq(atomic_load(&f.done_calls), reps);
    env_free(&e);
    free(f.expect);
  }
}
END_TEST

/* --- affinity ------------------------------------------------------------------------- */

typedef struct aff_probe {
  atomic_int ran, worker;
} aff_probe;

static pe_status *aff_probe_fn(void *arg) {
  aff_probe *p = arg;
  atomic_store(&p->worker, pe_pool_current_worker());
  atomic_store(&p->ran, 1);
  return NULL;
}

/* An op with affinity w + 1, ready when pushed from outside the pool,
 * runs on worker w; affinity to a worker that is busy is a preference
 * only: the op still runs (stolen), with the worker still blocked. */
START_TEST(affinity_places_ready_ops) {
  for (int round = 0; round < 20; round++) {
    env e = env_new(2);
    worker_block b = {0};
    int busy = worker_block_start(e.pool, &b), free_w = 1 - busy;
    pe_engine_var *v;
    OK(pe_engine_new_var(e.eng, &v));
    aff_probe to_free = {0}, to_busy = {0};
    pe_engine_op_args a = {
        .fn = aff_probe_fn, .arg = &to_free, .mutates = &v, .n_mutates = 1, .affinity = free_w + 1};
    OK(pe_engine_op_new(e.eng, &a, NULL));
    ck_assert(wait_at_least(&to_free.ran, 1, 10));
    ck_assert_int_eq(atomic_load(&to_free.worker), free_w);
    a.arg = &to_busy;
    a.affinity = busy + 1;
    OK(pe_engine_op_new(e.eng, &a, NULL));
    ck_assert_msg(wait_at_least(&to_busy.ran, 1, 10), "op stuck behind a busy worker");
    ck_assert_int_eq(atomic_load(&to_busy.worker), free_w);
    ck_assert_int_eq(atomic_load(&b.open), 0);
    atomic_store(&b.open, 1);
    OK(pe_engine_wait_all(e.eng));
    OK(pe_engine_delete_var(e.eng, v));
    env_free(&e);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dep_engine_sched");
  TCase *tc = tcase_create("sched");
  tcase_add_test(tc, pending_op_holds_its_variables_until_completed);
  tcase_add_test(tc, pending_op_completed_from_outside_the_pool);
  tcase_add_test(tc, pending_op_completed_with_a_failure);
  tcase_add_test(tc, fan_out_completes_on_the_last_chunk);
  tcase_add_test(tc, affinity_places_ready_ops);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
