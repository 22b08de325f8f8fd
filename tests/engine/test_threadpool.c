/* Thread pool: every task runs exactly once (external and internal
 * submission, 1..8 workers), stealing, FIFO and urgent order from outside,
 * outside submissions not starved by a worker's own,
 * no lost wake-ups over many sleep/wake rounds, free drains, worker ids and
 * start/stop hooks, run_one, submit_to placement, growing, tasks a worker
 * moves into its queue waking a sleeper. Waits in the tests have deadlines, so a
 * lost wake-up fails instead of hanging. */
#define _GNU_SOURCE
#include <check.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "engine/threadpool.h"
#include "engine_test_util.h"
#include "test_assert.h"

static pe_pool *new_pool(int n, int spin_us) {
  pe_pool_opts o = {.spin_us = spin_us};
  pe_pool *p = NULL;
  pe_status *st = pe_pool_new(n, &o, &p);
  ck_assert_msg(!st, "pe_pool_new: %s", pe_status_msg(st));
  return p;
}

/* --- every task exactly once --------------------------------------------------------- */

typedef struct counted {
  pe_task t;
  atomic_int runs;
  atomic_int *total;
} counted;

static void count_fn(void *arg) {
  counted *c = arg;
  atomic_fetch_add(&c->runs, 1);
  atomic_fetch_add(c->total, 1);
}

START_TEST(runs_every_task_once_external) {
  enum { N = 20000 / SCALE };
  counted *c = calloc(N, sizeof *c);
  for (int threads = 1; threads <= 8; threads++) {
    atomic_int total = 0;
    pe_pool *p = new_pool(threads, 0);
    for (int i = 0; i < N; i++) {
      c[i] = (counted){.t = {.fn = count_fn, .arg = &c[i]}, .total = &total};
      atomic_init(&c[i].runs, 0);
    }
    /* singles and batches, from outside */
    int i = 0;
    for (; i < N / 2; i++) pe_pool_submit(p, &c[i].t);
    while (i < N) {
      int k = 1 + i % 7;
      if (i + k > N) k = N - i;
      for (int j = 0; j + 1 < k; j++) c[i + j].t.next = &c[i + j + 1].t;
      pe_pool_submit_batch(p, &c[i].t, &c[i + k - 1].t, k);
      i += k;
    }
    ck_assert_msg(wait_at_least(&total, N, 20), "threads %d: %d of %d ran", threads,
                  atomic_load(&total), N);
    pe_pool_free(p);
    for (int j = 0; j < N; j++) ck_assert_int_eq(atomic_load(&c[j].runs), 1);
  }
  free(c);
}
END_TEST

/* A tree: each task submits `fan` children from inside the pool until
 * depth 0. Alternates pe_pool_submit, _local and _batch. */
typedef struct tree_ctx {
  pe_pool *pool;
  atomic_int ran, next;
  counted *nodes;
  int cap;
} tree_ctx;

typedef struct tree_task {
  pe_task t;
  tree_ctx *ctx;
  int depth;
} tree_task;

static tree_task *tree_alloc(tree_ctx *c, int depth);

static void tree_fn(void *arg) {
  tree_task *tt = arg;
  tree_ctx *c = tt->ctx;
  int depth = tt->depth;
  free(tt);
  atomic_fetch_add(&c->ran, 1);
  if (depth == 0) return;
  tree_task *kids[4];
  for (int i = 0; i < 4; i++) kids[i] = tree_alloc(c, depth - 1);
  pe_pool_submit_local(c->pool, &kids[0]->t);
  pe_pool_submit(c->pool, &kids[1]->t);
  kids[2]->t.next = &kids[3]->t;
  pe_pool_submit_batch(c->pool, &kids[2]->t, &kids[3]->t, 2);
}

static tree_task *tree_alloc(tree_ctx *c, int depth) {
  tree_task *t = malloc(sizeof *t);
  *t = (tree_task){.t = {.fn = tree_fn, .arg = t}, .ctx = c, .depth = depth};
  return t;
}

START_TEST(runs_every_task_once_internal) {
  const int depth = SCALE > 1 ? 5 : 6; /* (4^(d+1)-1)/3 tasks: 1365 / 5461 */
  int want = 0;
  for (int d = 0, w = 1; d <= depth; d++, w *= 4) want += w;
  for (int threads = 1; threads <= 8; threads++) {
    tree_ctx c = {0};
    c.pool = new_pool(threads, 0);
    pe_pool_submit(c.pool, &tree_alloc(&c, depth)->t);
    ck_assert_msg(wait_at_least(&c.ran, want, 20), "threads %d: %d of %d", threads,
                  atomic_load(&c.ran), want);
    pe_pool_free(c.pool);
    ck_assert_int_eq(atomic_load(&c.ran), want);
  }
}
END_TEST

/* The root task pushes a child to its own queue and then keeps its worker
 * busy until the child has run: only a thief can have run it. */
typedef struct steal_ctx {
  pe_pool *pool;
  pe_task child;
  atomic_int child_ran, child_worker, root_worker, ok;
} steal_ctx;

static void steal_child(void *arg) {
  steal_ctx *s = arg;
  atomic_store(&s->child_worker, pe_pool_current_worker());
  atomic_store(&s->child_ran, 1);
}

static void steal_root(void *arg) {
  steal_ctx *s = arg;
  atomic_store(&s->root_worker, pe_pool_current_worker());
  s->child = (pe_task){.fn = steal_child, .arg = s};
  pe_pool_submit_local(s->pool, &s->child);
  atomic_store(&s->ok, wait_at_least(&s->child_ran, 1, 10));
}

START_TEST(idle_workers_steal) {
  for (int threads = 2; threads <= 8; threads++) {
    for (int spin = -1; spin <= 0; spin++) { /* sleeping and spinning thieves */
      steal_ctx s = {0};
      s.pool = new_pool(threads, spin);
      pe_task root = {.fn = steal_root, .arg = &s};
      pe_pool_submit(s.pool, &root);
      pe_pool_free(s.pool);
      ck_assert_msg(atomic_load(&s.ok), "threads %d: child not stolen", threads);
      ck_assert_int_ne(atomic_load(&s.child_worker), atomic_load(&s.root_worker));
    }
  }
}
END_TEST

/* --- order from outside ----------------------------------------------------------- */

typedef struct gate {
  atomic_int open, entered;
} gate;

static void gate_fn(void *arg) {
  gate *g = arg;
  atomic_store(&g->entered, 1);
  wait_at_least(&g->open, 1, 10);
}

typedef struct order_rec {
  pe_task t;
  int id;
  int *log;
  atomic_int *n;
} order_rec;

static void order_fn(void *arg) {
  order_rec *r = arg;
  r->log[atomic_fetch_add(r->n, 1)] = r->id; /* one worker: no race */
}

START_TEST(outside_submissions_keep_order) {
  enum { N = 64 };
  pe_pool *p = new_pool(1, 0);
  gate g = {0};
  pe_task gt = {.fn = gate_fn, .arg = &g};
  pe_pool_submit(p, &gt);
  ck_assert(wait_at_least(&g.entered, 1, 10)); /* the only worker is held */
  int log[N + 1];
  atomic_int n = 0;
  order_rec r[N + 1];
  for (int i = 0; i <= N; i++) r[i] = (order_rec){{order_fn, &r[i], NULL}, i, log, &n};
  for (int i = 0; i < N / 2; i++) pe_pool_submit(p, &r[i].t);
  for (int i = N / 2; i + 1 < N; i++) r[i].t.next = &r[i + 1].t;
  pe_pool_submit_batch(p, &r[N / 2].t, &r[N - 1].t, N / 2);
  pe_pool_submit_urgent(p, &r[N].t); /* id N: jumps the queue */
  atomic_store(&g.open, 1);
  ck_assert(wait_at_least(&n, N + 1, 10));
  pe_pool_free(p);
  ck_assert_int_eq(log[0], N);
  for (int i = 0; i < N; i++) ck_assert_int_eq(log[i + 1], i);
}
END_TEST

/* A task that resubmits itself from its worker (to the front of that
 * worker's queue) until `stop`: a worker whose queue never empties, as
 * with two long runs on a one-worker daemon. */
typedef struct churn {
  pe_task t;
  pe_pool *pool;
  atomic_int runs, stop;
} churn;

static void churn_fn(void *arg) {
  churn *c = arg;
  atomic_fetch_add(&c->runs, 1);
  if (!atomic_load(&c->stop)) pe_pool_submit(c->pool, &c->t);
}

/* An outside submission runs while the worker's own queue never empties
 * (it took the inject stack only from an empty queue: the task waited
 * until the churn stopped, a Status or a close behind long runs). */
START_TEST(outside_submissions_not_starved) {
  pe_pool *p = new_pool(1, 0);
  churn c = {.t = {churn_fn, &c, NULL}, .pool = p};
  pe_pool_submit(p, &c.t);
  ck_assert(wait_at_least(&c.runs, 1000, 10));
  atomic_int total = 0;
  counted x = {.t = {count_fn, &x, NULL}, .total = &total};
  pe_pool_submit(p, &x.t);
  bool ran = wait_at_least(&total, 1, 2);
  int churned = atomic_load(&c.runs);
  atomic_store(&c.stop, 1);
  pe_pool_free(p);
  ck_assert_msg(ran, "an outside task waited 2 s behind a worker's own submissions (%d of them)",
                churned);
  ck_assert_int_eq(atomic_load(&x.runs), 1);
}
END_TEST

/* --- wake-ups ------------------------------------------------------------------------ */

/* A task that, while `hops` > 0, submits its successor from inside the
 * pool: worker -> worker wake-ups. */
typedef struct hop {
  pe_task t;
  pe_pool *pool;
  int hops;
  atomic_int *done;
} hop;

static void hop_fn(void *arg) {
  hop *h = arg;
  if (h->hops-- > 0) {
    pe_pool_submit(h->pool, &h->t);
    return;
  }
  atomic_fetch_add(h->done, 1);
}

START_TEST(no_lost_wakeups) {
  const int rounds = 3000 / SCALE;
  const int threads_list[] = {1, 2, 3, 8};
  for (size_t ti = 0; ti < sizeof threads_list / sizeof *threads_list; ti++) {
    for (int spin = -1; spin <= 0; spin++) {
      int threads = threads_list[ti];
      pe_pool *p = new_pool(threads, spin);
      hop h[3];
      atomic_int done = 0;
      int want = 0;
      for (int r = 0; r < rounds; r++) {
        /* a tiny burst, then nothing: workers go back to sleep between
         * rounds (immediately with spin -1) */
        int k = 1 + r % 3;
        for (int i = 0; i < k; i++) {
          h[i] = (hop){.t = {.fn = hop_fn, .arg = &h[i]}, .pool = p, .hops = r % 4, .done = &done};
          pe_pool_submit(p, &h[i].t);
        }
        want += k;
        ck_assert_msg(wait_at_least(&done, want, 5), "threads %d spin %d round %d: lost wake-up",
                      threads, spin, r);
        if (r % 64 == 0) { /* sometimes let every worker really fall asleep */
          struct timespec ts = {0, 200000};
          nanosleep(&ts, NULL);
        }
      }
      pe_pool_free(p);
    }
  }
}
END_TEST

/* --- free, hooks, ids, run_one ---------------------------------------------------------- */

START_TEST(free_drains_queued_tasks) {
  for (int threads = 1; threads <= 4; threads++) {
    tree_ctx c = {0};
    c.pool = new_pool(threads, 0);
    pe_pool_submit(c.pool, &tree_alloc(&c, 4)->t);
    pe_pool_submit(c.pool, &tree_alloc(&c, 4)->t);
    pe_pool_free(c.pool); /* at once: the trees are still growing */
    ck_assert_int_eq(atomic_load(&c.ran), 2 * (1 + 4 + 16 + 64 + 256));
  }
}
END_TEST

typedef struct hooks {
  atomic_int started[8], stopped[8];
} hooks;

static void on_start(int w, void *ctx) {
  atomic_fetch_add(&((hooks *)ctx)->started[w], 1);
}
static void on_stop(int w, void *ctx) {
  atomic_fetch_add(&((hooks *)ctx)->stopped[w], 1);
}

typedef struct id_probe {
  pe_task t;
  pe_pool *pool;
  atomic_int id, is_worker, done;
} id_probe;

static void id_fn(void *arg) {
  id_probe *p = arg;
  atomic_store(&p->id, pe_pool_current_worker());
  atomic_store(&p->is_worker, pe_pool_is_worker(p->pool));
  atomic_store(&p->done, 1);
}

START_TEST(worker_ids_and_hooks) {
  hooks h;
  memset(&h, 0, sizeof h);
  pe_pool_opts o = {.on_start = on_start, .on_stop = on_stop, .ctx = &h};
  pe_pool *p;
  ck_assert_ptr_null(pe_pool_new(5, &o, &p));
  ck_assert_int_eq(pe_pool_threads(p), 5);
  id_probe probe = {.t = {.fn = id_fn, .arg = &probe}, .pool = p};
  pe_pool_submit(p, &probe.t);
  ck_assert(wait_at_least(&probe.done, 1, 10));
  ck_assert_int_ge(atomic_load(&probe.id), 0);
  ck_assert_int_lt(atomic_load(&probe.id), 5);
  ck_assert(atomic_load(&probe.is_worker));
  ck_assert_int_eq(pe_pool_current_worker(), -1);
  ck_assert(!pe_pool_is_worker(p));
  pe_pool_free(p);
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(atomic_load(&h.started[i]), 1);
    ck_assert_int_eq(atomic_load(&h.stopped[i]), 1);
  }
  ck_assert_int_eq(atomic_load(&h.started[5]), 0);
}
END_TEST

/* On a one-worker pool a task waits for a child it submitted by running
 * it itself through pe_pool_run_one. */
typedef struct helper {
  pe_task parent, child;
  pe_pool *pool;
  atomic_int child_ran, parent_ok;
} helper;

static void helper_child(void *arg) {
  atomic_store(&((helper *)arg)->child_ran, 1);
}

static void helper_parent(void *arg) {
  helper *h = arg;
  h->child = (pe_task){.fn = helper_child, .arg = h};
  pe_pool_submit(h->pool, &h->child);
  double end = now_s() + 10;
  while (!atomic_load(&h->child_ran) && now_s() < end) pe_pool_run_one(h->pool);
  atomic_store(&h->parent_ok, atomic_load(&h->child_ran));
}

START_TEST(run_one_lets_a_worker_help) {
  helper h = {0};
  h.pool = new_pool(1, 0);
  h.parent = (pe_task){.fn = helper_parent, .arg = &h};
  pe_pool_submit(h.pool, &h.parent);
  pe_pool_free(h.pool);
  ck_assert(atomic_load(&h.parent_ok));
  pe_pool *p = new_pool(2, 0);
  ck_assert(!pe_pool_run_one(p)); /* outside the pool, nothing queued */
  pe_pool_free(p);
}
END_TEST

/* --- placement on a worker ------------------------------------------------------------ */

typedef struct where {
  pe_task t;
  atomic_int ran, worker;
} where;

static void where_fn(void *arg) {
  where *w = arg;
  atomic_store(&w->worker, pe_pool_current_worker());
  atomic_store(&w->ran, 1);
}

/* submit_to queues on the given worker: with the other worker blocked, a
 * task for the free one runs there; a task for the blocked one is not
 * stuck behind it (the free worker steals it: placement, not a promise).
 * Sleeping and spinning workers. */
START_TEST(submit_to_places_tasks) {
  for (int spin = -1; spin <= 0; spin++)
    for (int round = 0; round < 20; round++) {
      pe_pool *p = new_pool(2, spin);
      worker_block b = {0};
      int busy = worker_block_start(p, &b), free_w = 1 - busy;
      where to_free = {.t = {.fn = where_fn, .arg = &to_free}};
      where to_busy = {.t = {.fn = where_fn, .arg = &to_busy}};
      pe_pool_submit_to(p, free_w + 2, &to_free.t, &to_free.t, 1); /* taken mod threads */
      ck_assert(wait_at_least(&to_free.ran, 1, 10));
      ck_assert_int_eq(atomic_load(&to_free.worker), free_w);
      pe_pool_submit_to(p, busy, &to_busy.t, &to_busy.t, 1);
      ck_assert_msg(wait_at_least(&to_busy.ran, 1, 10), "task stuck behind a busy worker");
      ck_assert_int_eq(atomic_load(&to_busy.worker), free_w);
      ck_assert_int_eq(atomic_load(&b.open), 0); /* the blocker was still running */
      atomic_store(&b.open, 1);
      pe_pool_free(p);
    }
}
END_TEST

START_TEST(bad_thread_counts) {
  pe_pool *p = (pe_pool *)1;
  pe_status *st = pe_pool_new(0, NULL, &p);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  ck_assert_ptr_null(p);
  pe_status_free(st);
  st = pe_pool_new(100000, NULL, &p);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  pe_pool_free(NULL);
}
END_TEST

/* --- growing ---------------------------------------------------------------------------- */

/* Two tasks that each wait (up to a guard, no margin) until both are
 * running: they meet only on two workers at once. */
typedef struct rendezvous {
  pe_task t[2];
  atomic_int arrived, met;
} rendezvous;

static void meet_task(void *arg) {
  rendezvous *r = arg;
  atomic_fetch_add(&r->arrived, 1);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    if (atomic_load(&r->arrived) >= 2) {
      atomic_fetch_add(&r->met, 1);
      return;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > 20) return; /* the guard of a broken pool */
    sched_yield();
  }
}

START_TEST(grow_adds_workers_that_run_at_once) {
  pe_pool_opts o = {.max_threads = 2};
  pe_pool *p = NULL;
  PE_CK_OK(pe_pool_new(1, &o, &p));
  ck_assert_int_eq(pe_pool_threads(p), 1);
  PE_CK_OK(pe_pool_grow(p, 2));
  ck_assert_int_eq(pe_pool_threads(p), 2);
  PE_CK_OK(pe_pool_grow(p, 1)); /* never shrinks */
  ck_assert_int_eq(pe_pool_threads(p), 2);
  pe_status *st = pe_pool_grow(p, 3);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  ck_assert_msg(strstr(pe_status_msg(st), "at most 2"), "%s", pe_status_msg(st));
  pe_status_free(st);
  ck_assert_int_eq(pe_pool_threads(p), 2);
  static rendezvous r;
  atomic_init(&r.arrived, 0);
  atomic_init(&r.met, 0);
  for (int i = 0; i < 2; i++) {
    r.t[i] = (pe_task){meet_task, &r, NULL};
    pe_pool_submit(p, &r.t[i]);
  }
  pe_pool_free(p); /* drains */
  ck_assert_int_eq(atomic_load(&r.met), 2);
}
END_TEST

/* A worker that takes the outside stack runs its oldest task and moves the
 * rest into its own queue; between the take and the move the rest is in no
 * queue, and a worker that looks for work then goes to sleep. The move must
 * wake it, or the second task waits behind the first. A long chain (its
 * reversal keeps the window open) starts with two tasks that meet only on
 * two workers at once; both workers are asleep when it arrives. */
typedef struct meet_pair {
  pe_task t[2];
  atomic_int arrived, met, done;
} meet_pair;

static void meet_briefly(void *arg) {
  meet_pair *r = arg;
  atomic_fetch_add(&r->arrived, 1);
  double end = now_s() + 5.0; /* the guard of a worker that slept past the move */
  while (atomic_load(&r->arrived) < 2 && now_s() < end) sched_yield();
  if (atomic_load(&r->arrived) >= 2) atomic_fetch_add(&r->met, 1);
  atomic_fetch_add(&r->done, 1);
}

static void filler(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
}

START_TEST(moved_tasks_wake_sleepers) {
  enum { ROUNDS = 40 / SCALE, FILL = 200000 };
  pe_pool *p = new_pool(2, -1);
  meet_pair *r = calloc(1, sizeof *r);
  pe_task *fill = calloc(FILL, sizeof *fill);
  atomic_int filled;
  for (int round = 0; round < ROUNDS; round++) {
    atomic_store(&r->arrived, 0);
    atomic_store(&r->met, 0);
    atomic_store(&r->done, 0);
    atomic_store(&filled, 0);
    struct timespec nap = {0, 2000000}; /* both workers asleep (no spinning) */
    nanosleep(&nap, NULL);
    r->t[0] = (pe_task){meet_briefly, r, &r->t[1]};
    r->t[1] = (pe_task){meet_briefly, r, &fill[0]};
    for (int i = 0; i < FILL; i++)
      fill[i] = (pe_task){filler, &filled, i + 1 < FILL ? &fill[i + 1] : NULL};
    pe_pool_submit_batch(p, &r->t[0], &fill[FILL - 1], FILL + 2);
    ck_assert_msg(wait_at_least(&r->done, 2, 20), "round %d: the pair never finished", round);
    ck_assert_msg(wait_at_least(&filled, FILL, 20), "round %d: %d of %d fillers ran", round,
                  atomic_load(&filled), FILL);
    ck_assert_msg(atomic_load(&r->met) == 2,
                  "round %d: the pair ran one after the other (a worker slept past the move)",
                  round);
  }
  pe_pool_free(p);
  free(fill);
  free(r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("threadpool");
  TCase *tc = tcase_create("pool");
  tcase_add_test(tc, runs_every_task_once_external);
  tcase_add_test(tc, runs_every_task_once_internal);
  tcase_add_test(tc, idle_workers_steal);
  tcase_add_test(tc, outside_submissions_keep_order);
  tcase_add_test(tc, outside_submissions_not_starved);
  tcase_add_test(tc, no_lost_wakeups);
  tcase_add_test(tc, free_drains_queued_tasks);
  tcase_add_test(tc, worker_ids_and_hooks);
  tcase_add_test(tc, run_one_lets_a_worker_help);
  tcase_add_test(tc, submit_to_places_tasks);
  tcase_add_test(tc, bad_thread_counts);
  tcase_add_test(tc, grow_adds_workers_that_run_at_once);
  tcase_add_test(tc, moved_tasks_wake_sleepers);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
