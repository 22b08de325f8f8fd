/* pe_par_exec_run_steps: several steps per call, chained by the pool
 * worker that ends each step (host places) or by the caller's thread
 * (device places). Each step must be exactly a pe_par_exec_run on the same
 * batch: losses and parameters bit-identical to separate runs of a twin
 * model, uneven splits included; next and done in step order; next asked
 * without blocking only on pool workers; errors end the call with the step
 * named, and the executor works afterwards. */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "engine/prefetch.h" /* pe_split_count */
#include "par_test_util.h"

enum { STEPS = 9, MAXP = 4 };
/* Batch sizes per step: uneven, one smaller than the places. */
static const int sizes[STEPS] = {16, 11, 2, 16, 7, 13, 9, 16, 5};

typedef struct source {
  pe_pool *pool;
  int places;
  int n_steps;
  int would_block_every; /* on a worker, answer WOULD_BLOCK when step % this == 1 (0: never) */
  int bad_step;          /* this step's x has DIM + 1 columns (-1: none) */
  int fail_done_at;      /* done fails at this step (-1: never) */
  /* The running step's batch, split by hand: views of its rows. */
  float x[MAXB * (DIM + 1)];
  int64_t y[MAXB];
  pe_tensor xt[MAXP], yt[MAXP];
  const pe_tensor *xp[MAXP], *yp[MAXP];
  pe_feed_split feeds[2];
  int running; /* step between next and done, -1: none */
  /* What happened. */
  int next_calls, done_calls;
  int worker_asks;   /* next asked on a pool worker (may_block false) */
  int blocked_asks;  /* next asked on the caller for a step > 0 */
  int would_blocks;  /* WOULD_BLOCK answers */
  bool order_broken; /* next/done out of order, or may_block wrong */
  float loss[STEPS];
} source;

static pe_status *src_next(void *ctx, int64_t step, bool may_block, const pe_feed_split **feeds,
                           pe_step_next *what) {
  source *c = ctx;
  c->next_calls++;
  if (c->running != -1 || may_block == pe_pool_is_worker(c->pool)) c->order_broken = true;
  *what = PE_STEP_END;
  if (step >= c->n_steps) return NULL;
  if (!may_block) {
    c->worker_asks++;
    if (c->would_block_every && step % c->would_block_every == 1) {
      c->would_blocks++;
      *what = PE_STEP_WOULD_BLOCK;
      return NULL;
    }
  } else if (step > 0) {
    c->blocked_asks++;
  }
  int n = sizes[step], cols = step == c->bad_step ? DIM + 1 : DIM;
  make_batch((int)step, n, c->x, c->y);
  if (cols != DIM)
    for (int i = 0; i < n * cols; i++) c->x[i] = 0.25f;
  int64_t off = 0;
  for (int p = 0; p < c->places; p++) {
    int64_t cnt = pe_split_count(n, c->places, p);
    pe_shape xs = PE_SHAPE(cnt, cols), ys = PE_SHAPE(cnt, 1);
    pe_tensor_view(&c->xt[p], PE_F32, &xs, c->x + off * cols);
    pe_tensor_view(&c->yt[p], PE_I64, &ys, c->y + off);
    c->xp[p] = &c->xt[p];
    c->yp[p] = &c->yt[p];
    off += cnt;
  }
  c->feeds[0] = (pe_feed_split){"x", c->xp};
  c->feeds[1] = (pe_feed_split){"y", c->yp};
  *feeds = c->feeds;
  c->running = (int)step;
  *what = PE_STEP_READY;
  return NULL;
}

static pe_status *src_done(void *ctx, int64_t step, const pe_tensor *fetched, int n_fetch) {
  source *c = ctx;
  if (step != c->running || step != c->done_calls || n_fetch != 1) c->order_broken = true;
  c->running = -1;
  if (step == c->fail_done_at)
    return pe_error(PE_EINVAL, "test: done refuses step %lld", (long long)step);
  c->loss[step] = pe_f32(&fetched[0])[0];
  c->done_calls++;
  return NULL;
}

static void source_init(source *c, pe_runtime *rt, int places, int n_steps) {
  memset(c, 0, sizeof *c);
  c->pool = pe_runtime_pool(rt);
  c->places = places;
  c->n_steps = n_steps;
  c->bad_step = c->fail_done_at = c->running = -1;
}

static pe_status *run_steps(par *q, source *c, int64_t *steps, pe_tensor *out) {
  pe_step_source src = {src_next, src_done, c};
  return pe_par_exec_run_steps(q->step, &src, 2, &LOSS, 1, out, NULL, steps);
}

/* Every persistable of a and b equal, bit for bit, on every place a has it. */
static void expect_models_equal(par *a, par *b, int places) {
  const char *const *names;
  int n = 0;
  PE_CK_OK(pe_model_names(a->m, (const char ***)&names, &n));
  ck_assert_int_gt(n, 0);
  pe_tensor ta, tb;
  pe_tensor_init(&ta);
  pe_tensor_init(&tb);
  for (int i = 0; i < n; i++)
    for (int p = 0; p < places; p++) {
      pe_status *st = pe_model_get_place(a->m, names[i], p, &ta);
      if (st) { /* not on this place (sharded optimizer state: place 0 only) */
        pe_status_free(st);
        continue;
      }
      PE_CK_OK(pe_model_get_place(b->m, names[i], p, &tb));
      ck_assert_int_eq(pe_tensor_bytes(&ta), pe_tensor_bytes(&tb));
      ck_assert_msg(memcmp(ta.data, tb.data, pe_tensor_bytes(&ta)) == 0, "%s differs on place %d",
                    names[i], p);
    }
  pe_tensor_release(&ta);
  pe_tensor_release(&tb);
  free((void *)names);
}

/* Two models from one seed: `sep` runs each batch with pe_par_exec_run,
 * `chain` all of them with one pe_par_exec_run_steps. */
static void steps_equal_runs(pe_place_kind kind, int places, int workers,
                             pe_graph_strategy strategy, int would_block_every) {
  pe_runtime *rt = rt_new(workers);
  par sep, chain;
  par_new(&sep, rt, kind, places, strategy, false, 11);
  par_new(&chain, rt, kind, places, strategy, false, 11);
  for (par *q = &sep; q; q = q == &sep ? &chain : NULL)
    PE_CK_OK(pe_par_exec_run(q->init, NULL, 0, NULL, 0, NULL, NULL, NULL));

  source c;
  source_init(&c, rt, places, STEPS);
  c.would_block_every = would_block_every;
  pe_tensor out;
  pe_tensor_init(&out);
  int64_t steps = -1;
  PE_CK_OK(run_steps(&chain, &c, &steps, &out));
  ck_assert_int_eq(steps, STEPS);
  ck_assert_int_eq(c.done_calls, STEPS);
  ck_assert_int_eq(c.next_calls, STEPS + 1 + c.would_blocks); /* +1: the END answer */
  ck_assert_msg(!c.order_broken, "next/done out of order or may_block wrong");
  if (kind == PE_PLACE_CPU) {
    /* Host places: the workers chain the steps; the caller asks only for
     * step 0, after a WOULD_BLOCK, and never else. */
    ck_assert_int_eq(c.worker_asks, STEPS - 1); /* steps 1.. are first asked on a worker */
    /* Steps k in 1..STEPS-1 with k % every == 1. */
    int want_wb = would_block_every ? (STEPS - 2) / would_block_every + 1 : 0;
    ck_assert_int_eq(c.would_blocks, want_wb);
    ck_assert_int_eq(c.blocked_asks, c.would_blocks);
  } else {
    ck_assert_int_eq(c.worker_asks, 0); /* devices: the caller ends and starts every step */
  }
  for (int k = 0; k < STEPS; k++) {
    float want = par_step(&sep, k, sizes[k], NULL);
    ck_assert_msg(memcmp(&c.loss[k], &want, sizeof want) == 0, "step %d: chained %.9g, run %.9g", k,
                  c.loss[k], want);
  }
  expect_models_equal(&sep, &chain, places);
  /* The executor runs single steps afterwards, and both stay equal. */
  float a = par_step(&sep, 3, 9, NULL), b = par_step(&chain, 3, 9, NULL);
  ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "after: %.9g vs %.9g", a, b);

  pe_tensor_release(&out);
  par_free(&sep);
  par_free(&chain);
  pe_runtime_free(rt);
}

START_TEST(cpu2_allreduce) {
  steps_equal_runs(PE_PLACE_CPU, 2, 2, PE_STRATEGY_ALLREDUCE, 0);
}
END_TEST

START_TEST(cpu3_sharded_would_block) {
  steps_equal_runs(PE_PLACE_CPU, 3, 2, PE_STRATEGY_SHARDED, 3);
}
END_TEST

START_TEST(cpu2_reduce_one_worker) {
  steps_equal_runs(PE_PLACE_CPU, 2, 1, PE_STRATEGY_REDUCE, 2);
}
END_TEST

START_TEST(sim2_allreduce) {
  steps_equal_runs(PE_PLACE_SIM, 2, 2, PE_STRATEGY_ALLREDUCE, 0);
}
END_TEST

/* A bad feed in step 4, then a done that fails at step 2: each ends the
 * call with its error, the steps before it done; the executor is usable. */
START_TEST(errors_end_the_call) {
  pe_runtime *rt = rt_new(2);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 2, PE_STRATEGY_SHARDED, false, 3);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  pe_tensor out;
  pe_tensor_init(&out);
  int64_t steps = -1;

  source c;
  source_init(&c, rt, 2, STEPS);
  c.bad_step = 4;
  pe_status *st = run_steps(&q, &c, &steps, &out);
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
  const char *msg = pe_status_msg(st);
  fprintf(stderr, "bad step: %s\n", msg);
  ck_assert_msg(strstr(msg, "step 4") && strstr(msg, "'x'") && strstr(msg, "9") &&
                    strstr(msg, "(part of place 0)"),
                "%s", msg);
  pe_status_free(st);
  ck_assert_int_eq(steps, 4);
  ck_assert_int_eq(c.done_calls, 4);

  source_init(&c, rt, 2, STEPS);
  c.fail_done_at = 2;
  st = run_steps(&q, &c, &steps, &out);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(pe_status_msg(st), "test: done refuses step 2");
  pe_status_free(st);
  ck_assert_int_eq(steps, 2);

  /* No steps at all; bad arguments. */
  source_init(&c, rt, 2, 0);
  PE_CK_OK(run_steps(&q, &c, &steps, &out));
  ck_assert_int_eq(steps, 0);
  pe_step_source none = {NULL, src_done, &c};
  st = pe_par_exec_run_steps(q.step, &none, 2, &LOSS, 1, &out, NULL, &steps);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);

  /* Still trains: a full chained run after the failures. */
  source_init(&c, rt, 2, STEPS);
  PE_CK_OK(run_steps(&q, &c, &steps, &out));
  ck_assert_int_eq(steps, STEPS);
  for (int k = 0; k < STEPS; k++) ck_assert(isfinite(c.loss[k]));

  pe_tensor_release(&out);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_steps");
  TCase *tc = tcase_create("steps");
  tcase_add_test(tc, cpu2_allreduce);
  tcase_add_test(tc, cpu3_sharded_would_block);
  tcase_add_test(tc, cpu2_reduce_one_worker);
  tcase_add_test(tc, sim2_allreduce);
  tcase_add_test(tc, errors_end_the_call);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
