/* Helpers of the Sharded strategy's tests (test_par_sharded*.c): an MLP
 * trained by one strategy (a side), its batches, and a bitwise comparison
 * of two sides' models. Header-only; each suite is its own executable.
 *
 * The Sharded strategy (PE_STRATEGY_SHARDED, graph.h; parallel/sharded.c) against
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
 * one; the other parameters take one chunk. */
#ifndef PE_TESTS_SHARDED_TEST_UTIL_H
#define PE_TESTS_SHARDED_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder_util.h"
#include "compiler/pass.h"
#include "engine/parallel/executor.h"
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
static inline pe_program *program(const char *opt, net nt) {
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

static inline uint64_t mix(uint64_t z) {
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

static inline void batch_make(batch *b, int s, int n, int in) {
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

static inline pe_runtime *rt_new(int threads) {
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
static inline void side_new_fused(side *s, pe_runtime *rt, const char *opt, net nt,
                                  pe_place_kind kind, int n, pe_graph_strategy strategy,
                                  bool fuse) {
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

static inline void side_new(side *s, pe_runtime *rt, const char *opt, net nt, pe_place_kind kind,
                            int n, pe_graph_strategy strategy) {
  side_new_fused(s, rt, opt, nt, kind, n, strategy, false);
}

static inline void side_free(side *s) {
  pe_par_exec_free(s->step);
  pe_par_exec_free(s->init);
  pe_model_free(s->m);
  pe_program_free(s->prog);
}

/* Run step `step` with n rows; the run's status, the loss in *loss. */
static inline pe_status *side_run(side *s, int step, int n, const pe_run_opts *ro, float *loss) {
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

static inline float side_step(side *s, int step, int n, const pe_run_opts *ro) {
  float loss = NAN;
  PE_CK_OK(side_run(s, step, n, ro, &loss));
  return loss;
}

/* Optimizer state (velocity, moments, beta pows): "<param>@<STATE>". */
static inline bool is_state(const char *name) {
  return strstr(name, "@VELOCITY") || strstr(name, "@MOMENT") || strstr(name, "@BETA");
}

/* Every persistable of a (AllReduce: parameters, velocities, moments, beta
 * pows, the learning rate) on every place is bitwise equal to a's on place
 * 0 and to b's (Sharded) on the same place, except, once b ran (b_ran), b's
 * optimizer state on places > 0, which b keeps on place 0 only: there it
 * must have no value. Before b's first run (after the startup broadcast, or
 * after a restore, which sets every place) it is still there and equal.
 * Returns how many variables were compared. */
static inline int expect_models_equal(side *a, side *b, const char *when, bool b_ran) {
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
static inline float get1(side *s, const char *name) {
  pe_tensor t;
  pe_tensor_init(&t);
  PE_CK_OK(pe_model_get(s->m, name, &t));
  ck_assert_int_eq(pe_tensor_numel(&t), 1);
  float v = pe_f32(&t)[0];
  pe_tensor_release(&t);
  return v;
}

typedef struct setting {
  pe_place_kind kind;
  int n;
  pe_sync_strategy sync;
  const char *label;
} setting;

#endif
