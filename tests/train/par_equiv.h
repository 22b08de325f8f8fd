/* Equivalence of the parallel executor with the sequential reference,
 * shared by test_par_equiv_mlp.c, test_par_equiv_cnn.c and
 * test_par_equiv_residual.c (a model file's text).
 * Header-only: each suite is its own executable.
 *
 * One "pair" trains a model from pe_models.h twice on the same global
 * batches: with the sequential executor (the reference) and with the
 * parallel executor on N places. Both start from the same parameters: the
 * sequential startup block runs once and its persistables are copied into
 * the parallel model with pe_model_set (eq_pair_new); eq_startup_check runs
 * the parallel startup graph instead and compares it with the sequential
 * one bit for bit.
 *
 * Data: a generated, deterministic problem (a random linear teacher over
 * normal inputs, as in test_train_mlp.c), so the suite needs no data set
 * and the loss really moves during 20 steps. Batch sizes vary between steps
 * (MLP 32, 30, 32, 29; the CNN, ~30x the work per sample, half of that) so
 * that splits over 4 places are uneven and executors resize their buffers
 * between runs.
 *
 * Tolerance (EQ_LOSS_RTOL, EQ_PARAM_RTOL). The parallel run computes the
 * same sums in a different order: each place's matmul/conv reduces over its
 * own rows (and oneDNN picks its blocking from the row count), and the
 * all-reduce then adds the places' partial gradients; the loss fetch is a
 * weighted mean of per-place means. Each of these is a rounding difference
 * of a few ulp (f32 epsilon 1.2e-7) per reduction of K terms, i.e. up to
 * ~1e-6 relative, and 20 steps of momentum SGD carry it forward without
 * amplifying it much for the MLP and the residual model (every test prints
 * its measured maxima; under every ONEDNN_MAX_CPU_ISA from SSE41 to the
 * native AVX-512: at most 1.1e-7 on the loss and 2.7e-7 on the parameters,
 * i.e. 1-2 ulp). The CNN's loss spikes on these batches and amplifies
 * the differences after its first step: test_par_equiv_cnn.c has its
 * measurements and its tolerance from step 2 on. 1e-5 relative is still
 * three orders of magnitude below what a real bug produces: a gradient not all-reduced, a
 * wrong loss-gradient scale n_p/N, a place reading another place's rows,
 * or a skipped optimizer step changes the loss by > 1e-2 within two steps.
 * Parameters across places, on the other hand, must be bitwise identical:
 * every place applies the same update to the same all-reduced gradient
 * (AllReduce), or receives the owner's bytes (Reduce), or every slice's
 * bytes from the one sharded update (Sharded). */
#ifndef PE_TESTS_PAR_EQUIV_H
#define PE_TESTS_PAR_EQUIV_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pass.h"
#include "engine/parallel/executor.h"
#include "engine/seq_executor.h"
#include "pe_model_file.h"
#include "pe_models.h"
#include "test_assert.h"

#define EQ_STEPS 20
#define EQ_MAX_BATCH 32
#define EQ_LOSS_RTOL 1e-5
#define EQ_PARAM_RTOL 1e-5
#define EQ_SEED 7
/* Small buckets so that fused runs have several buckets, some holding
 * several gradients (the default 4 MiB would put the MLP in one). */
#define EQ_BUCKET_BYTES (256 * 1024)

static const int eq_batches[4] = {32, 30, 32, 29};

/* --- settings of the matrix -------------------------------------------------------- */

/* fuse_allreduce fuses all-reduces; under Reduce there are none (each
 * gradient goes to its owner), so "Reduce, fused" is the Reduce graph and
 * is not a row of its own; likewise under Sharded (every parameter of these
 * models has an element-wise optimizer, so no all-reduce is left). */

typedef struct eq_setting {
  const char *name;
  pe_place_kind kind;
  int n_places;
  pe_sync_strategy sync;
  pe_graph_strategy strategy;
  bool fuse;
  /* sim places opened with the device_memory hook: every host access to
   * place memory (feeds, fetches, model get/set, zeroed gradients, the
   * scaled loss-gradient seed) takes the copy path cuda places take. */
  bool device_memory;
  /* Relative tolerance of losses and parameters; 0: EQ_LOSS_RTOL and
   * EQ_PARAM_RTOL (cuda's kernels need more, tests/cuda/test_cuda_train.c
   * says why). */
  double rtol;
  /* Compile the parallel side with fuse_conv_act (conv2d or matmul + bias +
   * relu, batch_norm + relu, as one op); the sequential reference stays
   * unfused. */
  bool fuse_ops;
  /* After step `drift_after`, losses and parameters may differ by up to
   * drift_rtol (0: rtol throughout). For kernels of another library whose
   * rounding differences the training amplifies (tests/cuda/test_cuda_train.c
   * has the measurements); a bug shows in the first steps, which keep rtol. */
  int drift_after;
  double drift_rtol;
} eq_setting;

static inline double eq_loss_tol(const eq_setting *set) {
  return set->rtol > 0 ? set->rtol : EQ_LOSS_RTOL;
}
static inline double eq_param_tol(const eq_setting *set) {
  return set->rtol > 0 ? set->rtol : EQ_PARAM_RTOL;
}
/* tol, or drift_rtol once past drift_after. */
static inline double eq_step_tol(const eq_setting *set, int step, double tol) {
  return set->drift_rtol > 0 && step > set->drift_after ? set->drift_rtol : tol;
}

#define EQ_ROW(k, n, s, st, f, nm) \
  { nm, k, n, s, st, f }
static const eq_setting eq_settings[] = {
    EQ_ROW(PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, false, "cpu:2 allreduce"),
    EQ_ROW(PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, true,
           "cpu:2 allreduce fused"),
    EQ_ROW(PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, PE_STRATEGY_REDUCE, false, "cpu:2 reduce"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, false,
           "sim:4 event allreduce"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, true,
           "sim:4 event allreduce fused"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_EVENT, PE_STRATEGY_REDUCE, false, "sim:4 event reduce"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_ALLREDUCE, false,
           "sim:4 producer allreduce"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_ALLREDUCE, true,
           "sim:4 producer allreduce fused"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_REDUCE, false,
           "sim:4 producer reduce"),
    EQ_ROW(PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, PE_STRATEGY_SHARDED, false, "cpu:2 sharded"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_EVENT, PE_STRATEGY_SHARDED, false, "sim:4 event sharded"),
    EQ_ROW(PE_PLACE_SIM, 4, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_SHARDED, false,
           "sim:4 producer sharded"),
};
#define EQ_N_SETTINGS ((int)(sizeof eq_settings / sizeof eq_settings[0]))

/* The same on sim places whose memory the executor treats as device memory
 * (the path of cuda places, checked without a GPU). sim:1 is the shape of
 * cuda:0: one place, no collective, a loss-gradient seed of 1. */
#define EQ_DEVMEM(n, s, st, f, nm) \
  { nm, PE_PLACE_SIM, n, s, st, f, true }
static const eq_setting eq_devmem_settings[] = {
    EQ_DEVMEM(1, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, false, "sim:1 device memory"),
    EQ_DEVMEM(4, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, true,
              "sim:4 device memory event allreduce fused"),
    EQ_DEVMEM(4, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_REDUCE, false,
              "sim:4 device memory producer reduce"),
};
#define EQ_N_DEVMEM ((int)(sizeof eq_devmem_settings / sizeof eq_devmem_settings[0]))

/* Fused convolutions and fully-connected layers (the daemon's default)
 * against the unfused sequential program: the bias and relu move into the
 * conv2d or matmul and its gradient, which changes summation orders (the
 * bias gradient) but not the math. */
#define EQ_FUSED_OPS(k, n, s, st, nm) \
  { nm, k, n, s, st, false, false, 0, true }
static const eq_setting eq_fused_ops_settings[] = {
    EQ_FUSED_OPS(PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, PE_STRATEGY_SHARDED,
                 "cpu:2 sharded, fused ops"),
    EQ_FUSED_OPS(PE_PLACE_SIM, 4, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_ALLREDUCE,
                 "sim:4 producer allreduce, fused ops"),
};
#define EQ_N_FUSED_OPS ((int)(sizeof eq_fused_ops_settings / sizeof eq_fused_ops_settings[0]))

/* --- generated data ------------------------------------------------------------------- */

typedef struct eq_gen {
  uint64_t s;
} eq_gen;

static inline double eq_uniform(eq_gen *g) {
  uint64_t z = (g->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline double eq_normal(eq_gen *g) {
  return sqrt(-2.0 * log(eq_uniform(g))) * cos(6.283185307179586 * eq_uniform(g));
}

/* Step s's batch: eq_batches[s % 4] rows of dim inputs and labels given by
 * a fixed random linear teacher over the first 64 inputs. */
typedef struct eq_data {
  int64_t dim;
  int div; /* batch sizes are eq_batches / div (the CNN halves them) */
  float teacher[64 * 10];
  float *x;   /* EQ_MAX_BATCH * dim */
  int64_t *y; /* EQ_MAX_BATCH */
} eq_data;

static inline void eq_data_init(eq_data *d, const pe_model_spec *spec) {
  d->dim = 1;
  for (int i = 1; i < spec->image_ndim; i++) d->dim *= spec->image_dims[i];
  d->div = spec->image_ndim == 4 ? 2 : 1;
  eq_gen g = {12345};
  for (int i = 0; i < 64 * 10; i++) d->teacher[i] = (float)eq_normal(&g);
  d->x = malloc(sizeof *d->x * EQ_MAX_BATCH * (size_t)d->dim);
  d->y = malloc(sizeof *d->y * EQ_MAX_BATCH);
  ck_assert(d->x && d->y);
}

static inline void eq_data_free(eq_data *d) {
  free(d->x);
  free(d->y);
}

/* Fill rows for step `step`; returns the batch size. */
static inline int eq_data_batch(eq_data *d, int step) {
  int n = eq_batches[step % 4] / d->div;
  eq_gen g = {1000u + (uint64_t)step};
  for (int i = 0; i < n; i++) {
    float *x = d->x + (size_t)i * d->dim;
    for (int64_t k = 0; k < d->dim; k++) x[k] = (float)eq_normal(&g);
    int best = 0;
    float s[10];
    for (int c = 0; c < 10; c++) {
      s[c] = 0;
      for (int k = 0; k < 64; k++) s[c] += x[k] * d->teacher[k * 10 + c];
      if (s[c] > s[best]) best = c;
    }
    d->y[i] = best;
  }
  return n;
}

/* --- the model ------------------------------------------------------------------------ */

/* The model's program, decoded and not compiled. Dropout (the CNN's) gets
 * p = 0: a parallel place draws its mask from its own stream of the
 * generator, so masks, and with them the losses, legitimately differ from
 * the sequential run; p = 0 keeps the op and its gradient in the graph
 * while making it the identity. */
static inline pe_program *eq_program(const char *name, pe_model_spec *spec) {
  char err[256];
  /* A name with a line break is a model file's text (pe_model_file.h). */
  int rc = strchr(name, '\n')
               ? pe_model_file_parse(name, strlen(name), "model", spec, err, sizeof err)
               : pe_model_spec_build(name, spec, err, sizeof err);
  ck_assert_msg(rc == 0, "%s", err);
  pe_program *p;
  PE_CK_OK(pe_program_decode(spec->bytes, spec->len, &p));
  const pe_block *b = p->blocks[p->main_block];
  for (int i = 0; i < b->n_ops; i++)
    if (strcmp(b->ops[i]->type, "dropout") == 0)
      PE_CK_OK(pe_op_set_float(b->ops[i], "dropout_prob", 0.0f));
  return p;
}

static inline void eq_feeds(const pe_model_spec *spec, eq_data *d, int n, pe_tensor *xt,
                            pe_tensor *yt, pe_feed feeds[2]) {
  pe_shape xs = pe_shape_make(spec->image_ndim, spec->image_dims), ys = PE_SHAPE(n, 1);
  xs.d[0] = n;
  pe_tensor_init(xt);
  pe_tensor_init(yt);
  pe_tensor_view(xt, PE_F32, &xs, d->x);
  pe_tensor_view(yt, PE_I64, &ys, d->y);
  feeds[0] = (pe_feed){spec->image, xt};
  feeds[1] = (pe_feed){spec->label, yt};
}

/* The sequential reference: train program, its model scope after the
 * startup block, the step executor. */
typedef struct eq_seq {
  pe_program *prog;
  pe_scope *scope;
  pe_seq_exec *step;
} eq_seq;

/* The scope after s->prog's startup block, and the main block's executor
 * (s->prog compiled). */
static inline void eq_seq_start(eq_seq *s) {
  s->scope = pe_scope_new(NULL);
  ck_assert(s->scope);
  pe_exec_opts eo = {.seed = EQ_SEED, .threads = 1};
  pe_seq_exec *init;
  PE_CK_OK(pe_seq_exec_new(s->prog, s->prog->startup_block, s->scope, &eo, &init));
  PE_CK_OK(pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL));
  pe_seq_exec_free(init);
  PE_CK_OK(pe_seq_exec_new(s->prog, s->prog->main_block, s->scope, &eo, &s->step));
}

static inline void eq_seq_new(const pe_program *p, eq_seq *s) {
  PE_CK_OK(pe_program_clone(p, &s->prog));
  PE_CK_OK(pe_program_compile(s->prog, false));
  eq_seq_start(s);
}

static inline void eq_seq_free(eq_seq *s) {
  pe_seq_exec_free(s->step);
  pe_scope_free(s->scope);
  pe_program_free(s->prog);
}

static inline float eq_seq_step(eq_seq *s, const pe_model_spec *spec, eq_data *d, int n) {
  pe_tensor xt, yt;
  pe_feed feeds[2];
  eq_feeds(spec, d, n, &xt, &yt, feeds);
  const char *fetch = spec->loss;
  const pe_tensor *out;
  PE_CK_OK(pe_seq_exec_run(s->step, feeds, 2, &fetch, 1, &out));
  return pe_f32(out)[0];
}

/* The parallel side: a runtime, a model on the setting's places, the main
 * graph's executor; the startup graph is kept for eq_startup_check. */
typedef struct eq_par {
  pe_runtime *rt;
  pe_model *m;
  pe_par_exec *step;
  pe_graph *startup;
} eq_par;

static inline void eq_par_new(const pe_program *p, const eq_setting *set, int64_t bucket_bytes,
                              eq_par *e) {
  pe_program *prog;
  PE_CK_OK(pe_program_clone(p, &prog));
  pe_pass_opts o = {.place_kind = set->kind,
                    .n_places = set->n_places,
                    .strategy = set->strategy,
                    .fuse = set->fuse,
                    .fuse_bucket_bytes = bucket_bytes,
                    .batch_hint = EQ_MAX_BATCH / set->n_places,
                    .fuse_conv_act = set->fuse_ops};
  pe_ir ir = {.prog = prog, .opts = &o};
  PE_CK_OK(pe_graph_compile(&ir, false));
  pe_graph *g = ir.graph;
  /* conv2d / matmul nodes with a Bias, batch_norm nodes with an
   * activation: the pass took where it should */
  int fused = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_op_desc *d = g->nodes[i].desc;
    const pe_attr *act = d ? pe_op_find_attr(d, "fuse_activation") : NULL;
    fused += d && (!strcmp(d->type, "conv2d") || !strcmp(d->type, "matmul")) &&
             pe_op_find_input(d, "Bias");
    fused += d && !strcmp(d->type, "batch_norm") && act && act->s[0];
  }
  ck_assert_msg(set->fuse_ops ? fused > 0 : fused == 0,
                "%s: %d fused conv2d / matmul / batch_norm nodes", set->name, fused);
  e->startup = ir.startup;
  ir.graph = ir.startup = NULL;
  pe_ir_destroy(&ir);
  pe_program_free(prog); /* the graphs own clones of it */
  ck_assert(g && g->ssa && e->startup);
  ck_assert_int_eq(g->fuse, set->fuse);
  if (set->fuse) ck_assert_msg(g->n_buckets > 1, "%s: %d buckets", set->name, g->n_buckets);
  /* One intra-op thread per place (what cpu:2 and sim:4 get on 2 cores
   * anyway; sim:1 would get 2): the executor is what is checked here, and
   * the TSan stage cannot see libgomp's team hand-offs (./pe says more). */
  pe_runtime_opts ro = {.cores = set->n_places, .sim_device_memory = set->device_memory};
  PE_CK_OK(pe_runtime_new(&ro, &e->rt));
  PE_CK_OK(pe_model_new(e->rt, set->kind, set->n_places, EQ_SEED, &e->m));
  if (set->device_memory) { /* the hook took: the copy paths are the ones tested */
    pe_device *d;
    PE_CK_OK(pe_runtime_device(e->rt, (pe_place){set->kind, 0}, set->n_places, &d));
    ck_assert(!pe_device_host_memory(d));
  }
  PE_CK_OK(pe_par_exec_new(e->m, g, &e->step));
}

static inline void eq_par_free(eq_par *e) {
  pe_par_exec_free(e->step);
  pe_graph_free(e->startup);
  pe_model_free(e->m);
  pe_runtime_free(e->rt);
}

/* Copy the sequential persistables into the parallel model (every place). */
static inline void eq_par_load(eq_par *e, const eq_seq *s) {
  int copied = 0;
  for (int i = 0; i < s->scope->n; i++) {
    const pe_var *v = s->scope->order[i];
    if (!v->persistable || !v->t.data) continue;
    PE_CK_OK(pe_model_set(e->m, v->name, &v->t));
    copied++;
  }
  ck_assert_int_gt(copied, 0);
}

static inline float eq_par_step(eq_par *e, const pe_model_spec *spec, eq_data *d, int n,
                                pe_sync_strategy sync) {
  pe_tensor xt, yt, out;
  pe_feed feeds[2];
  eq_feeds(spec, d, n, &xt, &yt, feeds);
  pe_tensor_init(&out);
  const char *fetch = spec->loss;
  pe_run_opts ro = {.sync = sync};
  pe_run_stats st = {0};
  PE_CK_OK(pe_par_exec_run(e->step, feeds, 2, &fetch, 1, &out, &ro, &st));
  ck_assert_int_eq(st.batch, n);
  ck_assert_int_eq(pe_tensor_numel(&out), 1);
  float l = pe_f32(&out)[0];
  pe_tensor_release(&out);
  return l;
}

/* --- comparisons -------------------------------------------------------------------- */

/* Max |a - b| / max(1, |b|) over two f32 tensors of the same shape. */
static inline double eq_max_rel(const pe_tensor *a, const pe_tensor *b, const char *name) {
  ck_assert_msg(pe_shape_equal(&a->shape, &b->shape), "%s: shapes differ", name);
  /* No ck_assert inside the loop: every Check assertion writes its
   * location to the parent process (a syscall per element). */
  double m = 0;
  const float *pa = pe_f32(a), *pb = pe_f32(b);
  int64_t bad = -1;
  for (int64_t i = 0; i < pe_tensor_numel(a); i++) {
    double d = fabs((double)pa[i] - pb[i]) / fmax(1.0, fabs((double)pb[i]));
    if (!isfinite(pa[i]) && bad < 0) bad = i;
    if (d > m) m = d;
  }
  if (bad >= 0) ck_abort_msg("%s[%lld] = %f", name, (long long)bad, pa[bad]);
  return m;
}

/* Every trainable parameter is bitwise identical on all places; returns the
 * largest relative difference of place 0's value from the sequential one. */
static inline double eq_check_params(eq_par *e, const eq_seq *s, const char *what, int step,
                                     double tol) {
  const pe_graph *g = pe_par_exec_graph(e->step);
  ck_assert_int_gt(g->n_params, 0);
  double worst = 0;
  pe_tensor p0, pq;
  pe_tensor_init(&p0);
  pe_tensor_init(&pq);
  for (int i = 0; i < g->n_params; i++) {
    const char *name = g->params[i];
    PE_CK_OK(pe_model_get(e->m, name, &p0));
    for (int q = 1; q < g->n_places; q++) {
      PE_CK_OK(pe_model_get_place(e->m, name, q, &pq));
      ck_assert_msg(pe_shape_equal(&p0.shape, &pq.shape) && pe_tensor_bytes(&p0) > 0 &&
                        memcmp(p0.data, pq.data, pe_tensor_bytes(&p0)) == 0,
                    "%s, step %d: parameter %s differs between place 0 and place %d", what, step,
                    name, q);
    }
    const pe_var *ref = pe_scope_find(s->scope, name);
    ck_assert_msg(ref, "%s: parameter %s not in the sequential scope", what, name);
    double d = eq_max_rel(&p0, &ref->t, name);
    ck_assert_msg(d <= tol,
                  "%s, step %d: parameter %s differs from the sequential one by %.3g "
                  "(relative; tolerance %.1g)",
                  what, step, name, d, tol);
    if (d > worst) worst = d;
  }
  pe_tensor_release(&p0);
  pe_tensor_release(&pq);
  return worst;
}

/* Train both for EQ_STEPS steps and compare after every step. */
static inline void eq_run_setting(const char *model, const eq_setting *set) {
  pe_model_spec spec;
  pe_program *p = eq_program(model, &spec);
  eq_data d;
  eq_data_init(&d, &spec);
  eq_seq s;
  eq_seq_new(p, &s);
  eq_par e;
  eq_par_new(p, set, EQ_BUCKET_BYTES, &e);
  eq_par_load(&e, &s);
  char what[128];
  snprintf(what, sizeof what, "%s on %s", spec.name, set->name);
  double worst_loss = 0, worst_param = eq_check_params(&e, &s, what, 0, eq_param_tol(set));
  float first = 0, last = 0;
  for (int step = 1; step <= EQ_STEPS; step++) {
    int n = eq_data_batch(&d, step);
    float ls = eq_seq_step(&s, &spec, &d, n);
    float lp = eq_par_step(&e, &spec, &d, n, set->sync);
    ck_assert_msg(isfinite(ls) && isfinite(lp), "%s, step %d: loss %f vs %f", what, step, lp, ls);
    double dl = fabs((double)lp - ls) / fmax(1.0, fabs((double)ls));
    double loss_tol = eq_step_tol(set, step, eq_loss_tol(set));
    ck_assert_msg(dl <= loss_tol,
                  "%s, step %d: loss %.7f, sequential %.7f (relative difference %.3g, "
                  "tolerance %.1g)",
                  what, step, lp, ls, dl, loss_tol);
    if (dl > worst_loss) worst_loss = dl;
    double dp = eq_check_params(&e, &s, what, step, eq_step_tol(set, step, eq_param_tol(set)));
    if (dp > worst_param) worst_param = dp;
    /* PE_EQ_TRACE: each step's differences, to tell a drift that grows
     * step by step from a bug that shows at once. */
    if (getenv("PE_EQ_TRACE"))
      fprintf(stderr,
              "%s, step %d: loss %.7f vs %.7f, relative difference loss %.2g, "
              "parameters %.2g\n",
              what, step, lp, ls, dl, dp);
    if (step == 1) first = ls;
    last = ls;
  }
  fprintf(stderr,
          "par_equiv %s: loss %.4f -> %.4f over %d steps; max relative difference: loss %.2g, "
          "parameters %.2g\n",
          what, first, last, EQ_STEPS, worst_loss, worst_param);
  /* The comparison is only meaningful if training moved the loss. */
  ck_assert_msg(last < first, "%s: loss did not decrease (%f -> %f)", what, first, last);
  eq_par_free(&e);
  eq_seq_free(&s);
  eq_data_free(&d);
  pe_program_free(p);
  pe_model_spec_release(&spec);
}

/* The parallel startup graph (init on place 0, broadcast) gives every place
 * exactly the sequential startup's persistables (same seed, same
 * generator). */
static inline void eq_startup_check(const char *model, const eq_setting *set) {
  pe_model_spec spec;
  pe_program *p = eq_program(model, &spec);
  eq_seq s;
  eq_seq_new(p, &s);
  eq_par e;
  eq_par_new(p, set, EQ_BUCKET_BYTES, &e);
  pe_par_exec *init;
  PE_CK_OK(pe_par_exec_new(e.m, e.startup, &init));
  e.startup = NULL; /* owned by init */
  pe_run_opts ro = {.sync = set->sync};
  PE_CK_OK(pe_par_exec_run(init, NULL, 0, NULL, 0, NULL, &ro, NULL));
  pe_par_exec_free(init);
  int compared = 0;
  pe_tensor t;
  pe_tensor_init(&t);
  for (int i = 0; i < s.scope->n; i++) {
    const pe_var *v = s.scope->order[i];
    if (!v->persistable || !v->t.data) continue;
    for (int q = 0; q < set->n_places; q++) {
      PE_CK_OK(pe_model_get_place(e.m, v->name, q, &t));
      ck_assert_msg(t.dtype == v->t.dtype && pe_shape_equal(&t.shape, &v->t.shape) &&
                        memcmp(t.data, v->t.data, pe_tensor_bytes(&t)) == 0,
                    "%s on %s: startup value of %s on place %d differs from the sequential one",
                    spec.name, set->name, v->name, q);
    }
    compared++;
  }
  ck_assert_int_gt(compared, 0);
  pe_tensor_release(&t);
  /* And a model initialised this way trains like the sequential one. */
  eq_data d;
  eq_data_init(&d, &spec);
  for (int step = 1; step <= 3; step++) {
    int n = eq_data_batch(&d, step);
    float ls = eq_seq_step(&s, &spec, &d, n), lp = eq_par_step(&e, &spec, &d, n, set->sync);
    ck_assert_msg(fabs((double)lp - ls) <= eq_loss_tol(set) * fmax(1.0, fabs((double)ls)),
                  "%s on %s after parallel startup, step %d: loss %f, sequential %f", spec.name,
                  set->name, step, lp, ls);
  }
  eq_data_free(&d);
  eq_par_free(&e);
  eq_seq_free(&s);
  pe_program_free(p);
  pe_model_spec_release(&spec);
}

/* A batch of 3 on n_places (4: one place gets no sample) gives the same
 * update as the sequential executor on one place, for both strategies. */
static inline void eq_uneven_check(const char *model, const eq_setting *set) {
  pe_model_spec spec;
  pe_program *p = eq_program(model, &spec);
  eq_data d;
  eq_data_init(&d, &spec);
  eq_seq s;
  eq_seq_new(p, &s);
  eq_par e;
  eq_par_new(p, set, EQ_BUCKET_BYTES, &e);
  eq_par_load(&e, &s);
  char what[128];
  snprintf(what, sizeof what, "%s on %s, batch 3", spec.name, set->name);
  eq_data_batch(&d, 0);
  for (int step = 1; step <= 2; step++) { /* two steps: momentum carries the first */
    float ls = eq_seq_step(&s, &spec, &d, 3), lp = eq_par_step(&e, &spec, &d, 3, set->sync);
    ck_assert_msg(fabs((double)lp - ls) <= eq_loss_tol(set) * fmax(1.0, fabs((double)ls)),
                  "%s, step %d: loss %f, sequential %f", what, step, lp, ls);
    eq_check_params(&e, &s, what, step, eq_param_tol(set));
  }
  eq_par_free(&e);
  eq_seq_free(&s);
  eq_data_free(&d);
  pe_program_free(p);
  pe_model_spec_release(&spec);
}

#endif
