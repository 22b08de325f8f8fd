/* Helpers shared by the parallel executor tests (test_par_exec*.c): a
 * small MLP program, its sequential reference, and the parallel model +
 * executors compiled from the same program. Header-only; each suite is its
 * own executable. */
#ifndef PE_TESTS_PAR_TEST_UTIL_H
#define PE_TESTS_PAR_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder_util.h"
#include "compiler/pass.h"
#include "engine/parallel/executor.h"
#include "engine/seq_executor.h"
#include "pe_builder.h"
#include "test_assert.h"

enum { DIM = 8, CLASSES = 3, MAXB = 16 };

#define RTOL 1e-4

static inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Deterministic batch for step s: n rows. */
static inline void make_batch(int s, int n, float *x, int64_t *y) {
  for (int i = 0; i < n * DIM; i++)
    x[i] = (float)((double)(mix((uint64_t)(s * 7919 + i + 1)) >> 11) / 9007199254740992.0 - 0.5);
  for (int i = 0; i < n; i++) y[i] = (int64_t)(mix((uint64_t)(s * 104729 + i + 3)) % CLASSES);
}

/* MLP: fc(relu) -> fc -> softmax xent -> mean; momentum. */
/* When set, the MLP gets a dropout (p = 0.5, program generator) after its
 * hidden layer: a random op, ordered by the model's PRNG variable. */
static bool mlp_with_dropout;
/* When set, the MLP's momentum follows a step schedule (0.1, halved every
 * 2 steps): the lr_schedule op and its persistable step counter. */
static bool mlp_with_schedule;
/* When set, the MLP's gradients are clipped to a global norm of 0.05 (far
 * below theirs: every step clips). */
static bool mlp_with_clip;
/* When set, the hidden layer's relu comes after a batch norm ("bn": its
 * running statistics bn.mean / bn.variance are persistable state). */
static bool mlp_with_batch_norm;

static inline pe_program *mlp_program(void) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, DIM));
  const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
  pe_b_fc_opts hidden = {.act = PE_B_ACT_RELU};
  const char *h = pe_builder_fc(b, x, 16, mlp_with_batch_norm ? NULL : &hidden);
  pe_b_bn_opts bn = {.name = "bn", .act = PE_B_ACT_RELU};
  if (mlp_with_batch_norm) h = pe_builder_batch_norm(b, h, &bn);
  if (mlp_with_dropout) h = pe_builder_dropout(b, h, 0.5f, 0, NULL);
  const char *logits = pe_builder_fc(b, h, CLASSES, NULL);
  const char *loss = pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, y, NULL));
  ck_assert_str_eq(loss, "mean_0.out");
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  ck_assert_int_eq(pe_builder_momentum(b, 0.1f, 0.9f, false), 0);
  pe_lr_schedule_opts step = {.type = "step", .decay_steps = 2, .gamma = 0.5f};
  if (mlp_with_schedule) ck_assert_int_eq(pe_builder_lr_schedule(b, &step), 0);
  if (mlp_with_clip) ck_assert_int_eq(pe_builder_grad_clip_norm(b, 0.05f), 0);
  return tb_finish(b);
}

static const char *LOSS = "mean_0.out";

/* --- the sequential reference ------------------------------------------------------ */

typedef struct seqref {
  pe_program *prog;
  pe_scope *scope;
  pe_seq_exec *step;
} seqref;

static inline void seq_new(seqref *s, uint64_t seed) {
  s->prog = mlp_program();
  PE_CK_OK(pe_program_compile(s->prog, false));
  s->scope = pe_scope_new(NULL);
  pe_exec_opts eo = {.seed = seed, .threads = 1};
  pe_seq_exec *init;
  PE_CK_OK(pe_seq_exec_new(s->prog, s->prog->startup_block, s->scope, &eo, &init));
  PE_CK_OK(pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL));
  pe_seq_exec_free(init);
  PE_CK_OK(pe_seq_exec_new(s->prog, s->prog->main_block, s->scope, &eo, &s->step));
}

static inline float seq_step(seqref *s, int step, int n) {
  float x[MAXB * DIM];
  int64_t y[MAXB];
  make_batch(step, n, x, y);
  pe_tensor xt, yt;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_shape xs = PE_SHAPE(n, DIM), ys = PE_SHAPE(n, 1);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_tensor_view(&yt, PE_I64, &ys, y);
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  const pe_tensor *out;
  PE_CK_OK(pe_seq_exec_run(s->step, feeds, 2, &LOSS, 1, &out));
  return pe_f32(out)[0];
}

static inline void seq_free(seqref *s) {
  pe_seq_exec_free(s->step);
  pe_scope_free(s->scope);
  pe_program_free(s->prog);
}

/* --- the parallel side --------------------------------------------------------------- */

typedef struct par {
  pe_program *prog;
  pe_model *m;
  pe_par_exec *step, *init;
} par;

/* The MLP compiled with o, on a model of o's places. */
static inline void par_new_opts(par *q, pe_runtime *rt, const pe_pass_opts *o, uint64_t seed) {
  q->prog = mlp_program();
  pe_ir ir = {q->prog, NULL, NULL, o};
  PE_CK_OK(pe_graph_compile(&ir, false));
  PE_CK_OK(pe_model_new(rt, o->place_kind, o->n_places, seed, &q->m));
  pe_graph *g = ir.graph, *s = ir.startup;
  ir.graph = ir.startup = NULL;
  PE_CK_OK(pe_par_exec_new(q->m, g, &q->step));
  PE_CK_OK(pe_par_exec_new(q->m, s, &q->init));
}

static inline void par_new(par *q, pe_runtime *rt, pe_place_kind kind, int n,
                           pe_graph_strategy strategy, bool fuse, uint64_t seed) {
  pe_pass_opts o = {.place_kind = kind,
                    .n_places = n,
                    .strategy = strategy,
                    .fuse = fuse,
                    .fuse_bucket_bytes = 256};
  par_new_opts(q, rt, &o, seed);
}

static inline void par_free(par *q) {
  pe_par_exec_free(q->step);
  pe_par_exec_free(q->init);
  pe_model_free(q->m);
  pe_program_free(q->prog);
}

/* Copy every persistable of the sequential scope into the model. */
static inline void copy_params(seqref *s, par *q) {
  for (int i = 0; i < s->scope->n; i++) {
    pe_var *v = s->scope->order[i];
    if (v->persistable && (v->t.data || v->t.shape.ndim))
      PE_CK_OK(pe_model_set(q->m, v->name, &v->t));
  }
}

static inline float par_step(par *q, int step, int n, const pe_run_opts *ro) {
  float x[MAXB * DIM];
  int64_t y[MAXB];
  make_batch(step, n, x, y);
  pe_tensor xt, yt, out;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_init(&out);
  pe_shape xs = PE_SHAPE(n, DIM), ys = PE_SHAPE(n, 1);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_tensor_view(&yt, PE_I64, &ys, y);
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  pe_run_stats st;
  PE_CK_OK(pe_par_exec_run(q->step, feeds, 2, &LOSS, 1, &out, ro, &st));
  ck_assert_int_eq(st.batch, n);
  ck_assert_int_eq(out.shape.ndim >= 0, 1);
  float l = pe_f32(&out)[0];
  pe_tensor_release(&out);
  return l;
}

#include "engine/parallel/internal.h" /* white box: the places' scopes */

/* Under Reduce only parameters are replicated (optimizer state lives on
 * the owner); under AllReduce every persistable is. */
static inline bool replicated(par *q, const char *name) {
  const pe_graph *g = pe_par_exec_graph(q->step);
  if (g->strategy == PE_STRATEGY_ALLREDUCE) return true;
  for (int i = 0; i < g->n_params; i++)
    if (!strcmp(g->params[i], name)) return true;
  return false;
}

/* Max relative difference of every seq persistable (f32) against the
 * model's value (pe_model_get: the home place's). */
static inline double param_diff(seqref *s, par *q) {
  double worst = 0;
  for (int i = 0; i < s->scope->n; i++) {
    pe_var *v = s->scope->order[i];
    /* Every persistable, optimizer state included: the model's value is its
     * home's (Reduce: the owner's), whatever the strategy. */
    if (!v->persistable || v->t.dtype != PE_F32 || !v->t.data) continue;
    pe_tensor t;
    pe_tensor_init(&t);
    PE_CK_OK(pe_model_get(q->m, v->name, &t));
    char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
    ck_assert_msg(pe_shape_equal(&t.shape, &v->t.shape), "'%s': model has %s, seq %s", v->name,
                  pe_shape_str(&t.shape, s1, sizeof s1), pe_shape_str(&v->t.shape, s2, sizeof s2));
    for (int64_t k = 0; k < pe_tensor_numel(&t); k++) {
      double a = pe_f32(&t)[k], b = pe_f32(&v->t)[k];
      double d = fabs(a - b) / (fabs(b) > 1e-3 ? fabs(b) : 1e-3);
      if (d > worst) worst = d;
    }
    pe_tensor_release(&t);
  }
  return worst;
}

static inline void assert_places_identical(par *q) {
  pe_model *m = q->m;
  /* The replicas are read directly: wait for the runs' device work first
   * (on async places the last run returned before its updates ran). */
  PE_CK_OK(pe_par_exec_sync(q->init));
  PE_CK_OK(pe_par_exec_sync(q->step));
  for (int i = 0; i < m->n_ent; i++) {
    if (!replicated(q, m->ent[i]->name)) continue;
    const pe_tensor *t0 = &m->ent[i]->v[0]->t;
    for (int p = 1; p < m->n_places; p++) {
      const pe_tensor *t = &m->ent[i]->v[p]->t;
      ck_assert_msg(pe_shape_equal(&t->shape, &t0->shape), "'%s' shape differs on place %d",
                    m->ent[i]->name, p);
      ck_assert_msg(pe_tensor_bytes(t0) == 0 || memcmp(t->data, t0->data, pe_tensor_bytes(t0)) == 0,
                    "'%s' differs between place 0 and place %d", m->ent[i]->name, p);
    }
  }
}

static inline pe_runtime *rt_new(int threads) {
  pe_runtime_opts o = {.threads = threads, .cores = 2};
  pe_runtime *rt;
  PE_CK_OK(pe_runtime_new(&o, &rt));
  return rt;
}

#endif
