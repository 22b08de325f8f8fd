/* Captured steps through the parallel executor on cuda:0
 * (parallel/cuda_graph_step.c): the same training with pe_par_exec_set_cuda_graph
 * on and off gives bit-identical losses and parameters over 20 steps, for
 * the MLP, the CNN (with its dropout at p = 0.4: the replayed masks come
 * from the device generator delta) and a small residual CNN with batch
 * norm and dropout; the batch sizes cycle through par_equiv.h's, so each
 * size is its own key (warm-up, capture, replays) and a size change
 * replays that size's graph; temporaries given back between steps make the
 * next replay see moved buffers and capture again; a parameter set between
 * replays is read by the next replay; an out-of-range label inside a
 * replayed step gives what the unreplayed step gives.
 *
 * Losses and parameters come from the same executor code on both sides;
 * the only difference is whether the kernels are launched one by one or as
 * a replayed graph, so they must agree bit for bit (cuDNN's deterministic
 * algorithms, ops_cuda_dnn.c; test_cuda_train.c checks the repeat).
 *
 * Skipped without a GPU; without the CUDA backend too. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include "../train/par_equiv.h"
#include "cuda_test_main.h"

/* A residual CNN with batch norm and dropout (conf/models/resnet's shape,
 * smaller). */
static const char RESNET[] =
    "name resnet_small\n"
    "input image 1 28 28\n"
    "label label\n"
    "conv2d 8 3 pad=1 no_bias\n"
    "batch_norm act=relu\n"
    "save in\n"
    "conv2d 8 3 pad=1 no_bias\n"
    "batch_norm act=relu\n"
    "conv2d 8 3 pad=1 no_bias\n"
    "batch_norm\n"
    "add in act=relu\n"
    "save in\n"
    "conv2d 16 3 stride=2 pad=1 no_bias\n"
    "batch_norm act=relu\n"
    "conv2d 16 3 pad=1 no_bias\n"
    "batch_norm\n"
    "save main\n"
    "from in\n"
    "conv2d 16 1 stride=2 no_bias\n"
    "batch_norm\n"
    "add main act=relu\n"
    "pool2d avg global\n"
    "dropout 0.3\n"
    "fc 10\n"
    "loss softmax_with_cross_entropy\n"
    "accuracy\n"
    "optimizer momentum lr=0.05 mu=0.9\n";

static const char *const models[] = {"mlp", "cnn", RESNET};
#define N_MODELS ((int)(sizeof models / sizeof *models))
static const char *const model_names[] = {"mlp", "cnn", "resnet"};

static const eq_setting cuda1 = {"cuda:1",
                                 PE_PLACE_CUDA,
                                 1,
                                 PE_SYNC_WAIT_EVENT,
                                 PE_STRATEGY_ALLREDUCE,
                                 false,
                                 false,
                                 1e-4,
                                 false,
                                 3,
                                 2e-2};

/* The model's program with its dropout at dropout_prob (eq_program sets 0). */
static pe_program *program(int m, pe_model_spec *spec, float dropout_prob) {
  pe_program *p = eq_program(models[m], spec);
  const pe_block *b = p->blocks[p->main_block];
  for (int i = 0; i < b->n_ops; i++)
    if (strcmp(b->ops[i]->type, "dropout") == 0)
      PE_CK_OK(pe_op_set_float(b->ops[i], "dropout_prob", dropout_prob));
  return p;
}

enum { MAXP = 64 };

/* A model on cuda:0 with the sequential startup's values, graph on or off,
 * and the data generator. */
typedef struct run {
  pe_model_spec spec;
  pe_program *p;
  eq_seq s;
  eq_par e;
  eq_data d;
} run;

static void run_open(run *r, int m, float dropout_prob, bool graph) {
  r->p = program(m, &r->spec, dropout_prob);
  eq_seq_new(r->p, &r->s);
  eq_par_new(r->p, &cuda1, EQ_BUCKET_BYTES, &r->e);
  eq_par_load(&r->e, &r->s);
  PE_CK_OK(pe_par_exec_set_cuda_graph(r->e.step, graph ? PE_CUDA_GRAPH_ON : PE_CUDA_GRAPH_OFF));
  eq_data_init(&r->d, &r->spec);
}

static void run_close(run *r) {
  eq_data_free(&r->d);
  eq_par_free(&r->e);
  eq_seq_free(&r->s);
  pe_program_free(r->p);
  pe_model_spec_release(&r->spec);
}

/* One training: cuda:0 from the sequential startup's values, `steps`
 * steps, graph on or off. hook(step) (may be NULL) runs before each step
 * with the executor and model. Losses into loss[], the parameters into
 * params[] (*n_params of them), the captured-step counts into *gs. */
typedef void (*step_hook)(eq_par *e, int step);

static void train(int m, bool graph, int steps, step_hook hook, float *loss, pe_tensor *params,
                  int *n_params, pe_step_graph_stats *gs) {
  run r;
  run_open(&r, m, 0.4f, graph);
  eq_par *e = &r.e;
  for (int step = 1; step <= steps; step++) {
    if (hook) hook(e, step);
    loss[step - 1] = eq_par_step(e, &r.spec, &r.d, eq_data_batch(&r.d, step), cuda1.sync);
  }
  const pe_graph *g = pe_par_exec_graph(e->step);
  ck_assert_int_le(g->n_params, MAXP);
  *n_params = g->n_params;
  for (int i = 0; i < g->n_params; i++) PE_CK_OK(pe_model_get(e->m, g->params[i], &params[i]));
  const char *why = "";
  bool replayed = pe_par_exec_cuda_graph(e->step, &why, gs);
  printf("%s graph %s: replayed %d captures %lld replays %lld invalidations %lld reason '%s'\n",
         model_names[m], graph ? "on" : "off", replayed, (long long)gs->captures,
         (long long)gs->replays, (long long)gs->invalidations, why);
  run_close(&r);
}

/* Both trainings, compared bit for bit. */
static void graph_equals_plain(int m, step_hook hook, pe_step_graph_stats *gs) {
  enum { STEPS = 20 };
  float la[STEPS], lb[STEPS];
  pe_tensor a[MAXP], b[MAXP];
  for (int i = 0; i < MAXP; i++) pe_tensor_init(&a[i]), pe_tensor_init(&b[i]);
  int na = 0, nb = 0;
  pe_step_graph_stats off;
  train(m, false, STEPS, hook, la, a, &na, &off);
  train(m, true, STEPS, hook, lb, b, &nb, gs);
  ck_assert_int_eq(off.replays, 0);
  ck_assert_int_eq(na, nb);
  for (int k = 0; k < STEPS; k++)
    ck_assert_msg(memcmp(&la[k], &lb[k], sizeof la[k]) == 0, "%s step %d: loss %.9g vs %.9g",
                  model_names[m], k + 1, la[k], lb[k]);
  for (int i = 0; i < na; i++)
    ck_assert_msg(pe_tensor_bytes(&a[i]) > 0 && pe_tensor_bytes(&a[i]) == pe_tensor_bytes(&b[i]) &&
                      memcmp(a[i].data, b[i].data, pe_tensor_bytes(&a[i])) == 0,
                  "%s: parameter %d differs between graph and plain steps", model_names[m], i);
  for (int i = 0; i < MAXP; i++) pe_tensor_release(&a[i]), pe_tensor_release(&b[i]);
}

/* Three batch sizes over 20 steps (par_equiv.h's 32, 30, 32, 29 by step
 * mod 4): each size warms up, captures, then replays (20 - 3 warm-ups -
 * 3 captures = 14 replays). */
START_TEST(graph_steps_equal_plain_steps) {
  pe_step_graph_stats gs;
  graph_equals_plain(_i, NULL, &gs);
  ck_assert_int_eq(gs.captures, 3);
  ck_assert_int_eq(gs.replays, 14);
  ck_assert_int_eq(gs.invalidations, 0);
}
END_TEST

/* Temporaries given back before step 14: the next step of each key sees
 * moved buffers, drops the graphs and captures again; results unchanged. */
static void release_at_14(eq_par *e, int step) {
  if (step == 14) pe_par_exec_release(e->step);
}

START_TEST(moved_buffers_recapture) {
  pe_step_graph_stats gs;
  graph_equals_plain(0, release_at_14, &gs);
  ck_assert_int_ge(gs.invalidations, 1);
  ck_assert_int_gt(gs.captures, 3);
}
END_TEST

/* A parameter set between replays (a set_params, a checkpoint load): the
 * next replay reads the new value, as the plain step does. */
static void set_param_at_11(eq_par *e, int step) {
  if (step != 11) return;
  const pe_graph *g = pe_par_exec_graph(e->step);
  pe_tensor t;
  pe_tensor_init(&t);
  PE_CK_OK(pe_model_get(e->m, g->params[0], &t));
  float *v = pe_f32(&t);
  for (int64_t i = 0; i < pe_tensor_numel(&t); i++) v[i] *= 0.5f;
  PE_CK_OK(pe_model_set(e->m, g->params[0], &t));
  pe_tensor_release(&t);
}

START_TEST(set_params_between_replays_is_seen) {
  pe_step_graph_stats gs;
  graph_equals_plain(0, set_param_at_11, &gs);
  ck_assert_int_gt(gs.replays, 0);
}
END_TEST

/* Label 1000 (10 classes) in step 13, a replay of batch 30's key: the
 * same outcome (error code and text, or the loss bit for bit) as the
 * plain step. */
static void bad_label_outcome(bool graph, pe_status **st13, float *loss13) {
  run r;
  run_open(&r, 0, 0.0f, graph);
  eq_par *e = &r.e;
  *st13 = NULL;
  for (int step = 1; step <= 13; step++) {
    int n = eq_data_batch(&r.d, step);
    if (step == 13) r.d.y[3] = 1000;
    pe_tensor xt, yt, out;
    pe_feed feeds[2];
    eq_feeds(&r.spec, &r.d, n, &xt, &yt, feeds);
    pe_tensor_init(&out);
    const char *fetch = r.spec.loss;
    pe_run_opts ro = {.sync = cuda1.sync};
    pe_status *st = pe_par_exec_run(e->step, feeds, 2, &fetch, 1, &out, &ro, NULL);
    if (step == 13) {
      *st13 = st;
      if (!st) *loss13 = pe_f32(&out)[0];
      if (!st) st = pe_par_exec_sync(e->step);
      if (st && !*st13) *st13 = st;
    } else {
      PE_CK_OK(st);
    }
    pe_tensor_release(&out);
  }
  if (graph) {
    pe_step_graph_stats gs;
    pe_par_exec_cuda_graph(e->step, NULL, &gs);
    ck_assert_int_gt(gs.replays, 0);
  }
  run_close(&r);
}

START_TEST(error_in_replayed_step_reported_as_plain) {
  pe_status *plain = NULL, *graph = NULL;
  float lp = 0, lg = 0;
  bad_label_outcome(false, &plain, &lp);
  bad_label_outcome(true, &graph, &lg);
  printf("bad label: plain %s, graph %s\n", plain ? pe_status_msg(plain) : "ok",
         graph ? pe_status_msg(graph) : "ok");
  ck_assert_int_eq(plain != NULL, graph != NULL);
  if (plain) {
    ck_assert_int_eq(pe_status_code(plain), pe_status_code(graph));
  } else {
    ck_assert_int_eq(memcmp(&lp, &lg, sizeof lp), 0);
  }
  pe_status_free(plain);
  pe_status_free(graph);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_graph_exec");
  TCase *tc = tcase_create("graph_exec");
  tcase_add_loop_test(tc, graph_steps_equal_plain_steps, 0, N_MODELS);
  tcase_add_test(tc, moved_buffers_recapture);
  tcase_add_test(tc, set_params_between_replays_is_seen);
  tcase_add_test(tc, error_in_replayed_step_reported_as_plain);
  suite_add_tcase(s, tc);
  return s;
}

PE_CUDA_MAIN(suite, 1)

#endif
