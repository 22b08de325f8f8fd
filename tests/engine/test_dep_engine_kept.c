/* Dependency engine, kept ops (pe_engine_op_keep / push_kept): the same op
 * set pushed for many steps with its counters reset in place, on 1..4
 * workers; different subsets per step (a run's fetch set); a failing op
 * fails its step, its dependants are skipped, and after clear_error the
 * next step runs clean; an op pushed again from its own on_done; a kept
 * op driven by extra dependencies. Every step is checked against a serial
 * model of the values; every wait has a deadline. */
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "engine/dep_engine.h"
#include "engine_test_util.h"

/* A diamond: a writes x; b and c read x and write y and z; d reads y and
 * z and writes w. Values are plain ints, touched only under the grants. */
enum { X, Y, Z, W, NV };
enum { A, B, C, D, NOPS };

typedef struct diamond diamond;

typedef struct kop {
  diamond *g;
  int id;
  atomic_int ran, done;
} kop;

struct diamond {
  pe_engine_var *v[NV];
  int val[NV];
  int fail_step; /* the step at which op b fails (-1: never) */
  int step;      /* written by the test thread between steps */
  pe_engine_op *op[NOPS];
  kop k[NOPS];
};

static pe_status *kop_fn(void *arg) {
  kop *o = arg;
  diamond *g = o->g;
  atomic_fetch_add(&o->ran, 1);
  switch (o->id) {
    case A: g->val[X] += 1; break;
    case B:
      if (g->step == g->fail_step) return pe_error(PE_EINVAL, "b fails at step %d", g->step);
      g->val[Y] = g->val[X] * 2;
      break;
    case C: g->val[Z] = g->val[X] + 7; break;
    case D: g->val[W] = g->val[Y] + g->val[Z]; break;
  }
  return NULL;
}

static void kop_done(void *arg, const pe_status *st) {
  (void)st;
  atomic_fetch_add(&((kop *)arg)->done, 1);
}

static void diamond_new(env *e, diamond *g) {
  *g = (diamond){.fail_step = -1};
  for (int i = 0; i < NV; i++) OK(pe_engine_new_var(e->eng, &g->v[i]));
  pe_engine_var *x = g->v[X], *y = g->v[Y], *z = g->v[Z], *w = g->v[W];
  pe_engine_var *const rd_b[] = {x}, *const rd_d[] = {y, z, y}; /* a duplicate read */
  struct {
    pe_engine_var *const *r;
    int nr;
    pe_engine_var *m;
  } spec[NOPS] = {{NULL, 0, x}, {rd_b, 1, y}, {rd_b, 1, z}, {rd_d, 3, w}};
  for (int i = 0; i < NOPS; i++) {
    g->k[i].g = g;
    g->k[i].id = i;
    pe_engine_op_args a = {.fn = kop_fn,
                           .arg = &g->k[i],
                           .on_done = kop_done,
                           .reads = spec[i].r,
                           .n_reads = spec[i].nr,
                           .mutates = &spec[i].m,
                           .n_mutates = 1};
    OK(pe_engine_op_keep(e->eng, &a, &g->op[i]));
    ck_assert_ptr_nonnull(g->op[i]);
  }
}

static void diamond_free(diamond *g) {
  for (int i = 0; i < NOPS; i++) pe_engine_op_free_kept(g->op[i]);
}

/* Push the ops in mask (bit i: op i) in op order. */
static void push_step(env *e, diamond *g, unsigned mask) {
  for (int i = 0; i < NOPS; i++)
    if (mask & (1u << i)) pe_engine_op_push_kept(e->eng, g->op[i], i % 2, 0);
}

/* want: fn calls; pushed: completions (on_done also runs for skipped ops). */
static void check_runs(diamond *g, const int *want, const int *pushed) {
  for (int i = 0; i < NOPS; i++) {
    ck_assert_int_eq(atomic_load(&g->k[i].ran), want[i]);
    ck_assert_int_eq(atomic_load(&g->k[i].done), pushed[i]);
  }
}

static void check_counts(diamond *g, const int *want) {
  check_runs(g, want, want);
}

START_TEST(same_ops_many_steps) {
  for (int threads = 1; threads <= 4; threads++) {
    env e = env_new(threads);
    diamond g;
    diamond_new(&e, &g);
    int steps = 2000 / SCALE;
    for (g.step = 0; g.step < steps; g.step++) {
      push_step(&e, &g, 0xf);
      OK(pe_engine_wait_all(e.eng));
      int x = g.step + 1;
      ck_assert_int_eq(g.val[X], x);
      ck_assert_int_eq(g.val[W], x * 2 + x + 7);
    }
    int want[NOPS] = {steps, steps, steps, steps};
    check_counts(&g, want);
    diamond_free(&g);
    env_free(&e);
  }
}
END_TEST

/* Steps push different subsets, like runs with different fetch sets:
 * even steps only a and c, odd steps all four. */
START_TEST(different_subsets_per_step) {
  env e = env_new(2);
  diamond g;
  diamond_new(&e, &g);
  int want[NOPS] = {0};
  for (g.step = 0; g.step < 400; g.step++) {
    unsigned mask = g.step % 2 ? 0xf : 0x5;
    push_step(&e, &g, mask);
    OK(pe_engine_wait_all(e.eng));
    for (int i = 0; i < NOPS; i++) want[i] += (mask >> i) & 1;
    ck_assert_int_eq(g.val[X], g.step + 1);
    ck_assert_int_eq(g.val[Z], g.step + 1 + 7);
    if (mask == 0xf) ck_assert_int_eq(g.val[W], (g.step + 1) * 3 + 7);
  }
  check_counts(&g, want);
  diamond_free(&g);
  env_free(&e);
}
END_TEST

START_TEST(failed_step_then_clean_steps) {
  env e = env_new(2);
  diamond g;
  diamond_new(&e, &g);
  g.fail_step = 5;
  int want[NOPS] = {0}, pushed[NOPS] = {0};
  for (g.step = 0; g.step < 12; g.step++) {
    push_step(&e, &g, 0xf);
    pe_status *st = pe_engine_wait_all(e.eng);
    int x = g.step + 1;
    ck_assert_int_eq(g.val[X], x);
    for (int i = 0; i < NOPS; i++) want[i]++, pushed[i]++;
    if (g.step == g.fail_step) {
      ck_assert_msg(st && strstr(pe_status_msg(st), "b fails at step 5"), "%s",
                    st ? pe_status_msg(st) : "no error");
      pe_status_free(st);
      want[D]--; /* skipped: it reads y, which carries b's error */
      check_runs(&g, want, pushed);
      ck_assert_int_eq(g.val[W], (x - 1) * 3 + 7); /* the previous step's */
      OK(pe_engine_clear_error(e.eng, g.v[Y]));
      OK(pe_engine_clear_error(e.eng, g.v[W]));
      OK(pe_engine_wait_all(e.eng));
      continue;
    }
    ck_assert_msg(!st, "step %d: %s", g.step, st ? pe_status_msg(st) : "");
    ck_assert_int_eq(g.val[W], x * 3 + 7);
  }
  check_runs(&g, want, pushed);
  diamond_free(&g);
  env_free(&e);
}
END_TEST

/* An op pushed again from its own on_done, while its completion is still
 * under way: the engine must not touch the op after on_done. */
typedef struct again {
  pe_engine *eng;
  pe_engine_op *op;
  pe_engine_var *v;
  int left; /* under the op's grant / on_done's thread */
  int val;
  atomic_int done;
} again;

static pe_status *again_fn(void *arg) {
  ((again *)arg)->val++;
  return NULL;
}

static void again_done(void *arg, const pe_status *st) {
  (void)st;
  again *a = arg;
  if (--a->left > 0)
    pe_engine_op_push_kept(a->eng, a->op, 0, 0);
  else
    atomic_store(&a->done, 1);
}

START_TEST(pushed_again_from_on_done) {
  for (int threads = 1; threads <= 3; threads++) {
    env e = env_new(threads);
    again a = {.eng = e.eng, .left = 3000 / SCALE};
    OK(pe_engine_new_var(e.eng, &a.v));
    pe_engine_op_args args = {
        .fn = again_fn, .arg = &a, .on_done = again_done, .mutates = &a.v, .n_mutates = 1};
    OK(pe_engine_op_keep(e.eng, &args, &a.op));
    pe_engine_op_push_kept(e.eng, a.op, 0, 0);
    ck_assert(wait_at_least(&a.done, 1, 60));
    OK(pe_engine_wait_all(e.eng));
    ck_assert_int_eq(a.val, 3000 / SCALE);
    pe_engine_op_free_kept(a.op);
    env_free(&e);
  }
}
END_TEST

/* Kept ops held by extra dependencies and started by the caller, as a
 * compiled step does: b waits for a through an extra dependency as well
 * as through x. */
START_TEST(extra_deps_and_start) {
  env e = env_new(2);
  diamond g;
  diamond_new(&e, &g);
  for (g.step = 0; g.step < 300; g.step++) {
    pe_engine_op_push_kept(e.eng, g.op[A], 0, 1);
    pe_engine_op_push_kept(e.eng, g.op[B], 0, 1);
    ck_assert_int_eq(atomic_load(&g.k[A].ran), g.step); /* held */
    pe_engine_op_dep_done(e.eng, g.op[B]);
    pe_engine_op_start(e.eng, g.op[A]);
    OK(pe_engine_wait_all(e.eng));
    ck_assert_int_eq(g.val[Y], (g.step + 1) * 2);
  }
  int want[NOPS] = {300, 300, 0, 0};
  check_counts(&g, want);
  diamond_free(&g);
  env_free(&e);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("dep_engine_kept");
  TCase *tc = tcase_create("kept");
  tcase_add_test(tc, same_ops_many_steps);
  tcase_add_test(tc, different_subsets_per_step);
  tcase_add_test(tc, failed_step_then_clean_steps);
  tcase_add_test(tc, pushed_again_from_on_done);
  tcase_add_test(tc, extra_deps_and_start);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
