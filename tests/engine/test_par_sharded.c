/* The Sharded strategy (PE_STRATEGY_SHARDED, graph.h; par_sharded.c) against
 * AllReduce on the same program, seed and batches.
 *
 * Why bitwise: a sharded_update node sums the places' gradients slice by
 * slice in place order, the same order as all_reduce, and runs the same
 * element-wise optimizer kernel on each slice, so every loss and parameter
 * (on every place) and every optimizer state (on place 0, the only place
 * Sharded keeps it once it ran) must be bit-identical to AllReduce's. Any
 * difference (a slice summed twice or skipped, a chunk boundary off by one,
 * a small arg such as Beta1Pow updated once per chunk, a place not copied)
 * shows as a changed bit, and is a bug.
 *
 * The MLP's first weight (250 x 509 = 127250 elements) is cut into several
 * chunks (>= 16384 elements each, up to 2 x pool threads), so the update
 * runs as concurrent chunk tasks and completes its engine op from the last
 * one; the other parameters take one chunk. Tests:
 *   equivalence   sgd/momentum/adam x cpu:2, cpu:3, sim:4 (both sync rules):
 *                 10 steps on uneven batches (a place gets 0 rows on 4 places)
 *   kernel_error  adam with Beta1Pow = 1.5 on one parameter: the run fails
 *                 naming the node and Beta1Pow, and after a restore the same
 *                 executor trains bit-identically to AllReduce again
 *   many_runs     200 quick cpu:2 runs with 1, 2 and 4 pool threads (2, 4
 *                 and 7 chunks; some runs with random delays): bit-identical
 *                 losses and parameters
 *   tiny_params   a 1-unit hidden layer: a 1-element parameter, whose
 *                 learning rate and beta pows have its element count and so
 *                 are sliced with it
 *   denormal_velocity  flushed (or kept) denormals exactly as AllReduce's
 *                 optimizer, on cpu and sim, OpenMP teams on the AllReduce
 *                 side
 *   place_backward_before_collectives  on one worker, no update or
 *                 all-reduce runs inside a place's backward chain */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder_util.h"
#include "check_main.h"
#include "compiler/pass.h"
#include "engine/par_executor.h"
#include "engine/timeline.h"
#include "pe_builder.h"
#include "test_assert.h"

enum { CLASSES = 10, MAX_IN = 256, MAX_ROWS = 24, STEPS = 10 };

/* The MLP's sizes. The default's first weight, 250 x 509 = 127250
 * elements, is no multiple of 16 or of the chunk count: the chunks' ends
 * and the last 8192-element block of each are ragged. */
typedef struct net {
  int in, hidden;
} net;
static const net BIG = {250, 509};

/* The loss variable's name, as the builder named it. */
static char loss_name[64];

/* x [-1, in] -> fc(hidden, relu) -> fc(CLASSES) -> softmax xent -> mean,
 * trained with `opt`. */
static pe_program *program(const char *opt, net nt) {
  pe_builder *b = pe_builder_new();
  ck_assert_ptr_nonnull(b);
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, nt.in));
  const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
  pe_b_fc_opts relu = {.act = PE_B_ACT_RELU};
  const char *h = pe_builder_fc(b, x, nt.hidden, &relu);
  const char *logits = pe_builder_fc(b, h, CLASSES, NULL);
  const char *loss = pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, y, NULL));
  ck_assert_ptr_nonnull(loss);
  snprintf(loss_name, sizeof loss_name, "%s", loss);
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  if (!strncmp(opt, "adamw", 5))
    ck_assert_int_eq(pe_builder_adamw(b, 0.002f, 0.9f, 0.999f, 1e-8f), 0);
  else if (!strncmp(opt, "adam", 4))
    ck_assert_int_eq(pe_builder_adam(b, 0.002f, 0.9f, 0.999f, 1e-8f), 0);
  else if (!strncmp(opt, "momentum", 8))
    ck_assert_int_eq(pe_builder_momentum(b, 0.02f, 0.9f, false), 0);
  else
    ck_assert_int_eq(pe_builder_sgd(b, 0.1f), 0);
  if (strstr(opt, "+l2")) ck_assert_int_eq(pe_builder_weight_decay(b, 0.01f), 0);
  if (strstr(opt, "+1d")) ck_assert_int_eq(pe_builder_no_weight_decay_1d(b), 0);
  /* Warmup, cosine decay, then flat within the tests' 10 steps. */
  pe_lr_schedule_opts cos = {
      .type = "cosine", .warmup_steps = 2, .decay_steps = 5, .min_lr = 1e-3f};
  if (strstr(opt, "+cosine")) ck_assert_int_eq(pe_builder_lr_schedule(b, &cos), 0);
  return tb_finish(b);
}

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Batch of step s, n rows of `in` features: x uniform in [-0.5, 0.5), y =
 * argmax of the first CLASSES (or in) features: learnable, so the loss
 * visibly falls. */
typedef struct batch {
  float x[MAX_ROWS * MAX_IN];
  int64_t y[MAX_ROWS];
  pe_tensor xt, yt;
  pe_feed feeds[2];
} batch;

static void batch_make(batch *b, int s, int n, int in) {
  ck_assert_int_le(n, MAX_ROWS);
  ck_assert_int_le(in, MAX_IN);
  for (int i = 0; i < n * in; i++)
    b->x[i] =
        (float)((double)(mix((uint64_t)s * 1000003u + (uint64_t)i + 1) >> 11) / 9007199254740992.0 -
                0.5);
  for (int r = 0; r < n; r++) {
    int best = 0;
    for (int c = 1; c < CLASSES && c < in; c++)
      if (b->x[r * in + c] > b->x[r * in + best]) best = c;
    b->y[r] = best;
  }
  pe_tensor_init(&b->xt);
  pe_tensor_init(&b->yt);
  pe_shape xs = PE_SHAPE(n, in), ys = PE_SHAPE(n, 1);
  pe_tensor_view(&b->xt, PE_F32, &xs, b->x);
  pe_tensor_view(&b->yt, PE_I64, &ys, b->y);
  b->feeds[0] = (pe_feed){"x", &b->xt};
  b->feeds[1] = (pe_feed){"y", &b->yt};
}

/* Uneven on every place count; 3 rows on 4 places leaves one place empty. */
static const int ROWS[STEPS] = {24, 17, 24, 5, 3, 24, 11, 3, 20, 24};

static pe_runtime *rt_new(int threads) {
  pe_runtime_opts o = {.threads = threads, .cores = 2};
  pe_runtime *rt;
  PE_CK_OK(pe_runtime_new(&o, &rt));
  return rt;
}

/* One model trained by one strategy. */
typedef struct side {
  net nt;
  pe_program *prog;
  pe_model *m;
  pe_par_exec *step, *init;
} side;

/* Gradients every side keeps fetchable (grad_fetch). */
static const char *const GRADS[] = {"fc_0.w@GRAD", "fc_0.b@GRAD", "fc_1.w@GRAD", "fc_1.b@GRAD"};
enum { N_GRADS = 4 };

/* fuse: matmul + bias add (+ relu) as one op (fuse_conv_act), as the
 * daemon compiles. */
static void side_new_fused(side *s, pe_runtime *rt, const char *opt, net nt, pe_place_kind kind,
                           int n, pe_graph_strategy strategy, bool fuse) {
  s->nt = nt;
  s->prog = program(opt, nt);
  pe_pass_opts o = {.place_kind = kind,
                    .n_places = n,
                    .strategy = strategy,
                    .keep = GRADS,
                    .n_keep = N_GRADS,
                    .fuse_conv_act = fuse};
  pe_ir ir = {s->prog, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, false));
  /* The graph is what it claims: a sharded_update per parameter, or none. */
  int n_sharded = 0, n_allreduce = 0;
  for (int i = 0; i < ir.graph->n_nodes; i++) {
    n_sharded += ir.graph->nodes[i].kind == PE_NODE_SHARDED_UPDATE;
    n_allreduce += ir.graph->nodes[i].kind == PE_NODE_ALL_REDUCE;
  }
  ck_assert_int_eq(ir.graph->n_params, 4);
  ck_assert_int_eq(n_sharded, n > 1 && strategy == PE_STRATEGY_SHARDED ? 4 : 0);
  ck_assert_int_eq(n_allreduce, n > 1 && strategy == PE_STRATEGY_ALLREDUCE ? 4 : 0);
  PE_CK_OK(pe_model_new(rt, kind, n, 42, &s->m));
  pe_graph *g = ir.graph, *st = ir.startup;
  ir.graph = ir.startup = NULL;
  PE_CK_OK(pe_par_exec_new(s->m, g, &s->step));
  PE_CK_OK(pe_par_exec_new(s->m, st, &s->init));
  PE_CK_OK(pe_par_exec_run(s->init, NULL, 0, NULL, 0, NULL, NULL, NULL));
}

static void side_new(side *s, pe_runtime *rt, const char *opt, net nt, pe_place_kind kind, int n,
                     pe_graph_strategy strategy) {
  side_new_fused(s, rt, opt, nt, kind, n, strategy, false);
}

static void side_free(side *s) {
  pe_par_exec_free(s->step);
  pe_par_exec_free(s->init);
  pe_model_free(s->m);
  pe_program_free(s->prog);
}

/* Run step `step` with n rows; the run's status, the loss in *loss. */
static pe_status *side_run(side *s, int step, int n, const pe_run_opts *ro, float *loss) {
  batch *b = malloc(sizeof *b);
  ck_assert_ptr_nonnull(b);
  batch_make(b, step, n, s->nt.in);
  pe_tensor out;
  pe_tensor_init(&out);
  const char *fetch = loss_name;
  pe_run_stats stats;
  pe_status *st = pe_par_exec_run(s->step, b->feeds, 2, &fetch, 1, &out, ro, &stats);
  if (!st) {
    ck_assert_int_eq(stats.batch, n);
    ck_assert_int_eq(pe_tensor_numel(&out), 1);
    *loss = pe_f32(&out)[0];
  }
  pe_tensor_release(&out);
  free(b);
  return st;
}

static float side_step(side *s, int step, int n, const pe_run_opts *ro) {
  float loss = NAN;
  PE_CK_OK(side_run(s, step, n, ro, &loss));
  return loss;
}

/* Optimizer state (velocity, moments, beta pows): "<param>@<STATE>". */
static bool is_state(const char *name) {
  return strstr(name, "@VELOCITY") || strstr(name, "@MOMENT") || strstr(name, "@BETA");
}

/* Every persistable of a (AllReduce: parameters, velocities, moments, beta
 * pows, the learning rate) on every place is bitwise equal to a's on place
 * 0 and to b's (Sharded) on the same place, except, once b ran (b_ran), b's
 * optimizer state on places > 0, which b keeps on place 0 only: there it
 * must have no value. Before b's first run (after the startup broadcast, or
 * after a restore, which sets every place) it is still there and equal.
 * Returns how many variables were compared. */
static int expect_models_equal(side *a, side *b, const char *when, bool b_ran) {
  const char **na, **nb;
  int ca, cb;
  PE_CK_OK(pe_model_names(a->m, &na, &ca));
  PE_CK_OK(pe_model_names(b->m, &nb, &cb));
  ck_assert_int_eq(ca, cb);
  int n_places = pe_model_places(a->m);
  ck_assert_int_eq(pe_model_places(b->m), n_places);
  for (int i = 0; i < ca; i++) {
    ck_assert_str_eq(na[i], nb[i]);
    pe_tensor ref, ta, tb;
    pe_tensor_init(&ref);
    pe_tensor_init(&ta);
    pe_tensor_init(&tb);
    PE_CK_OK(pe_model_get_place(a->m, na[i], 0, &ref));
    for (int p = 0; p < n_places; p++) {
      PE_CK_OK(pe_model_get_place(a->m, na[i], p, &ta));
      if (b_ran && p > 0 && is_state(na[i])) {
        ck_assert_msg(memcmp(ta.data, ref.data, pe_tensor_bytes(&ta)) == 0,
                      "%s: '%s' differs on place %d from place 0 (AllReduce)", when, na[i], p);
        pe_status *st = pe_model_get_place(b->m, na[i], p, &tb);
        ck_assert_msg(pe_status_code(st) == PE_EUSE_BEFORE_DEF &&
                          strstr(pe_status_msg(st), "on place 0 only"),
                      "%s: sharded '%s' on place %d: %s", when, na[i], p,
                      st ? pe_status_msg(st) : "has a value");
        pe_status_free(st);
        continue;
      }
      PE_CK_OK(pe_model_get_place(b->m, na[i], p, &tb));
      char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
      ck_assert_msg(ta.dtype == tb.dtype && pe_shape_equal(&ta.shape, &tb.shape),
                    "%s: '%s' on place %d: %s %s vs %s %s", when, na[i], p, pe_dtype_name(ta.dtype),
                    pe_shape_str(&ta.shape, s1, sizeof s1), pe_dtype_name(tb.dtype),
                    pe_shape_str(&tb.shape, s2, sizeof s2));
      size_t bytes = pe_tensor_bytes(&ta);
      ck_assert_msg(bytes > 0, "%s: '%s' is empty on place %d", when, na[i], p);
      if (memcmp(ta.data, tb.data, bytes) != 0) {
        int64_t k = 0;
        if (ta.dtype == PE_F32)
          while (k < pe_tensor_numel(&ta) && !memcmp(&pe_f32(&ta)[k], &pe_f32(&tb)[k], 4)) k++;
        ck_abort_msg(
            "%s: '%s' on place %d differs between the models, first at element %lld "
            "(%.9g vs %.9g)",
            when, na[i], p, (long long)k, ta.dtype == PE_F32 ? pe_f32(&ta)[k] : 0.0,
            ta.dtype == PE_F32 ? pe_f32(&tb)[k] : 0.0);
      }
      ck_assert_msg(memcmp(ta.data, ref.data, bytes) == 0,
                    "%s: '%s' differs on place %d from place 0", when, na[i], p);
    }
    pe_tensor_release(&ref);
    pe_tensor_release(&ta);
    pe_tensor_release(&tb);
  }
  free(na);
  free(nb);
  return ca;
}

/* Persistable `name` of s's model, place 0, as a host tensor. */
static float get1(side *s, const char *name) {
  pe_tensor t;
  pe_tensor_init(&t);
  PE_CK_OK(pe_model_get(s->m, name, &t));
  ck_assert_int_eq(pe_tensor_numel(&t), 1);
  float v = pe_f32(&t)[0];
  pe_tensor_release(&t);
  return v;
}

/* --- equivalence --------------------------------------------------------------------------- */

typedef struct setting {
  pe_place_kind kind;
  int n;
  pe_sync_strategy sync;
  const char *label;
} setting;

static const setting SETTINGS[] = {
    {PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, "cpu:2"},
    {PE_PLACE_CPU, 3, PE_SYNC_WAIT_EVENT, "cpu:3"},
    {PE_PLACE_SIM, 4, PE_SYNC_WAIT_EVENT, "sim:4 wait-event"},
    {PE_PLACE_SIM, 4, PE_SYNC_WAIT_PRODUCER, "sim:4 wait-producer"},
};
/* momentum+l2: with weight decay (each slice decays once, as AllReduce's
 * every-place update does). adam+cosine: a learning-rate schedule (every
 * place computes the rate from its own counter; the sharded update reads
 * the rate of its slice's place). adamw+l2+1d: decoupled decay (0.01) on the
 * weights, none on the biases. */
static const char *const OPTS[] = {"sgd",         "momentum",    "adam",
                                   "momentum+l2", "adam+cosine", "adamw+l2+1d"};
enum { N_SETTINGS = 4, N_OPTS = 6 };

/* Loop index i: optimizer i / N_SETTINGS, setting i % N_SETTINGS. */
START_TEST(equivalence) {
  const char *opt = OPTS[_i / N_SETTINGS];
  const setting *st = &SETTINGS[_i % N_SETTINGS];
  pe_runtime *rt = rt_new(2);
  side ar, sh;
  side_new(&ar, rt, opt, BIG, st->kind, st->n, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, opt, BIG, st->kind, st->n, PE_STRATEGY_SHARDED);
  char when[96];
  snprintf(when, sizeof when, "%s %s startup", opt, st->label);
  int n_vars = expect_models_equal(&ar, &sh, when, false);
  /* 4 parameters + learning rate, + 4 velocities, + 4 x (2 moments, 2 pows),
   * + the schedule's step counter */
  ck_assert_int_eq(n_vars, (!strncmp(opt, "adam", 4)       ? 21
                            : !strncmp(opt, "momentum", 8) ? 9
                                                           : 5) +
                               (strstr(opt, "+cosine") ? 1 : 0));
  pe_run_opts ro = {.sync = st->sync};
  float losses[STEPS];
  char curve[STEPS * 12] = "";
  for (int s = 0; s < STEPS; s++) {
    float la = side_step(&ar, s, ROWS[s], &ro), lb = side_step(&sh, s, ROWS[s], &ro);
    ck_assert_msg(isfinite(la), "%s %s step %d: loss %g", opt, st->label, s, la);
    ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0,
                  "%s %s step %d (%d rows): AllReduce loss %.9g, Sharded %.9g", opt, st->label, s,
                  ROWS[s], la, lb);
    snprintf(when, sizeof when, "%s %s after step %d (%d rows)", opt, st->label, s, ROWS[s]);
    expect_models_equal(&ar, &sh, when, true);
    losses[s] = la;
    snprintf(curve + strlen(curve), sizeof curve - strlen(curve), " %.4f", la);
  }
  /* Step 0's batch again: after 10 updates its loss is lower. */
  float again_a = side_step(&ar, 0, ROWS[0], &ro), again_b = side_step(&sh, 0, ROWS[0], &ro);
  ck_assert_msg(memcmp(&again_a, &again_b, sizeof again_a) == 0,
                "%s %s, batch 0 again: %.9g vs %.9g", opt, st->label, again_a, again_b);
  expect_models_equal(&ar, &sh, "after batch 0 again", true);
  if (!strcmp(opt, "adam")) { /* one update per step, not one per chunk */
    ck_assert_float_eq(get1(&sh, "fc_0.w@BETA1POW"), get1(&ar, "fc_0.w@BETA1POW"));
    ck_assert_float_eq_tol(get1(&sh, "fc_0.w@BETA1POW"), powf(0.9f, STEPS + 2), 1e-6f);
  }
  if (strstr(opt, "+cosine")) { /* past warmup and decay: min_lr on every place's replica */
    ck_assert_float_eq(get1(&ar, "learning_rate"), 1e-3f);
    ck_assert_float_eq(get1(&sh, "learning_rate"), 1e-3f);
  }
  fprintf(stderr, "par_sharded %-8s %-19s loss:%s; batch 0 again %.4f\n", opt, st->label, curve,
          again_a);
  ck_assert_msg(again_a < losses[0] - 0.05f, "%s %s: batch 0's loss went from %.4f to %.4f", opt,
                st->label, losses[0], again_a);
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

/* --- fetching a parameter's gradient --------------------------------------------------------- */

/* Run step `step` with n rows, fetching the loss and GRADS into out[0..]. */
static void side_run_grads(side *s, int step, int n, const pe_run_opts *ro, pe_tensor *out) {
  batch *b = malloc(sizeof *b);
  ck_assert_ptr_nonnull(b);
  batch_make(b, step, n, s->nt.in);
  const char *fetch[1 + N_GRADS] = {loss_name};
  for (int k = 0; k < N_GRADS; k++) fetch[1 + k] = GRADS[k];
  PE_CK_OK(pe_par_exec_run(s->step, b->feeds, 2, fetch, 1 + N_GRADS, out, ro, NULL));
  free(b);
}

/* A gradient fetched by name is the whole batch's under every strategy:
 * AllReduce (a place's all-reduced copy), Reduce (the owner's) and Sharded
 * (summed at fetch time: no place holds the sum) give the same bits, and
 * match one place running the whole batch. Loop: cpu:2, sim:4. */
START_TEST(grad_fetch) {
  const setting *st = &SETTINGS[_i == 0 ? 0 : 2];
  pe_runtime *rt = rt_new(2);
  /* The one-place reference gets a one-core budget: with two its kernels
   * would open OpenMP teams, which ThreadSanitizer (uninstrumented libgomp)
   * reports as races. */
  pe_runtime *rt1;
  pe_runtime_opts o1 = {.threads = 2, .cores = 1};
  PE_CK_OK(pe_runtime_new(&o1, &rt1));
  side one, sides[3];
  static const pe_graph_strategy strat[3] = {PE_STRATEGY_ALLREDUCE, PE_STRATEGY_REDUCE,
                                             PE_STRATEGY_SHARDED};
  static const char *const names[3] = {"allreduce", "reduce", "sharded"};
  side_new(&one, rt1, "momentum", BIG, st->kind, 1, PE_STRATEGY_ALLREDUCE);
  for (int k = 0; k < 3; k++) side_new(&sides[k], rt, "momentum", BIG, st->kind, st->n, strat[k]);
  pe_run_opts ro = {.sync = st->sync};
  pe_tensor ref[1 + N_GRADS], got[3][1 + N_GRADS];
  for (int f = 0; f <= N_GRADS; f++) {
    pe_tensor_init(&ref[f]);
    for (int k = 0; k < 3; k++) pe_tensor_init(&got[k][f]);
  }
  for (int s = 0; s < 5; s++) { /* 24, 17, 24, 5, 3 rows: one empty place on sim:4 */
    side_run_grads(&one, s, ROWS[s], &ro, ref);
    for (int k = 0; k < 3; k++) side_run_grads(&sides[k], s, ROWS[s], &ro, got[k]);
    for (int f = 1; f <= N_GRADS; f++) {
      const char *g = GRADS[f - 1];
      ck_assert_msg(pe_shape_equal(&ref[f].shape, &got[0][f].shape), "%s: shape", g);
      for (int k = 1; k < 3; k++)
        ck_assert_msg(pe_tensor_bytes(&got[k][f]) == pe_tensor_bytes(&got[0][f]) &&
                          memcmp(got[k][f].data, got[0][f].data, pe_tensor_bytes(&got[0][f])) == 0,
                      "%s step %d (%d rows): %s differs between allreduce and %s", st->label, s,
                      ROWS[s], g, names[k]);
      double worst = 0, norm = 0;
      for (int64_t i = 0; i < pe_tensor_numel(&ref[f]); i++) {
        double a = pe_f32(&got[2][f])[i], b = pe_f32(&ref[f])[i];
        worst = fmax(worst, fabs(a - b) / fmax(1.0, fabs(b)));
        norm += b * b;
      }
      ck_assert_msg(norm > 0, "%s step %d: %s is all zero", st->label, s, g);
      ck_assert_msg(worst <= 1e-5,
                    "%s step %d (%d rows): %s differs from one place's by %.3g (relative)",
                    st->label, s, ROWS[s], g, worst);
    }
  }
  for (int f = 0; f <= N_GRADS; f++) {
    pe_tensor_release(&ref[f]);
    for (int k = 0; k < 3; k++) pe_tensor_release(&got[k][f]);
  }
  for (int k = 0; k < 3; k++) side_free(&sides[k]);
  side_free(&one);
  pe_runtime_free(rt1);
  pe_runtime_free(rt);
}
END_TEST

/* --- a failing kernel inside a sharded update ----------------------------------------------- */

static const setting ERR_SETTINGS[] = {
    {PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, "cpu:2"},
    {PE_PLACE_SIM, 3, PE_SYNC_WAIT_PRODUCER, "sim:3 wait-producer"},
};

/* Save every persistable of s (place 0) / set them all back. The names are
 * copied: the model's own die with it. */
typedef struct saved {
  int n;
  char **names;
  pe_tensor *t;
} saved;

static void save_all(side *s, saved *sv) {
  const char **names;
  PE_CK_OK(pe_model_names(s->m, &names, &sv->n));
  sv->names = calloc((size_t)sv->n, sizeof(*sv->names));
  sv->t = calloc((size_t)sv->n, sizeof(*sv->t));
  ck_assert(sv->names && sv->t);
  for (int i = 0; i < sv->n; i++) {
    sv->names[i] = strdup(names[i]);
    ck_assert_ptr_nonnull(sv->names[i]);
    pe_tensor_init(&sv->t[i]);
    PE_CK_OK(pe_model_get(s->m, sv->names[i], &sv->t[i]));
  }
  free(names);
}

static void restore_all(side *s, saved *sv) {
  for (int i = 0; i < sv->n; i++) PE_CK_OK(pe_model_set(s->m, sv->names[i], &sv->t[i]));
}

static void saved_free(saved *sv) {
  for (int i = 0; i < sv->n; i++) {
    pe_tensor_release(&sv->t[i]);
    free(sv->names[i]);
  }
  free(sv->t);
  free(sv->names);
}

START_TEST(kernel_error) {
  const setting *st = &ERR_SETTINGS[_i];
  pe_runtime *rt = rt_new(2);
  side ar, sh;
  side_new(&ar, rt, "adam", BIG, st->kind, st->n, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, "adam", BIG, st->kind, st->n, PE_STRATEGY_SHARDED);
  pe_run_opts ro = {.sync = st->sync};
  for (int s = 0; s < 2; s++) {
    float la = side_step(&ar, s, ROWS[s], &ro), lb = side_step(&sh, s, ROWS[s], &ro);
    ck_assert(memcmp(&la, &lb, sizeof la) == 0);
  }
  saved sv;
  save_all(&sh, &sv);
  /* The big (multi-chunk) weight's Beta1Pow, on every place: every chunk's
   * kernel call fails. The other parameters still update. */
  float bad = 1.5f;
  pe_tensor bt;
  pe_tensor_init(&bt);
  pe_shape one = PE_SHAPE(1);
  pe_tensor_view(&bt, PE_F32, &one, &bad);
  PE_CK_OK(pe_model_set(sh.m, "fc_0.w@BETA1POW", &bt));
  for (int attempt = 0; attempt < 2; attempt++) { /* fails the same way twice */
    float loss = NAN;
    pe_status *e = side_run(&sh, 2, ROWS[2], &ro, &loss);
    ck_assert_msg(e != NULL, "%s: Beta1Pow = 1.5: the run succeeded", st->label);
    const char *msg = pe_status_msg(e);
    if (attempt == 0) fprintf(stderr, "par_sharded %s error: %s\n", st->label, msg);
    ck_assert_msg(strstr(msg, "sharded_update(adam#") && strstr(msg, "fc_0.w)") &&
                      strstr(msg, "Beta1Pow") && strstr(msg, "1.5"),
                  "%s: message does not name the node, Beta1Pow and its value: %s", st->label, msg);
    pe_status_free(e);
    /* The failed node wrote nothing: Beta1Pow is still the bad value. */
    ck_assert_float_eq(get1(&sh, "fc_0.w@BETA1POW"), 1.5f);
  }
  /* Restore the state before the failed steps: the same executor then
   * follows AllReduce bit for bit again. */
  restore_all(&sh, &sv);
  saved_free(&sv);
  expect_models_equal(&ar, &sh, "after restore", false);
  for (int s = 2; s < 5; s++) {
    float la = side_step(&ar, s, ROWS[s], &ro), lb = side_step(&sh, s, ROWS[s], &ro);
    ck_assert_msg(isfinite(lb) && memcmp(&la, &lb, sizeof la) == 0,
                  "%s after the error, step %d: AllReduce %.9g, Sharded %.9g", st->label, s, la,
                  lb);
    expect_models_equal(&ar, &sh, "after the error", true);
  }
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

/* --- many quick runs: the asynchronous completion ------------------------------------------- */

enum { MANY = 200 };

/* MANY momentum steps of 1..8 rows on cpu:2 with `threads` pool workers;
 * the losses into loss[], the final persistables into *sv. With `delays`,
 * every 8th run sleeps each node a random 0..200 us before it runs, which
 * reorders the nodes around the updates. The first run is recorded on a
 * timeline: fc_0.w's update must have run as min(7, 4 x threads) chunks
 * (127250 elements, >= 16384 per chunk), one span each. */
static void many_runs(int threads, bool delays, float *loss, saved *sv) {
  pe_runtime *rt = rt_new(threads);
  side sh;
  side_new(&sh, rt, "momentum", BIG, PE_PLACE_CPU, 2, PE_STRATEGY_SHARDED);
  pe_timeline *tl;
  PE_CK_OK(pe_timeline_new(16, 1024, &tl));
  for (int s = 0; s < MANY; s++) {
    pe_run_opts ro = {.delay_us = delays && s % 8 == 5 ? 200 : 0, .delay_seed = (uint64_t)s + 1};
    ro.timeline = s == 0 ? tl : NULL;
    loss[s] = side_step(&sh, s, 1 + s % 8, &ro);
  }
  char *json;
  PE_CK_OK(pe_timeline_json(tl, &json, NULL));
  int spans = 0;
  for (const char *q = json; (q = strstr(q, " fc_0.w)\"")); q++) spans++;
  int want = 4 * threads < 7 ? 4 * threads : 7;
  ck_assert_msg(spans == want, "%d threads: fc_0.w's update ran as %d chunk spans, want %d",
                threads, spans, want);
  free(json);
  pe_timeline_free(tl);
  save_all(&sh, sv);
  side_free(&sh);
  pe_runtime_free(rt);
}

START_TEST(many_runs_any_thread_count) {
  static float ref[MANY], got[MANY];
  saved r, g;
  many_runs(1, false, ref, &r);
  ck_assert(isfinite(ref[MANY - 1]));
  for (int threads = 2; threads <= 4; threads += 2) {
    many_runs(threads, true, got, &g);
    for (int s = 0; s < MANY; s++)
      ck_assert_msg(memcmp(&ref[s], &got[s], sizeof(float)) == 0,
                    "%d threads, run %d: loss %.9g, 1 thread %.9g", threads, s, got[s], ref[s]);
    ck_assert_int_eq(g.n, r.n);
    for (int i = 0; i < r.n; i++) {
      ck_assert_str_eq(g.names[i], r.names[i]);
      ck_assert_int_eq(pe_tensor_bytes(&g.t[i]), pe_tensor_bytes(&r.t[i]));
      ck_assert_msg(memcmp(g.t[i].data, r.t[i].data, pe_tensor_bytes(&r.t[i])) == 0,
                    "%d threads: '%s' differs from the 1-thread run after %d runs", threads,
                    r.names[i], MANY);
    }
    saved_free(&g);
  }
  saved_free(&r);
}
END_TEST

/* --- schedule: a place's backward before the collectives -------------------------------------- */

/* One timeline span: its name and start. */
typedef struct span {
  char name[64];
  double ts;
} span;

static int span_cmp(const void *a, const void *b) {
  double x = ((const span *)a)->ts, y = ((const span *)b)->ts;
  return x < y ? -1 : x > y;
}

/* The op spans of a timeline's JSON ("run start" left out), by start. */
static int spans_of(const char *json, span *out, int max) {
  int n = 0;
  for (const char *q = json; (q = strstr(q, "{\"name\":\"")) && n < max; q++) {
    const char *name = q + 9, *end = strchr(name, '"');
    const char *ts = strstr(q, "\"ts\":");
    if (!end || !ts || !strstr(q, "\"ph\":\"X\"")) continue;
    if (strstr(q, "\"ph\":\"X\"") > strchr(q, '}')) continue; /* metadata record */
    int len = (int)(end - name) < 63 ? (int)(end - name) : 63;
    if (len == 9 && !strncmp(name, "run start", 9)) continue;
    memcpy(out[n].name, name, (size_t)len);
    out[n].name[len] = 0;
    out[n].ts = strtod(ts + 5, NULL);
    n++;
  }
  qsort(out, (size_t)n, sizeof *out, span_cmp);
  return n;
}

/* On one pool worker the schedule is deterministic. With matmuls fused (a
 * backward matmul reads its weight, so it is an engine op like the
 * updates), the second place to reach its fc_1 gradient made the fc_1
 * update (Sharded) or all-reduce (AllReduce) ready together with its next
 * backward op, and the worker ran the collective first: the place's
 * backward chain, the step's critical path, waited for work that any idle
 * worker could do later (par_node_done). Now no collective runs between a
 * place's first and last backward op. Loop index: Sharded, AllReduce. */
START_TEST(place_backward_before_collectives) {
  pe_graph_strategy strategy = _i ? PE_STRATEGY_ALLREDUCE : PE_STRATEGY_SHARDED;
  pe_runtime *rt = rt_new(1);
  side sd;
  side_new_fused(&sd, rt, "momentum", BIG, PE_PLACE_CPU, 2, strategy, true);
  pe_timeline *tl;
  PE_CK_OK(pe_timeline_new(8, 1024, &tl));
  pe_run_opts ro = {.timeline = tl};
  float loss;
  PE_CK_OK(side_run(&sd, 0, 24, &ro, &loss));
  char *json;
  PE_CK_OK(pe_timeline_json(tl, &json, NULL));
  enum { MAX_SPANS = 256 };
  span *sp = calloc(MAX_SPANS, sizeof *sp);
  ck_assert_ptr_nonnull(sp);
  int n = spans_of(json, sp, MAX_SPANS);
  int n_coll = 0;
  for (int i = 0; i < n; i++)
    n_coll += strstr(sp[i].name, "sharded_update") || strstr(sp[i].name, "all_reduce");
  ck_assert_msg(n_coll >= 4, "%s: %d collective spans in %d", pe_strategy_name(strategy), n_coll,
                n);
  for (int p = 0; p < 2; p++) {
    char at[8];
    snprintf(at, sizeof at, "@p%d", p);
    int first = -1, last = -1;
    for (int i = 0; i < n; i++)
      if (strstr(sp[i].name, "_grad#") && strstr(sp[i].name, at)) {
        if (first < 0) first = i;
        last = i;
      }
    ck_assert_int_ge(first, 0);
    for (int i = first; i < last; i++)
      ck_assert_msg(!strstr(sp[i].name, "sharded_update") && !strstr(sp[i].name, "all_reduce"),
                    "%s: '%s' ran inside place %d's backward ('%s' .. '%s')",
                    pe_strategy_name(strategy), sp[i].name, p, sp[first].name, sp[last].name);
  }
  free(sp);
  free(json);
  pe_timeline_free(tl);
  side_free(&sd);
  pe_runtime_free(rt);
}
END_TEST

/* --- tiny parameters ------------------------------------------------------------------------ */

/* in 3 -> hidden 1 -> CLASSES: fc_0.b has 1 element, fc_0.w 3, fc_1.w 10:
 * every arg of fc_0.b's update (LearningRate, Beta1Pow, ... included) has
 * Param's element count, so the node slices them all; the others keep their
 * [1] args whole. Loop index: adam / momentum on cpu:3 and sim:2. */
START_TEST(tiny_params) {
  static const net TINY = {3, 1};
  const char *opt = _i / 2 ? "momentum" : "adam";
  pe_place_kind kind = _i % 2 ? PE_PLACE_SIM : PE_PLACE_CPU;
  int n = _i % 2 ? 2 : 3;
  pe_runtime *rt = rt_new(2);
  side ar, sh;
  side_new(&ar, rt, opt, TINY, kind, n, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, opt, TINY, kind, n, PE_STRATEGY_SHARDED);
  expect_models_equal(&ar, &sh, "tiny startup", false);
  for (int s = 0; s < STEPS; s++) {
    float la = side_step(&ar, s, ROWS[s], NULL), lb = side_step(&sh, s, ROWS[s], NULL);
    ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0, "tiny %s step %d: %.9g vs %.9g", opt, s, la,
                  lb);
    char when[64];
    snprintf(when, sizeof when, "tiny %s after step %d", opt, s);
    expect_models_equal(&ar, &sh, when, true);
  }
  if (!strcmp(opt, "adam")) { /* 0.9^11: one update per step */
    ck_assert_float_eq(get1(&sh, "fc_0.b@BETA1POW"), get1(&ar, "fc_0.b@BETA1POW"));
    ck_assert_float_eq_tol(get1(&sh, "fc_0.b@BETA1POW"), powf(0.9f, STEPS + 1), 1e-6f);
  }
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

/* --- denormals: the same flushing rule on both paths ------------------------------------------ */

/* The update must flush (or keep) denormals exactly as the per-place
 * optimizer does (core/fpenv.h): it runs on other threads (a pool worker
 * per chunk, or place 0's comm stream on sim) and with a one-thread ctx,
 * where AllReduce's kernel may use an OpenMP team (cores 4 over 2 places).
 * fc_0.w's velocity is set to a denormal and an all-zero batch makes its
 * gradient 0, so v = mu * v: 0 when flushed, mu * v when kept. Loop index:
 * keep_denormals (i / 2) x cpu:2 / sim:2 (i % 2). */
START_TEST(denormal_velocity) {
  int keep = _i / 2;
  pe_place_kind kind = _i % 2 ? PE_PLACE_SIM : PE_PLACE_CPU;
  /* Under TSan no teams: libgomp is not instrumented, so a team's reads
   * of its parent's stack read as races (./pe, run_tsan). */
#ifdef __SANITIZE_THREAD__
  pe_runtime_opts o = {.threads = 2, .cores = 2, .keep_denormals = keep};
#else
  pe_runtime_opts o = {.threads = 2, .cores = 4, .keep_denormals = keep};
#endif
  pe_runtime *rt;
  PE_CK_OK(pe_runtime_new(&o, &rt));
  side ar, sh;
  side_new(&ar, rt, "momentum", BIG, kind, 2, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, "momentum", BIG, kind, 2, PE_STRATEGY_SHARDED);
  int64_t numel = (int64_t)BIG.in * BIG.hidden;
  float *v = malloc((size_t)numel * sizeof(float));
  ck_assert_ptr_nonnull(v);
  const float tiny = 1e-39f; /* denormal: below FLT_MIN = 1.18e-38 */
  for (int64_t k = 0; k < numel; k++) v[k] = tiny;
  pe_tensor vt;
  pe_tensor_init(&vt);
  pe_shape vs = PE_SHAPE(BIG.in, BIG.hidden);
  pe_tensor_view(&vt, PE_F32, &vs, v);
  PE_CK_OK(pe_model_set(ar.m, "fc_0.w@VELOCITY", &vt));
  PE_CK_OK(pe_model_set(sh.m, "fc_0.w@VELOCITY", &vt));
  /* 8 rows of zeros: x^T dh = 0 for fc_0.w. */
  static float x[8 * MAX_IN];
  int64_t y[8] = {0};
  pe_tensor xt, yt, out;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_init(&out);
  pe_shape xs = PE_SHAPE(8, BIG.in), ys = PE_SHAPE(8, 1);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_tensor_view(&yt, PE_I64, &ys, y);
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  const char *fetch = loss_name;
  PE_CK_OK(pe_par_exec_run(ar.step, feeds, 2, &fetch, 1, &out, NULL, NULL));
  PE_CK_OK(pe_par_exec_run(sh.step, feeds, 2, &fetch, 1, &out, NULL, NULL));
  pe_tensor_release(&out);
  expect_models_equal(&ar, &sh, keep ? "denormals kept" : "denormals flushed", true);
  volatile float mu = 0.9f, dn = tiny;
  float want = keep ? mu * dn : 0.0f;
  ck_assert(!keep || (want > 0 && want < 1.17549435e-38f));
  for (int p = 0; p < 2; p++) {
    pe_tensor t;
    pe_tensor_init(&t);
    /* AllReduce's on both places; Sharded's on place 0 (the only one). */
    PE_CK_OK(pe_model_get_place(p ? ar.m : sh.m, "fc_0.w@VELOCITY", p, &t));
    for (int64_t k = 0; k < numel; k += 997)
      ck_assert_msg(pe_f32(&t)[k] == want,
                    "%s keep_denormals %d, place %d: velocity[%lld] = %g, "
                    "want %g",
                    pe_place_kind_name(kind), keep, p, (long long)k, pe_f32(&t)[k], want);
    pe_tensor_release(&t);
  }
  free(v);
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_sharded");
  TCase *tc = tcase_create("sharded");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, equivalence, 0, N_OPTS * N_SETTINGS);
  tcase_add_loop_test(tc, kernel_error, 0, 2);
  tcase_add_loop_test(tc, grad_fetch, 0, 2);
  tcase_add_test(tc, many_runs_any_thread_count);
  tcase_add_loop_test(tc, tiny_params, 0, 4);
  tcase_add_loop_test(tc, denormal_velocity, 0, 4);
  tcase_add_loop_test(tc, place_backward_before_collectives, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
