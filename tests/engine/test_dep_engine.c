/* Dependency engine: random push sequences against a serial model (1..8
 * workers, many seeds), concurrent pushers sharing variables, parallel
 * readers, writers in push order, wait_var after earlier readers, delete
 * after readers, error propagation,
 * op handles with extra dependencies, priority order, waits from workers,
 * free with ops in flight, bad arguments. Asynchronous completion and
 * worker affinity: test_dep_engine_sched.c.
 * Ops check exclusivity themselves (active reader/writer counts per
 * variable) and report through atomics that the test thread reads; every
 * wait has a deadline. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "engine/dep_engine.h"
#include "engine_test_util.h"

static uint32_t rnd(uint32_t *s) {
  uint32_t x = *s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

/* --- random sequences vs. a serial model ---------------------------------------------- */

#define MAXV 6
#define MAXOPS 400

typedef struct world world;

typedef struct rop {
  world *w;
  int id, n_reads, n_muts;
  int reads[4], muts[3];
  int seen[4]; /* last writer of reads[i] when the op ran */
  int spin;
} rop;

struct world {
  int last_writer[MAXV]; /* touched only by ops holding the right grant */
  int log[MAXV][MAXOPS], log_n[MAXV];
  atomic_int active_r[MAXV], active_w[MAXV];
  atomic_int violations;
  rop ops[MAXOPS];
};

static bool in(const int *a, int n, int v) {
  for (int i = 0; i < n; i++)
    if (a[i] == v) return true;
  return false;
}

static pe_status *rop_fn(void *arg) {
  rop *o = arg;
  world *w = o->w;
  int muts[3], nm = 0, rd[4], nr = 0; /* deduplicated: mutation wins */
  for (int i = 0; i < o->n_muts; i++)
    if (!in(muts, nm, o->muts[i])) muts[nm++] = o->muts[i];
  for (int i = 0; i < o->n_reads; i++)
    if (!in(muts, nm, o->reads[i]) && !in(rd, nr, o->reads[i])) rd[nr++] = o->reads[i];
  for (int i = 0; i < nm; i++)
    if (atomic_fetch_add(&w->active_w[muts[i]], 1) != 0 || atomic_load(&w->active_r[muts[i]]))
      atomic_fetch_add(&w->violations, 1);
  for (int i = 0; i < nr; i++) {
    atomic_fetch_add(&w->active_r[rd[i]], 1);
    if (atomic_load(&w->active_w[rd[i]])) atomic_fetch_add(&w->violations, 1);
  }
  for (int i = 0; i < o->n_reads; i++) o->seen[i] = w->last_writer[o->reads[i]];
  for (volatile int i = 0; i < o->spin; i++) {
  }
  for (int i = 0; i < nm; i++) {
    w->last_writer[muts[i]] = o->id;
    w->log[muts[i]][w->log_n[muts[i]]++] = o->id;
  }
  for (int i = 0; i < nr; i++) atomic_fetch_sub(&w->active_r[rd[i]], 1);
  for (int i = 0; i < nm; i++) atomic_fetch_sub(&w->active_w[muts[i]], 1);
  return NULL;
}

static void random_sequence(uint32_t seed, int threads, int n_ops) {
  env e = env_new(threads);
  world *w = calloc(1, sizeof *w);
  uint32_t r = seed * 2654435761u + 1;
  int nv = 2 + (int)(rnd(&r) % (MAXV - 1));
  pe_engine_var *vars[MAXV];
  for (int i = 0; i < nv; i++) OK(pe_engine_new_var(e.eng, &vars[i]));
  /* the serial model */
  int last[MAXV], mlog[MAXV][MAXOPS], mlog_n[MAXV] = {0}, expect[MAXOPS][4];
  for (int i = 0; i < MAXV; i++) last[i] = w->last_writer[i] = -1;
  for (int k = 0; k < n_ops; k++) {
    rop *o = &w->ops[k];
    *o = (rop){.w = w, .id = k, .n_reads = (int)(rnd(&r) % 4), .n_muts = (int)(rnd(&r) % 3)};
    o->spin = rnd(&r) % 4 == 0 ? (int)(rnd(&r) % 2000) : 0;
    pe_engine_var *rv[4], *mv[3];
    for (int i = 0; i < o->n_reads; i++) rv[i] = vars[o->reads[i] = (int)(rnd(&r) % nv)];
    for (int i = 0; i < o->n_muts; i++) mv[i] = vars[o->muts[i] = (int)(rnd(&r) % nv)];
    for (int i = 0; i < o->n_reads; i++) expect[k][i] = last[o->reads[i]];
    int done[3], nd = 0;
    for (int i = 0; i < o->n_muts; i++) {
      int v = o->muts[i];
      if (in(done, nd, v)) continue;
      done[nd++] = v;
      last[v] = k;
      mlog[v][mlog_n[v]++] = k;
    }
    OK(pe_engine_push(e.eng, rop_fn, o, rv, o->n_reads, mv, o->n_muts, (int)(rnd(&r) % 5) - 2));
    if (rnd(&r) % 50 == 0) { /* wait for one variable mid-sequence */
      int v = (int)(rnd(&r) % nv);
      OK(pe_engine_wait_var(e.eng, vars[v]));
      /* No later op is pushed yet, so no writer of v can be running. */
      ck_assert_int_eq(w->last_writer[v], last[v]);
    }
  }
  OK(pe_engine_wait_all(e.eng));
  ck_assert_int_eq(atomic_load(&w->violations), 0);
  for (int k = 0; k < n_ops; k++)
    for (int i = 0; i < w->ops[k].n_reads; i++)
      ck_assert_msg(w->ops[k].seen[i] == expect[k][i],
                    "seed %u threads %d: op %d read %d saw writer %d, serial order says %d", seed,
                    threads, k, i, w->ops[k].seen[i], expect[k][i]);
  for (int v = 0; v < nv; v++) {
    ck_assert_int_eq(w->log_n[v], mlog_n[v]);
    for (int i = 0; i < mlog_n[v]; i++) ck_assert_int_eq(w->log[v][i], mlog[v][i]);
  }
  env_free(&e);
  free(w);
}

START_TEST(random_sequences_match_serial_order) {
  const int seeds = 160 / SCALE;
  for (int s = 0; s < seeds; s++) random_sequence((uint32_t)s + 1, 1 + s % 8, MAXOPS);
}
END_TEST

/* --- concurrent pushers on shared variables --------------------------------------------- */

#define CP_VARS 6

typedef struct shared {
  pe_engine *eng;
  pe_engine_var *vars[CP_VARS];
  long counter[CP_VARS]; /* plain: the engine serialises the mutations */
  atomic_int active_w[CP_VARS], active_r[CP_VARS], violations;
  atomic_int expected[CP_VARS];
  int per_thread;
} shared;

typedef struct cp_op {
  shared *sh;
  int a, b, rd;
} cp_op;

static pe_status *cp_fn(void *arg) {
  cp_op *o = arg;
  shared *sh = o->sh;
  if (atomic_fetch_add(&sh->active_w[o->a], 1) || atomic_fetch_add(&sh->active_w[o->b], 1) ||
      atomic_load(&sh->active_r[o->a]) || atomic_load(&sh->active_w[o->rd]))
    atomic_fetch_add(&sh->violations, 1);
  atomic_fetch_add(&sh->active_r[o->rd], 1);
  sh->counter[o->a]++;
  sh->counter[o->b]++;
  atomic_fetch_sub(&sh->active_r[o->rd], 1);
  atomic_fetch_sub(&sh->active_w[o->b], 1);
  atomic_fetch_sub(&sh->active_w[o->a], 1);
  free(o);
  return NULL;
}

static void *pusher(void *arg) {
  shared *sh = arg;
  uint32_t r = (uint32_t)(uintptr_t)&r;
  for (int i = 0; i < sh->per_thread; i++) {
    cp_op *o = malloc(sizeof *o);
    o->sh = sh;
    o->a = (int)(rnd(&r) % CP_VARS);
    do o->b = (int)(rnd(&r) % CP_VARS);
    while (o->b == o->a);
    do o->rd = (int)(rnd(&r) % CP_VARS);
    while (o->rd == o->a || o->rd == o->b);
    atomic_fetch_add(&sh->expected[o->a], 1);
    atomic_fetch_add(&sh->expected[o->b], 1);
    /* mutations listed in random order: the engine locks in address order */
    pe_engine_var *m[2] = {sh->vars[o->a], sh->vars[o->b]};
    if (rnd(&r) & 1) m[0] = sh->vars[o->b], m[1] = sh->vars[o->a];
    pe_status *st = pe_engine_push(sh->eng, cp_fn, o, &sh->vars[o->rd], 1, m, 2, 0);
    if (st) {
      atomic_fetch_add(&sh->violations, 1);
      pe_status_free(st);
    }
  }
  return NULL;
}

START_TEST(concurrent_pushers_share_variables) {
  for (int threads = 1; threads <= 4; threads++) {
    env e = env_new(threads);
    shared *sh = calloc(1, sizeof *sh);
    sh->eng = e.eng;
    sh->per_thread = 2000 / SCALE;
    for (int i = 0; i < CP_VARS; i++) OK(pe_engine_new_var(e.eng, &sh->vars[i]));
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, pusher, sh);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    OK(pe_engine_wait_all(e.eng));
    ck_assert_int_eq(atomic_load(&sh->violations), 0);
    for (int i = 0; i < CP_VARS; i++)
      ck_assert_int_eq(sh->counter[i], atomic_load(&sh->expected[i]));
    env_free(&e);
    free(sh);
  }
}
END_TEST

/* --- readers in parallel, writers in order --------------------------------------------- */

typedef struct rendezvous {
  atomic_int arrived, ok, finished, seen_by_writer;
} rendezvous;

static pe_status *meet_fn(void *arg) {
  rendezvous *r = arg;
  atomic_fetch_add(&r->arrived, 1);
  /* Both readers must be running at once to get past this. */
  if (wait_at_least(&r->arrived, 2, 10)) atomic_fetch_add(&r->ok, 1);
  atomic_fetch_add(&r->finished, 1);
  return NULL;
}

static pe_status *after_fn(void *arg) {
  rendezvous *r = arg;
  atomic_store(&r->seen_by_writer, atomic_load(&r->finished));
  return NULL;
}

START_TEST(readers_run_in_parallel) {
  for (int threads = 2; threads <= 4; threads++) {
    env e = env_new(threads);
    rendezvous r = {0};
    pe_engine_var *a;
    OK(pe_engine_new_var(e.eng, &a));
    OK(pe_engine_push(e.eng, NULL, NULL, NULL, 0, &a, 1, 0)); /* a writer first */
    OK(pe_engine_push(e.eng, meet_fn, &r, &a, 1, NULL, 0, 0));
    OK(pe_engine_push(e.eng, meet_fn, &r, &a, 1, NULL, 0, 0));
    OK(pe_engine_push(e.eng, after_fn, &r, NULL, 0, &a, 1, 0));
    OK(pe_engine_wait_all(e.eng));
    ck_assert_int_eq(atomic_load(&r.ok), 2);
    ck_assert_int_eq(atomic_load(&r.seen_by_writer), 2);
    env_free(&e);
  }
}
END_TEST

typedef struct wlog {
  int ids[512], n;
  atomic_int active, violations;
} wlog;

typedef struct wop {
  wlog *l;
  int id;
} wop;

static pe_status *wop_fn(void *arg) {
  wop *o = arg;
  if (atomic_fetch_add(&o->l->active, 1)) atomic_fetch_add(&o->l->violations, 1);
  o->l->ids[o->l->n++] = o->id;
  atomic_fetch_sub(&o->l->active, 1);
  return NULL;
}

START_TEST(writers_run_alone_in_push_order) {
  env e = env_new(4);
  wlog *l = calloc(1, sizeof *l);
  wop ops[512];
  pe_engine_var *v;
  OK(pe_engine_new_var(e.eng, &v));
  for (int i = 0; i < 512; i++) {
    ops[i] = (wop){l, i};
    OK(pe_engine_push(e.eng, wop_fn, &ops[i], NULL, 0, &v, 1, i % 3));
  }
  OK(pe_engine_wait_var(e.eng, v));
  ck_assert_int_eq(l->n, 512);
  for (int i = 0; i < 512; i++) ck_assert_int_eq(l->ids[i], i);
  ck_assert_int_eq(atomic_load(&l->violations), 0);
  env_free(&e);
  free(l);
}
END_TEST

/* --- errors ------------------------------------------------------------------------------- */

START_TEST(failed_op_skips_dependants_and_is_reported) {
  for (int threads = 1; threads <= 3; threads++) {
    env e = env_new(threads);
    pe_engine_var *x, *y, *z, *w;
    OK(pe_engine_new_var(e.eng, &x));
    OK(pe_engine_new_var(e.eng, &y));
    OK(pe_engine_new_var(e.eng, &z));
    OK(pe_engine_new_var(e.eng, &w));
    probe a = {.fail = true}, b = {0}, c = {0}, d = {0}, f = {0};
    push_probe(e.eng, &a, NULL, x); /* fails, x marked */
    push_probe(e.eng, &b, x, y);    /* skipped, y marked */
    push_probe(e.eng, &c, y, z);    /* skipped, z marked */
    push_probe(e.eng, &d, NULL, w); /* independent: runs */
    push_probe(e.eng, &f, w, x);    /* mutates a failed variable: skipped */
    pe_status *st = pe_engine_wait_var(e.eng, z);
    ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
    ck_assert_str_eq(pe_status_msg(st), "op boom: x has shape [2,3]");
    pe_status_free(st);
    ck_assert_ptr_null(pe_engine_wait_var(e.eng, w));
    st = pe_engine_wait_all(e.eng);
    ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
    pe_status_free(st);
    ck_assert_ptr_null(pe_engine_wait_all(e.eng)); /* taken */
    ck_assert_int_eq(atomic_load(&a.calls), 1);
    ck_assert_int_eq(atomic_load(&b.calls), 0);
    ck_assert_int_eq(atomic_load(&c.calls), 0);
    ck_assert_int_eq(atomic_load(&d.calls), 1);
    ck_assert_int_eq(atomic_load(&f.calls), 0);
    /* every op completed once, skipped ones with the error */
    probe *all[] = {&a, &b, &c, &d, &f};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(atomic_load(&all[i]->done_calls), 1);
    ck_assert_int_eq(atomic_load(&b.done_code), PE_ESHAPE);
    ck_assert_int_eq(atomic_load(&d.done_code), PE_OK);
    /* errors stay until cleared; then the variables work again */
    probe g = {0};
    push_probe(e.eng, &g, x, w);
    st = pe_engine_wait_var(e.eng, w);
    ck_assert_int_eq(pe_status_code(st), PE_ESHAPE); /* skipped: w is marked now */
    pe_status_free(st);
    ck_assert_int_eq(atomic_load(&g.calls), 0);
    pe_status_free(pe_engine_wait_all(e.eng));
    pe_engine_var *marked[] = {x, y, z, w};
    for (int i = 0; i < 4; i++) OK(pe_engine_clear_error(e.eng, marked[i]));
    probe h = {0};
    push_probe(e.eng, &h, x, y);
    ck_assert_ptr_null(pe_engine_wait_var(e.eng, y));
    ck_assert_int_eq(atomic_load(&h.calls), 1);
    ck_assert_ptr_null(pe_engine_wait_all(e.eng));
    env_free(&e);
  }
}
END_TEST

/* --- delete ------------------------------------------------------------------------------ */

typedef struct gated {
  atomic_int open, started, done;
} gated;

static pe_status *gated_fn(void *arg) {
  gated *g = arg;
  atomic_fetch_add(&g->started, 1);
  wait_at_least(&g->open, 1, 10);
  atomic_fetch_add(&g->done, 1);
  return NULL;
}

/* --- wait_var waits for earlier readers too ------------------------------------------- */

typedef struct held_read {
  atomic_int release, finished, seen;
  pe_engine *eng;
  pe_engine_var *v;
} held_read;

static pe_status *held_reader(void *arg) {
  held_read *h = arg;
  wait_at_least(&h->release, 1, 10);
  atomic_store(&h->finished, 1);
  return NULL;
}

static void *var_waiter(void *arg) {
  held_read *h = arg;
  pe_status *st = pe_engine_wait_var(h->eng, h->v);
  pe_status_free(st);
  atomic_store(&h->seen, atomic_load(&h->finished) + 1); /* 2: the reader had finished */
  return NULL;
}

/* dep_engine.h: wait_var waits for every op pushed before it that uses the
 * variable, reads included (a wait granted like a read would run beside a
 * pending reader and return early). */
START_TEST(wait_var_waits_for_earlier_readers) {
  for (int threads = 1; threads <= 2; threads++) {
    env e = env_new(threads);
    held_read h = {.eng = e.eng};
    OK(pe_engine_new_var(e.eng, &h.v));
    OK(pe_engine_push(e.eng, held_reader, &h, &h.v, 1, NULL, 0, 0));
    pthread_t t;
    pthread_create(&t, NULL, var_waiter, &h);
    struct timespec ts = {0, 30 * 1000 * 1000};
    nanosleep(&ts, NULL);
    ck_assert_msg(atomic_load(&h.seen) == 0, "wait_var returned while a reader was running");
    atomic_store(&h.release, 1);
    pthread_join(t, NULL);
    ck_assert_int_eq(atomic_load(&h.seen), 2);
    OK(pe_engine_wait_all(e.eng));
    env_free(&e);
  }
}
END_TEST

START_TEST(delete_waits_for_readers) {
  env e = env_new(2);
  gated g = {0};
  pe_engine_var *v, *other;
  OK(pe_engine_new_var(e.eng, &v));
  OK(pe_engine_new_var(e.eng, &other));
  ck_assert_int_eq(pe_engine_var_count(e.eng), 2);
  for (int i = 0; i < 3; i++) OK(pe_engine_push(e.eng, gated_fn, &g, &v, 1, NULL, 0, 0));
  OK(pe_engine_delete_var(e.eng, v));
  ck_assert(wait_at_least(&g.started, 1, 10));
  ck_assert_int_eq(pe_engine_var_count(e.eng), 2); /* readers hold it */
  atomic_store(&g.open, 1);
  OK(pe_engine_wait_all(e.eng));
  ck_assert_int_eq(atomic_load(&g.done), 3);
  ck_assert_int_eq(pe_engine_var_count(e.eng), 1);
  /* deleting a variable that carries an error discards it */
  probe bad = {.fail = true};
  push_probe(e.eng, &bad, NULL, other);
  OK(pe_engine_delete_var(e.eng, other));
  pe_status *st = pe_engine_wait_all(e.eng);
  ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
  pe_status_free(st);
  ck_assert_int_eq(pe_engine_var_count(e.eng), 0);
  env_free(&e);
}
END_TEST

/* --- op handles with extra dependencies ---------------------------------------------------- */

START_TEST(op_handle_waits_for_extra_deps) {
  env e = env_new(2);
  pe_engine_var *v;
  OK(pe_engine_new_var(e.eng, &v));
  gated g = {0};
  OK(pe_engine_push(e.eng, gated_fn, &g, NULL, 0, &v, 1, 0)); /* v busy */
  probe p = {0}, later = {0};
  pe_engine_op *op;
  pe_engine_op_args a = {.fn = probe_fn, .arg = &p, .mutates = &v, .n_mutates = 1, .extra_deps = 2};
  OK(pe_engine_op_new(e.eng, &a, &op));
  ck_assert_ptr_nonnull(op);
  push_probe(e.eng, &later, v, NULL); /* pushed after: must wait for op */
  pe_engine_op_dep_done(e.eng, op);
  atomic_store(&g.open, 1); /* v's grant arrives; one extra dep still open */
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
  ck_assert_int_eq(atomic_load(&p.calls), 0);
  ck_assert_int_eq(atomic_load(&later.calls), 0);
  pe_engine_op_dep_done(e.eng, op);
  OK(pe_engine_wait_all(e.eng));
  ck_assert_int_eq(atomic_load(&p.calls), 1);
  ck_assert_int_eq(atomic_load(&later.calls), 1);
  /* extra deps only: dep_done from another op's fn is fine too */
  probe q = {0};
  pe_engine_op_args b = {.fn = probe_fn, .arg = &q, .extra_deps = 1};
  OK(pe_engine_op_new(e.eng, &b, &op));
  pe_engine_op_dep_done(e.eng, op);
  OK(pe_engine_wait_all(e.eng));
  ck_assert_int_eq(atomic_load(&q.calls), 1);
  env_free(&e);
}
END_TEST

/* --- priority ------------------------------------------------------------------------------- */

typedef struct prio_rec {
  int *log;
  int *n;
  int prio;
} prio_rec;

static pe_status *prio_fn(void *arg) {
  prio_rec *r = arg;
  r->log[(*r->n)++] = r->prio; /* one worker */
  return NULL;
}

START_TEST(priority_orders_released_ops) {
  env e = env_new(1);
  pe_engine_var *v;
  OK(pe_engine_new_var(e.eng, &v));
  gated g = {0};
  OK(pe_engine_push(e.eng, gated_fn, &g, NULL, 0, &v, 1, 0));
  ck_assert(wait_at_least(&g.started, 1, 10));
  int order[10] = {3, 7, 0, 9, 1, 5, 5, 2, 8, 4}, log[10], n = 0;
  prio_rec r[10];
  for (int i = 0; i < 10; i++) {
    r[i] = (prio_rec){log, &n, order[i]};
    OK(pe_engine_push(e.eng, prio_fn, &r[i], &v, 1, NULL, 0, order[i]));
  }
  atomic_store(&g.open, 1); /* all ten become ready together */
  OK(pe_engine_wait_all(e.eng));
  ck_assert_int_eq(n, 10);
  const int want[10] = {9, 8, 7, 5, 5, 4, 3, 2, 1, 0};
  for (int i = 0; i < 10; i++) ck_assert_int_eq(log[i], want[i]);
  env_free(&e);
}
END_TEST

/* --- waits from inside the pool --------------------------------------------------------------- */

typedef struct inner {
  pe_engine *eng;
  pe_engine_var *b;
  atomic_int b_written, saw_written, wait_all_code;
} inner;

static pe_status *write_b(void *arg) {
  atomic_store(&((inner *)arg)->b_written, 1);
  return NULL;
}

static pe_status *outer_fn(void *arg) {
  inner *in = arg;
  pe_status *st = pe_engine_wait_all(in->eng);
  atomic_store(&in->wait_all_code, pe_status_code(st));
  pe_status_free(st);
  /* push an op from inside, then wait for it: the only worker runs it */
  st = pe_engine_push(in->eng, write_b, in, NULL, 0, &in->b, 1, 0);
  if (!st) st = pe_engine_wait_var(in->eng, in->b);
  pe_status_free(st);
  atomic_store(&in->saw_written, atomic_load(&in->b_written));
  return NULL;
}

START_TEST(waits_from_a_worker) {
  env e = env_new(1);
  inner in = {.eng = e.eng};
  pe_engine_var *a;
  OK(pe_engine_new_var(e.eng, &a));
  OK(pe_engine_new_var(e.eng, &in.b));
  OK(pe_engine_push(e.eng, outer_fn, &in, NULL, 0, &a, 1, 0));
  OK(pe_engine_wait_all(e.eng));
  ck_assert_int_eq(atomic_load(&in.wait_all_code), PE_EINVAL);
  ck_assert_int_eq(atomic_load(&in.saw_written), 1);
  env_free(&e);
}
END_TEST

/* --- free with ops in flight, bad arguments ------------------------------------------------- */

START_TEST(free_waits_for_pending_ops) {
  env e = env_new(2);
  pe_engine_var *v;
  OK(pe_engine_new_var(e.eng, &v));
  probe p = {0};
  for (int i = 0; i < 1000; i++) push_probe(e.eng, &p, i % 2 ? v : NULL, i % 2 ? NULL : v);
  pe_engine_free(e.eng); /* no wait first */
  ck_assert_int_eq(atomic_load(&p.done_calls), 1000);
  pe_pool_free(e.pool);
}
END_TEST

START_TEST(bad_arguments) {
  env e = env_new(1);
  pe_engine_var *v = NULL, *null_var = NULL;
  OK(pe_engine_new_var(e.eng, &v));
  pe_status *st = pe_engine_push(e.eng, NULL, NULL, &v, -1, NULL, 0, 0);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  st = pe_engine_push(e.eng, NULL, NULL, &v, 1, &null_var, 1, 0);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  st = pe_engine_push(e.eng, NULL, NULL, NULL, 2, NULL, 0, 0);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  pe_engine *eng2 = (pe_engine *)1;
  st = pe_engine_new(NULL, &eng2);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  ck_assert_ptr_null(eng2);
  pe_status_free(st);
  /* duplicates and read+mutate of one variable are one mutation */
  pe_engine_var *twice[3] = {v, v, v};
  OK(pe_engine_push(e.eng, NULL, NULL, twice, 3, twice, 2, 0));
  OK(pe_engine_wait_all(e.eng));
  env_free(&e);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dep_engine");
  TCase *tc = tcase_create("engine");
  tcase_add_test(tc, random_sequences_match_serial_order);
  tcase_add_test(tc, concurrent_pushers_share_variables);
  tcase_add_test(tc, readers_run_in_parallel);
  tcase_add_test(tc, writers_run_alone_in_push_order);
  tcase_add_test(tc, wait_var_waits_for_earlier_readers);
  tcase_add_test(tc, delete_waits_for_readers);
  tcase_add_test(tc, failed_op_skips_dependants_and_is_reported);
  tcase_add_test(tc, op_handle_waits_for_extra_deps);
  tcase_add_test(tc, priority_orders_released_ops);
  tcase_add_test(tc, waits_from_a_worker);
  tcase_add_test(tc, free_waits_for_pending_ops);
  tcase_add_test(tc, bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
