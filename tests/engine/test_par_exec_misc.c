/* The parallel executor beyond equivalence: errors (missing feed, shape
 * mismatch, a failing kernel) become the run's error and the executor stays
 * usable; a write-after-read hazard stays correct with random delays
 * injected; two models train from two threads at once on one runtime
 * (their overlap and order: test_par_overlap.c);
 * model get/set/names; timeline spans; a startup run with nodes skipped. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../compiler/prog_util.h"
#include "check_main.h"
#include "par_test_util.h"

/* Feeds of step `step` with n rows; y[bad_row] = 99 when bad_row >= 0. */
typedef struct batch {
  float x[MAXB * (DIM + 1)];
  int64_t y[MAXB];
  pe_tensor xt, yt;
  pe_feed feeds[2];
} batch;

static void batch_make(batch *b, int step, int n, int xdim, int bad_row) {
  make_batch(step, n, b->x, b->y);
  if (bad_row >= 0) b->y[bad_row] = 99;
  pe_tensor_init(&b->xt);
  pe_tensor_init(&b->yt);
  pe_shape xs = PE_SHAPE(n, xdim), ys = PE_SHAPE(n, 1);
  pe_tensor_view(&b->xt, PE_F32, &xs, b->x);
  pe_tensor_view(&b->yt, PE_I64, &ys, b->y);
  b->feeds[0] = (pe_feed){"x", &b->xt};
  b->feeds[1] = (pe_feed){"y", &b->yt};
}

static void errors_on(pe_place_kind kind) {
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 3);
  par q;
  par_new(&q, rt, kind, 2, PE_STRATEGY_ALLREDUCE, false, 3);
  copy_params(&s, &q);
  pe_tensor out;
  pe_tensor_init(&out);
  batch b;

  /* missing feed */
  batch_make(&b, 0, 8, DIM, -1);
  expect_errors(pe_par_exec_run(q.step, b.feeds, 1, &LOSS, 1, &out, NULL, NULL), PE_EMISSING_FEED,
                "'y'", NULL);
  /* shape mismatch: x with DIM+1 columns */
  batch_make(&b, 0, 8, DIM + 1, -1);
  expect_errors(pe_par_exec_run(q.step, b.feeds, 2, &LOSS, 1, &out, NULL, NULL), PE_ESHAPE, "'x'",
                "[8,9]", NULL);
  /* a failing kernel: a label out of range in place 1's rows (rows 4..7) */
  batch_make(&b, 0, 8, DIM, 6);
  pe_status *st = pe_par_exec_run(q.step, b.feeds, 2, &LOSS, 1, &out, NULL, NULL);
  ck_assert_msg(st != NULL, "bad label: run succeeded");
  const char *msg = pe_status_msg(st);
  fprintf(stderr, "par_exec error message: %s\n", msg);
  ck_assert_msg(strstr(msg, "softmax_with_cross_entropy") && strstr(msg, ":1"),
                "message does not name the op and place 1: %s", msg);
  pe_status_free(st);
  /* unknown fetch */
  batch_make(&b, 0, 8, DIM, -1);
  const char *bad = "no_such_var";
  expect_errors(pe_par_exec_run(q.step, b.feeds, 2, &bad, 1, &out, NULL, NULL), PE_EUNKNOWN_VAR,
                "no_such_var", NULL);

  /* Usable afterwards. The failed step may have reached the optimizer of
   * parameters whose gradient did not depend on the bad rows, so restart
   * both sides from the same parameters, then compare a few steps. */
  copy_params(&s, &q);
  for (int step = 0; step < 3; step++) {
    float a = seq_step(&s, step, 10), c = par_step(&q, step, 10, NULL);
    ck_assert_msg(fabs(a - c) <= RTOL * fabs(a), "after errors, step %d: %.9g vs %.9g", step, a, c);
  }
  assert_places_identical(&q);
  pe_tensor_release(&out);
  par_free(&q);
  seq_free(&s);
  pe_runtime_free(rt);
}

START_TEST(errors_cpu) {
  errors_on(PE_PLACE_CPU);
}
END_TEST
START_TEST(errors_sim) {
  errors_on(PE_PLACE_SIM);
}
END_TEST

/* Running a graph before its parameters exist names the parameter. */
START_TEST(uninitialised_parameter) {
  pe_runtime *rt = rt_new(2);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, 3);
  pe_tensor out;
  pe_tensor_init(&out);
  batch b;
  batch_make(&b, 0, 8, DIM, -1);
  expect_errors(pe_par_exec_run(q.step, b.feeds, 2, &LOSS, 1, &out, NULL, NULL), PE_EUSE_BEFORE_DEF,
                "fc_0.w", NULL);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  PE_CK_OK(pe_par_exec_run(q.step, b.feeds, 2, &LOSS, 1, &out, NULL, NULL));
  ck_assert(isfinite(pe_f32(&out)[0]));
  pe_tensor_release(&out);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

/* --- hazard ---------------------------------------------------------------------------- */

/* t = 2x; u = 10t; t = 3x (write after u's read of t); out = t + u = 23x.
 * If the second write of t ran before u read it, out would be 33x. */
static pe_program *hazard_program(void) {
  pe_program *p = pe_program_new();
  pe_block *b;
  PU_OK(pe_program_add_block(p, -1, &b));
  pu_feed(b, "x", PE_F32, PE_SHAPE(-1, 4));
  pu_var(b, "t", PE_F32, NULL);
  pu_var(b, "u", PE_F32, NULL);
  pu_var(b, "out", PE_F32, NULL);
  PU_OK(pe_op_set_float(pu_op(b, "scale", "X", "x", NULL, "Out", "t", NULL), "scale", 2));
  PU_OK(pe_op_set_float(pu_op(b, "scale", "X", "t", NULL, "Out", "u", NULL), "scale", 10));
  PU_OK(pe_op_set_float(pu_op(b, "scale", "X", "x", NULL, "Out", "t", NULL), "scale", 3));
  pu_op(b, "elementwise_add", "X", "t", "Y", "u", NULL, "Out", "out", NULL);
  return p;
}

static void hazard_on(pe_place_kind kind, pe_sync_strategy sync) {
  pe_runtime *rt = rt_new(2);
  pe_program *p = hazard_program();
  const char *keep[] = {"out"};
  pe_pass_opts o = {.place_kind = kind, .n_places = 2, .n_keep = 1, .keep = keep};
  pe_ir ir = {p, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, true));
  pe_model *m;
  PE_CK_OK(pe_model_new(rt, kind, 2, 1, &m));
  pe_par_exec *e;
  PE_CK_OK(pe_par_exec_new(m, ir.graph, &e));
  ir.graph = NULL;
  pe_ir_destroy(&ir);
  float x[6 * 4];
  for (int i = 0; i < 24; i++) x[i] = (float)(i + 1);
  pe_tensor xt, out;
  pe_tensor_init(&xt);
  pe_tensor_init(&out);
  pe_shape xs = PE_SHAPE(6, 4);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_feed f = {"x", &xt};
  const char *fetch = "out";
  for (int r = 0; r < 12; r++) {
    pe_run_opts ro = {.sync = sync, .delay_us = 300, .delay_seed = (uint64_t)r + 1};
    PE_CK_OK(pe_par_exec_run(e, &f, 1, &fetch, 1, &out, &ro, NULL));
    ck_assert_int_eq(out.shape.d[0], 6);
    for (int i = 0; i < 24; i++)
      ck_assert_msg(pe_f32(&out)[i] == 23.0f * x[i], "run %d: out[%d] = %g, want %g", r, i,
                    pe_f32(&out)[i], 23.0f * x[i]);
  }
  pe_tensor_release(&out);
  pe_par_exec_free(e);
  pe_model_free(m);
  pe_program_free(p);
  pe_runtime_free(rt);
}

START_TEST(hazard_cpu) {
  hazard_on(PE_PLACE_CPU, PE_SYNC_WAIT_EVENT);
}
END_TEST
START_TEST(hazard_sim_event) {
  hazard_on(PE_PLACE_SIM, PE_SYNC_WAIT_EVENT);
}
END_TEST
START_TEST(hazard_sim_producer) {
  hazard_on(PE_PLACE_SIM, PE_SYNC_WAIT_PRODUCER);
}
END_TEST

/* --- two models from two threads ------------------------------------------------------ */

typedef struct job {
  pe_runtime *rt;
  pe_place_kind kind;
  uint64_t seed;
  float loss[5];
} job;

static void *train_job(void *arg) {
  job *j = arg;
  par q;
  par_new(&q, j->rt, j->kind, 2, PE_STRATEGY_ALLREDUCE, true, j->seed);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  for (int s = 0; s < 5; s++) j->loss[s] = par_step(&q, s, 10, NULL);
  par_free(&q);
  return NULL;
}

START_TEST(two_models_two_threads) {
  pe_runtime *rt = rt_new(2);
  job alone[2] = {{rt, PE_PLACE_CPU, 21, {0}}, {rt, PE_PLACE_SIM, 22, {0}}};
  job both[2] = {{rt, PE_PLACE_CPU, 21, {0}}, {rt, PE_PLACE_SIM, 22, {0}}};
  for (int i = 0; i < 2; i++) train_job(&alone[i]);
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, train_job, &both[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++)
    for (int s = 0; s < 5; s++)
      ck_assert_msg(alone[i].loss[s] == both[i].loss[s],
                    "model %d step %d: alone %.9g, concurrent %.9g", i, s, alone[i].loss[s],
                    both[i].loss[s]);
  for (int s = 0; s < 5; s++)
    ck_assert(isfinite(alone[0].loss[s]) && alone[0].loss[s] != alone[1].loss[s]);
  pe_runtime_free(rt);
}
END_TEST

/* --- random ops ------------------------------------------------------------------------ */

/* A seeded run gives the same numbers whatever the pool's thread count:
 * every dropout (on every place) mutates the model's PRNG variable, so the
 * draws happen in node order. */
START_TEST(random_ops_independent_of_threads) {
  mlp_with_dropout = true;
  for (int k = 0; k < 2; k++) {
    pe_place_kind kind = k ? PE_PLACE_SIM : PE_PLACE_CPU;
    float loss[2][4];
    for (int r = 0; r < 2; r++) {
      pe_runtime *rt = rt_new(r ? 3 : 1);
      par q;
      par_new(&q, rt, kind, 2, PE_STRATEGY_ALLREDUCE, false, 77);
      PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
      pe_run_opts ro = {.delay_us = r ? 50 : 0, .delay_seed = 5};
      for (int s = 0; s < 4; s++) loss[r][s] = par_step(&q, s, 10, &ro);
      assert_places_identical(&q);
      par_free(&q);
      pe_runtime_free(rt);
    }
    for (int s = 0; s < 4; s++)
      ck_assert_msg(loss[0][s] == loss[1][s], "%s step %d: 1 thread %.9g, 3 threads %.9g",
                    pe_place_kind_name(kind), s, loss[0][s], loss[1][s]);
  }
  mlp_with_dropout = false;
}
END_TEST

/* --cuda-graph on leaves host and sim places alone: no captured steps, the
 * reason says so, and the losses are bit for bit those of an executor
 * never told (dropout included). */
START_TEST(cuda_graph_on_leaves_cpu_and_sim_alone) {
  mlp_with_dropout = true;
  for (int k = 0; k < 2; k++) {
    pe_place_kind kind = k ? PE_PLACE_SIM : PE_PLACE_CPU;
    float loss[2][6];
    for (int r = 0; r < 2; r++) {
      pe_runtime *rt = rt_new(2);
      par q;
      par_new(&q, rt, kind, 1, PE_STRATEGY_ALLREDUCE, false, 77);
      if (r) PE_CK_OK(pe_par_exec_set_cuda_graph(q.step, PE_CUDA_GRAPH_ON));
      PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
      for (int s = 0; s < 6; s++) loss[r][s] = par_step(&q, s, 10, NULL);
      const char *why = NULL;
      pe_step_graph_stats gs;
      ck_assert(!pe_par_exec_cuda_graph(q.step, &why, &gs));
      if (r) ck_assert_str_eq(why, "no cuda place");
      ck_assert_int_eq(gs.captures + gs.replays + gs.fallbacks, 0);
      par_free(&q);
      pe_runtime_free(rt);
    }
    ck_assert_int_eq(memcmp(loss[0], loss[1], sizeof loss[0]), 0);
  }
  mlp_with_dropout = false;
}
END_TEST

/* --- place kinds ------------------------------------------------------------------- */

/* Every built kind takes any number of places up to PE_MAX_PLACES (cuda:N
 * too: its collectives are NCCL's); a kind not built in is refused with the
 * reason, before any device is opened (no GPU is touched here: this runs on
 * machines without one). */
START_TEST(model_place_kinds) {
  PE_CK_OK(pe_model_check_places(PE_PLACE_CPU, 2));
  PE_CK_OK(pe_model_check_places(PE_PLACE_SIM, 4));
  expect_errors(pe_model_check_places(PE_PLACE_SIM, PE_MAX_PLACES + 1), PE_EINVAL, "sim",
                (const char *)NULL);
  expect_errors(pe_model_check_places(PE_PLACE_CPU, 0), PE_EINVAL, "0 places", "cpu",
                (const char *)NULL);
  bool built = pe_device_kind_ops(PE_PLACE_CUDA) != NULL;
  if (built) {
    PE_CK_OK(pe_model_check_places(PE_PLACE_CUDA, 1));
    PE_CK_OK(pe_model_check_places(PE_PLACE_CUDA, 2));
    if (access("/dev/nvidia0", F_OK) == 0) return; /* a GPU: cuda models may open */
  } else {
    /* pe-bench says it too: the build lacks it, not "this daemon". */
    expect_errors(pe_model_check_places(PE_PLACE_CUDA, 1), PE_EINVAL, "cuda",
                  "not built in (this build has no cuda backend; configure with -DPE_CUDA=ON)",
                  (const char *)NULL);
  }
  /* No GPU (or no backend): a cuda model fails with the reason. */
  pe_runtime *rt = rt_new(1);
  pe_model *m = (pe_model *)1;
  expect_errors(pe_model_new(rt, PE_PLACE_CUDA, 2, 1, &m), built ? PE_EBACKEND : PE_EINVAL, "model",
                built ? "device cuda:0" : "not built", (const char *)NULL);
  ck_assert_ptr_null(m);
  /* The runtime is unharmed: a cpu model on it works. */
  PE_CK_OK(pe_model_new(rt, PE_PLACE_CPU, 1, 1, &m));
  pe_model_free(m);
  pe_runtime_free(rt);
}
END_TEST

/* --- model get / set ---------------------------------------------------------------- */

START_TEST(model_get_set) {
  pe_runtime *rt = rt_new(2);
  pe_model *m;
  PE_CK_OK(pe_model_new(rt, PE_PLACE_SIM, 3, 0, &m));
  ck_assert_int_eq(pe_model_places(m), 3);
  ck_assert(!pe_model_has(m, "w"));
  float v[6] = {1, 2, 3, 4, 5, 6};
  pe_tensor t, got;
  pe_tensor_init(&t);
  pe_tensor_init(&got);
  pe_shape sh = PE_SHAPE(2, 3);
  pe_tensor_view(&t, PE_F32, &sh, v);
  PE_CK_OK(pe_model_set(m, "w", &t));
  PE_CK_OK(pe_model_set(m, "b", &t));
  ck_assert(pe_model_has(m, "w"));
  for (int p = 0; p < 3; p++) {
    PE_CK_OK(pe_model_get_place(m, "w", p, &got));
    ck_assert_int_eq(got.shape.ndim, 2);
    ck_assert_int_eq(got.shape.d[1], 3);
    ck_assert_mem_eq(got.data, v, sizeof v);
  }
  ck_assert_int_eq(pe_model_bytes(m), 2 * (int64_t)sizeof v);
  const char **names;
  int n;
  PE_CK_OK(pe_model_names(m, &names, &n));
  ck_assert_int_eq(n, 2);
  ck_assert_str_eq(names[0], "b");
  ck_assert_str_eq(names[1], "w");
  free(names);
  /* mismatches name the variable and both shapes */
  pe_shape sh2 = PE_SHAPE(3, 2);
  pe_tensor_view(&t, PE_F32, &sh2, v);
  expect_errors(pe_model_set(m, "w", &t), PE_ESHAPE, "'w'", "[3,2]", "[2,3]", NULL);
  int64_t iv[6] = {0};
  pe_tensor_view(&t, PE_I64, &sh, iv);
  expect_errors(pe_model_set(m, "w", &t), PE_EDTYPE, "'w'", NULL);
  expect_errors(pe_model_get(m, "nope", &got), PE_EUNKNOWN_VAR, "nope", NULL);
  expect_errors(pe_model_get_place(m, "w", 3, &got), PE_EINVAL, "place 3", NULL);
  /* still the old value */
  PE_CK_OK(pe_model_get(m, "w", &got));
  ck_assert_mem_eq(got.data, v, sizeof v);
  pe_tensor_release(&got);
  pe_model_free(m);
  pe_runtime_free(rt);
}
END_TEST

/* get after a run sees the run's update (engine order), on sim where the
 * optimizer's work is asynchronous. */
START_TEST(model_get_after_run) {
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 4);
  par q;
  par_new(&q, rt, PE_PLACE_SIM, 2, PE_STRATEGY_REDUCE, false, 4);
  copy_params(&s, &q);
  pe_tensor before;
  pe_tensor_init(&before);
  PE_CK_OK(pe_model_get(q.m, "fc_0.w", &before));
  (void)par_step(&q, 0, 8, NULL);
  (void)seq_step(&s, 0, 8);
  ck_assert_msg(param_diff(&s, &q) < RTOL, "get after run: %g", param_diff(&s, &q));
  pe_tensor after;
  pe_tensor_init(&after);
  PE_CK_OK(pe_model_get_place(q.m, "fc_0.w", 1, &after));
  ck_assert(memcmp(before.data, after.data, pe_tensor_bytes(&after)) != 0);
  pe_tensor_release(&before);
  pe_tensor_release(&after);
  par_free(&q);
  seq_free(&s);
  pe_runtime_free(rt);
}
END_TEST

/* Under Reduce each optimizer state variable is updated on its parameter's
 * owner only, which makes that place its home (the model's value). A graph
 * that would update one on another single place is refused, naming the
 * variable and both places, and the homes stay. White box: the earlier
 * claim is moved by hand (two real Reduce programs with other owners need
 * other parameter sets). */
START_TEST(conflicting_homes_are_refused) {
  pe_runtime *rt = rt_new(2);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 2, PE_STRATEGY_REDUCE, false, 5);
  par_entry *on1 = NULL;
  int claimed = 0;
  for (int i = 0; i < q.m->n_ent; i++) {
    par_entry *en = q.m->ent[i];
    claimed += en->home_claimed;
    if (en->home_claimed && atomic_load(&en->home) == 1 && !on1) on1 = en;
  }
  ck_assert_msg(on1 && claimed >= 2, "no optimizer state homed on place 1 (%d claims)", claimed);
  atomic_store(&on1->home, 0); /* as if another graph updated it on place 0 */
  pe_program *p2 = mlp_program();
  pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 2, .strategy = PE_STRATEGY_REDUCE};
  pe_ir ir = {p2, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, false));
  pe_par_exec *again = NULL;
  char want[256];
  snprintf(want, sizeof want, "'%s' is updated on place 1 only by this graph and on place 0 only",
           on1->name);
  expect_error(pe_par_exec_new(q.m, ir.graph, &again), PE_EINVAL, want);
  ck_assert_ptr_null(again);
  ck_assert_int_eq(atomic_load(&on1->home), 0);
  ir.graph = NULL;
  pe_ir_destroy(&ir);
  pe_program_free(p2);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

/* An evaluation graph bound to the same model reads the parameters the
 * training graph updated (engine-ordered), on cpu and sim. */
static void eval_on(pe_place_kind kind) {
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 6);
  par q;
  par_new(&q, rt, kind, 2, PE_STRATEGY_ALLREDUCE, true, 6);
  copy_params(&s, &q);
  /* the eval program: same model, compiled for test, run by both sides */
  pe_program *ep = mlp_program(), *sp = mlp_program();
  pe_pass_opts o = {.place_kind = kind, .n_places = 2};
  pe_ir ir = {ep, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, true));
  pe_par_exec *eval;
  PE_CK_OK(pe_par_exec_new(q.m, ir.graph, &eval));
  ir.graph = NULL;
  pe_ir_destroy(&ir);
  PE_CK_OK(pe_program_compile(sp, true));
  pe_exec_opts eo = {.seed = 6, .threads = 1};
  pe_seq_exec *seval;
  PE_CK_OK(pe_seq_exec_new(sp, sp->main_block, s.scope, &eo, &seval));
  batch b;
  pe_tensor out;
  pe_tensor_init(&out);
  for (int step = 0; step < 3; step++) {
    (void)seq_step(&s, step, 12);
    (void)par_step(&q, step, 12, NULL);
    batch_make(&b, 100 + step, 9, DIM, -1);
    const pe_tensor *ref;
    PE_CK_OK(pe_seq_exec_run(seval, b.feeds, 2, &LOSS, 1, &ref));
    PE_CK_OK(pe_par_exec_run(eval, b.feeds, 2, &LOSS, 1, &out, NULL, NULL));
    float a = pe_f32(ref)[0], c = pe_f32(&out)[0];
    ck_assert_msg(fabs(a - c) <= RTOL * fabs(a), "%s eval after step %d: seq %.9g, parallel %.9g",
                  pe_place_kind_name(kind), step, a, c);
  }
  pe_tensor_release(&out);
  pe_seq_exec_free(seval);
  pe_par_exec_free(eval);
  pe_program_free(ep);
  pe_program_free(sp);
  par_free(&q);
  seq_free(&s);
  pe_runtime_free(rt);
}

START_TEST(eval_graph_cpu) {
  eval_on(PE_PLACE_CPU);
}
END_TEST
START_TEST(eval_graph_sim) {
  eval_on(PE_PLACE_SIM);
}
END_TEST

/* --- a startup with nodes skipped (pe_run_opts.skip: a partial Init) -------------------- */

static pe_tensor model_value(par *q, const char *name) {
  pe_tensor t;
  pe_tensor_init(&t);
  PE_CK_OK(pe_model_get(q->m, name, &t));
  return t;
}

/* Train a few steps, then run the startup again with the nodes that write
 * the first layer's weight (its initialiser and, on several places, its
 * broadcast) skipped: that weight keeps its trained bits on every place,
 * the other weight is initialised again, and the places agree. */
static void startup_skip_on(pe_place_kind kind) {
  pe_runtime *rt = rt_new(2);
  par q;
  par_new(&q, rt, kind, 2, PE_STRATEGY_ALLREDUCE, false, 5);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  for (int i = 0; i < 3; i++) par_step(&q, i, 8, NULL);
  const char *kept = "fc_0.w", *other = "fc_1.w";
  pe_tensor k0 = model_value(&q, kept), o0 = model_value(&q, other);
  const pe_graph *g = pe_par_exec_graph(q.init);
  bool skip[512] = {0};
  ck_assert_int_le(g->n_nodes, 512);
  int n_skip = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *n = &g->nodes[i];
    bool all = n->n_out_lv > 0;
    for (int k = 0; k < n->n_out_lv; k++) all &= !strcmp(g->lvars[n->out_lv[k]].name, kept);
    skip[i] = all;
    n_skip += all;
  }
  ck_assert_int_eq(n_skip, 2); /* the initialiser and the broadcast */
  pe_run_opts ro = {.skip = skip};
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, &ro, NULL));
  pe_tensor k1 = model_value(&q, kept), o1 = model_value(&q, other);
  ck_assert_msg(memcmp(k0.data, k1.data, pe_tensor_bytes(&k0)) == 0, "'%s' was written", kept);
  ck_assert_msg(memcmp(o0.data, o1.data, pe_tensor_bytes(&o0)) != 0, "'%s' was not", other);
  assert_places_identical(&q);
  pe_tensor *ts[] = {&k0, &o0, &k1, &o1};
  for (int i = 0; i < 4; i++) pe_tensor_release(ts[i]);
  par_free(&q);
  pe_runtime_free(rt);
}

START_TEST(startup_skip_cpu) {
  startup_skip_on(PE_PLACE_CPU);
}
END_TEST
START_TEST(startup_skip_sim) {
  startup_skip_on(PE_PLACE_SIM);
}
END_TEST

/* --- intra-op budget ------------------------------------------------------------------- */

static int team_of(pe_runtime *rt, pe_place_kind kind, int n_places) {
  pe_device *d;
  PE_CK_OK(pe_runtime_device(rt, (pe_place){kind, 0}, n_places, &d));
  return pe_stream_ctx(pe_device_stream(d, PE_STREAM_COMPUTE))->threads;
}

/* Any pool worker may run any cpu place's kernel while the others run
 * theirs, so a cpu place's OpenMP team is cores / max(places, workers):
 * workers x team never exceeds the cores (cores / places gave cpu:1 on two
 * workers two 2-thread teams on 2 cores). Sim kernels run on the device's own
 * stream thread, not on the pool: cores / places. */
START_TEST(intra_op_teams_fit_the_cores) {
  static const struct {
    int workers, places, cpu_team, sim_team;
  } cases[] = {
      {1, 1, 4, 4}, {2, 1, 2, 4}, {4, 1, 1, 4}, {8, 1, 1, 4}, {1, 2, 2, 2},
      {2, 2, 2, 2}, {4, 2, 1, 2}, {1, 4, 1, 1}, {2, 4, 1, 1}, {1, 8, 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pe_runtime_opts o = {.threads = cases[i].workers, .cores = 4};
    pe_runtime *rt;
    PE_CK_OK(pe_runtime_new(&o, &rt));
    int cpu = team_of(rt, PE_PLACE_CPU, cases[i].places);
    int sim = team_of(rt, PE_PLACE_SIM, cases[i].places);
    ck_assert_msg(cpu == cases[i].cpu_team && sim == cases[i].sim_team,
                  "%d workers, %d places on 4 cores: cpu team %d (want %d), sim team %d (want %d)",
                  cases[i].workers, cases[i].places, cpu, cases[i].cpu_team, sim,
                  cases[i].sim_team);
    if (cases[i].workers <= 4) ck_assert_int_le(cases[i].workers * cpu, 4);
    pe_runtime_free(rt);
  }
  /* The default pool: one worker per cpu place (each place then gets
   * cores / places) or cuda place (whose nodes only enqueue work), all cores
   * for sim places. */
  int cores = pe_cpu_cores();
  ck_assert_int_eq(pe_runtime_default_workers(PE_PLACE_CPU, 1), 1);
  ck_assert_int_eq(pe_runtime_default_workers(PE_PLACE_CPU, 2), cores < 2 ? cores : 2);
  ck_assert_int_eq(pe_runtime_default_workers(PE_PLACE_CPU, 1000), cores);
  ck_assert_int_eq(pe_runtime_default_workers(PE_PLACE_SIM, 4), cores);
  ck_assert_int_eq(pe_runtime_default_workers(PE_PLACE_CUDA, 1), 1);
  ck_assert_int_eq(pe_runtime_default_workers(PE_PLACE_CUDA, 1000), cores);
  pe_runtime_opts o = {.threads = pe_runtime_default_workers(PE_PLACE_CPU, 1)};
  pe_runtime *rt;
  PE_CK_OK(pe_runtime_new(&o, &rt));
  ck_assert_int_eq(team_of(rt, PE_PLACE_CPU, 1), cores);
  pe_runtime_free(rt);
}
END_TEST

/* --- timeline -------------------------------------------------------------------------- */

START_TEST(timeline_spans) {
  pe_runtime *rt = rt_new(2);
  for (int k = 0; k < 2; k++) {
    par q;
    par_new(&q, rt, k ? PE_PLACE_SIM : PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, 4);
    PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
    pe_timeline *tl;
    PE_CK_OK(pe_timeline_new(64, 4096, &tl));
    pe_run_opts ro = {.timeline = tl};
    (void)par_step(&q, 0, 8, &ro);
    ck_assert_int_eq(pe_timeline_dropped(tl), 0);
    /* every op node ran (collectives may fan out into chunk tasks) */
    int ops = 0;
    const pe_graph *g = pe_par_exec_graph(q.step);
    for (int i = 0; i < g->n_nodes; i++) ops += g->nodes[i].kind == PE_NODE_OP;
    ck_assert_int_ge((int)pe_timeline_spans(tl), ops);
    char *json;
    PE_CK_OK(pe_timeline_json(tl, &json, NULL));
    ck_assert_msg(strstr(json, k ? "sim:1/compute" : "worker"), "lane names missing");
    ck_assert_msg(strstr(json, "\"caller\"") && strstr(json, "\"run start\""),
                  "the caller's run start span is missing");
    ck_assert(strstr(json, "matmul") || strstr(json, "mul"));
    free(json);
    pe_timeline_free(tl);
    par_free(&q);
  }
  pe_runtime_free(rt);
}
END_TEST

static Suite *misc_suite(void) {
  Suite *s = suite_create("par_exec_misc");
  TCase *tc = tcase_create("misc");
  tcase_add_test(tc, errors_cpu);
  tcase_add_test(tc, errors_sim);
  tcase_add_test(tc, uninitialised_parameter);
  tcase_add_test(tc, hazard_cpu);
  tcase_add_test(tc, hazard_sim_event);
  tcase_add_test(tc, hazard_sim_producer);
  tcase_add_test(tc, two_models_two_threads);
  tcase_add_test(tc, random_ops_independent_of_threads);
  tcase_add_test(tc, cuda_graph_on_leaves_cpu_and_sim_alone);
  tcase_add_test(tc, model_place_kinds);
  tcase_add_test(tc, model_get_set);
  tcase_add_test(tc, model_get_after_run);
  tcase_add_test(tc, timeline_spans);
  tcase_add_test(tc, intra_op_teams_fit_the_cores);
  tcase_add_test(tc, eval_graph_cpu);
  tcase_add_test(tc, eval_graph_sim);
  tcase_add_test(tc, conflicting_homes_are_refused);
  tcase_add_test(tc, startup_skip_cpu);
  tcase_add_test(tc, startup_skip_sim);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(misc_suite)
