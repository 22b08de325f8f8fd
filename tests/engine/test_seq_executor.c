/* The sequential executor: values, feed errors, op error propagation, buffer
 * reuse across runs, the program generator, and startup + optimizer passes
 * end to end (linear regression converges with sgd, momentum and adam). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/prog_util.h"
#include "check_main.h"
#include "compiler/pass.h"
#include "compiler/validate.h"
#include "core/rng.h"
#include "engine/seq_executor.h"
#include "pe_models.h"

static pe_tensor make_f32(pe_shape shape, const float *v) {
  pe_tensor t;
  pe_tensor_init(&t);
  PU_OK(pe_tensor_resize(&t, PE_F32, &shape, "t"));
  if (v) memcpy(t.data, v, pe_tensor_bytes(&t));
  return t;
}

/* y = relu(x W): x feed [-1,3], W parameter [3,2]. */
static pe_program *small_program(void) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 3));
  pu_param(m, "w", PE_SHAPE(3, 2));
  pu_var(m, "h", PE_F32, NULL);
  pu_var(m, "y", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pu_op(m, "relu", "X", "h", NULL, "Out", "y", NULL);
  PU_OK(pe_program_validate(p));
  return p;
}

static const float W[6] = {1, -1, 2, 0.5f, -3, 1};

static void set_w(pe_scope *model) {
  pe_var *v;
  PU_OK(pe_scope_var(model, "w", &v));
  pe_shape s = PE_SHAPE(3, 2);
  PU_OK(pe_tensor_resize(&v->t, PE_F32, &s, "w"));
  memcpy(v->t.data, W, sizeof W);
}

START_TEST(runs_small_program) {
  pe_program *p = small_program();
  pe_scope *model = pe_scope_new(NULL);
  set_w(model);
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  const float xv[6] = {1, 2, 3, -1, 0, 2};
  pe_tensor x = make_f32(PE_SHAPE(2, 3), xv);
  pe_feed feed = {"x", &x};
  const char *fetch[] = {"y", "w"};
  const pe_tensor *out[2];
  PU_OK(pe_seq_exec_run(e, &feed, 1, fetch, 2, out));
  pe_shape want = PE_SHAPE(2, 2);
  ck_assert(pe_shape_equal(&out[0]->shape, &want));
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 2; c++) {
      float acc = 0;
      for (int k = 0; k < 3; k++) acc += xv[r * 3 + k] * W[k * 2 + c];
      ck_assert_float_eq_tol(pe_f32(out[0])[r * 2 + c], acc > 0 ? acc : 0, 1e-5f);
    }
  /* Persistables live in the model scope, temporaries do not. */
  ck_assert_ptr_eq(out[1], &pe_scope_find(model, "w")->t);
  ck_assert(pe_scope_find(model, "w")->persistable);
  ck_assert_ptr_null(pe_scope_find(model, "h"));
  ck_assert_ptr_null(pe_scope_find(model, "x"));
  /* Unknown fetch. */
  const char *bad = "nope";
  pu_expect(pe_seq_exec_run(e, &feed, 1, &bad, 1, out), PE_EUNKNOWN_VAR, "'nope'", NULL);
  pe_seq_exec_free(e);
  pe_tensor_release(&x);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

START_TEST(feed_errors) {
  pe_program *p = small_program();
  pe_scope *model = pe_scope_new(NULL);
  set_w(model);
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  const char *fetch = "y";
  const pe_tensor *out;
  pu_expect(pe_seq_exec_run(e, NULL, 0, &fetch, 1, &out), PE_EMISSING_FEED, "'x'", "[-1,3]", NULL);

  pe_tensor xi;
  pe_tensor_init(&xi);
  pe_shape s23 = PE_SHAPE(2, 3);
  PU_OK(pe_tensor_resize(&xi, PE_I64, &s23, "xi"));
  memset(xi.data, 0, pe_tensor_bytes(&xi));
  pe_feed f = {"x", &xi};
  pu_expect(pe_seq_exec_run(e, &f, 1, &fetch, 1, &out), PE_EDTYPE, "'x'", "i64", "f32", NULL);

  pe_tensor x4 = make_f32(PE_SHAPE(2, 4), NULL);
  f.t = &x4;
  pu_expect(pe_seq_exec_run(e, &f, 1, &fetch, 1, &out), PE_ESHAPE, "'x'", "[2,4]", "[-1,3]", NULL);
  pe_tensor x1 = make_f32(PE_SHAPE(3), NULL);
  f.t = &x1;
  pu_expect(pe_seq_exec_run(e, &f, 1, &fetch, 1, &out), PE_ESHAPE, "'x'", "[3]", NULL);

  pe_tensor ok = make_f32(PE_SHAPE(2, 3), NULL);
  memset(ok.data, 0, pe_tensor_bytes(&ok));
  pe_feed two[] = {{"x", &ok}, {"h", &ok}};
  pu_expect(pe_seq_exec_run(e, two, 2, &fetch, 1, &out), PE_EUNKNOWN_VAR, "'h'", NULL);
  PU_OK(pe_seq_exec_run(e, two, 1, &fetch, 1, &out));
  pe_seq_exec_free(e);
  pe_tensor_release(&xi);
  pe_tensor_release(&x4);
  pe_tensor_release(&x1);
  pe_tensor_release(&ok);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

/* A fetch of an intermediate that op fusion removed names the op that
 * absorbed it and how to keep it, as the parallel executor's does (before:
 * "fetch 'h' is not a variable of block 0"). */
START_TEST(fetch_of_a_fused_intermediate_says_how_to_keep_it) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 3));
  pu_param(m, "w", PE_SHAPE(3, 2));
  pu_param(m, "b", PE_SHAPE(2));
  pu_var(m, "h", PE_F32, NULL);
  pu_var(m, "hb", PE_F32, NULL);
  pu_var(m, "y", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pu_op(m, "elementwise_add", "X", "h", "Y", "b", NULL, "Out", "hb", NULL);
  pu_op(m, "relu", "X", "hb", NULL, "Out", "y", NULL);
  pe_pass_opts o = {.fuse_conv_act = true};
  PU_OK(pe_passes_run(&(pe_ir){.prog = p, .opts = &o}, "validate,fuse_conv_act,validate"));
  ck_assert_int_eq(m->n_ops, 1);
  pe_scope *model = pe_scope_new(NULL);
  set_w(model);
  pe_var *bv;
  PU_OK(pe_scope_var(model, "b", &bv));
  pe_shape s2 = PE_SHAPE(2);
  PU_OK(pe_tensor_resize(&bv->t, PE_F32, &s2, "b"));
  memset(bv->t.data, 0, pe_tensor_bytes(&bv->t));
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  pe_tensor x = make_f32(PE_SHAPE(1, 3), (const float[]){1, 2, 3});
  pe_feed feed = {"x", &x};
  const pe_tensor *out;
  for (int i = 0; i < 2; i++) {
    const char *fetch = i ? "hb" : "h";
    pu_expect(pe_seq_exec_run(e, &feed, 1, &fetch, 1, &out), PE_EUNKNOWN_VAR, "fetch", fetch,
              "fused into op matmul writing 'y'", "by op fusion", "keep=[", "--keep", fetch,
              "--no-op-fusion", NULL);
  }
  const char *y = "y";
  PU_OK(pe_seq_exec_run(e, &feed, 1, &y, 1, &out));
  pe_seq_exec_free(e);
  pe_tensor_release(&x);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

START_TEST(op_error_propagates_with_op_index) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 3));
  pu_feed(m, "label", PE_I64, PE_SHAPE(-1, 1));
  pu_var(m, "r", PE_F32, NULL);
  pu_var(m, "prob", PE_F32, NULL);
  pu_var(m, "ce", PE_F32, NULL);
  pu_op(m, "relu", "X", "x", NULL, "Out", "r", NULL);
  pu_op(m, "softmax_with_cross_entropy", "Logits", "r", "Label", "label", NULL, "Softmax", "prob",
        "Loss", "ce", NULL);
  PU_OK(pe_program_validate(p));
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, NULL, NULL, &e)); /* private model scope */
  pe_tensor x = make_f32(PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  pe_tensor l;
  pe_tensor_init(&l);
  pe_shape ls = PE_SHAPE(2, 1);
  PU_OK(pe_tensor_resize(&l, PE_I64, &ls, "label"));
  pe_i64(&l)[0] = 1;
  pe_i64(&l)[1] = 7; /* out of [0, 3) */
  pe_feed feeds[] = {{"x", &x}, {"label", &l}};
  const char *fetch = "ce";
  const pe_tensor *out;
  pe_status *st = pe_seq_exec_run(e, feeds, 2, &fetch, 1, &out);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(pe_status_msg(st), "block 0"));
  ck_assert_ptr_nonnull(strstr(pe_status_msg(st), "op #1 (softmax_with_cross_entropy)"));
  /* The op index appears once, not twice. */
  const char *first = strstr(pe_status_msg(st), "op #1");
  ck_assert_ptr_null(strstr(first + 1, "op #1"));
  pe_status_free(st);
  pe_i64(&l)[1] = 2;
  PU_OK(pe_seq_exec_run(e, feeds, 2, &fetch, 1, &out));
  ck_assert(isfinite(pe_f32(out)[0]) && pe_f32(out)[0] > 0);
  pe_seq_exec_free(e);
  pe_tensor_release(&x);
  pe_tensor_release(&l);
  pe_program_free(p);
}
END_TEST

START_TEST(uninitialised_parameter) {
  pe_program *p = small_program();
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, NULL, NULL, &e)); /* w never set */
  pe_tensor x = make_f32(PE_SHAPE(1, 3), (float[]){1, 2, 3});
  pe_feed feed = {"x", &x};
  pu_expect(pe_seq_exec_run(e, &feed, 1, NULL, 0, NULL), PE_EUSE_BEFORE_DEF, "op #0 (matmul)",
            "'w'", NULL);
  pe_seq_exec_free(e);
  pe_tensor_release(&x);
  pe_program_free(p);
}
END_TEST

START_TEST(running_twice_reuses_buffers) {
  pe_program *p = small_program();
  pe_scope *model = pe_scope_new(NULL);
  set_w(model);
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  pe_tensor x = make_f32(PE_SHAPE(4, 3), (float[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3});
  pe_feed feed = {"x", &x};
  const char *fetch[] = {"y", "h"};
  const pe_tensor *out[2];
  PU_OK(pe_seq_exec_run(e, &feed, 1, fetch, 2, out));
  const pe_tensor *y1 = out[0];
  void *yd = out[0]->data, *hd = out[1]->data;
  float first[8];
  memcpy(first, yd, sizeof first);
  PU_OK(pe_seq_exec_run(e, &feed, 1, fetch, 2, out));
  ck_assert_ptr_eq(out[0], y1);
  ck_assert_ptr_eq(out[0]->data, yd);
  ck_assert_ptr_eq(out[1]->data, hd);
  ck_assert(memcmp(first, yd, sizeof first) == 0);
  /* A smaller batch fits in the same buffers. */
  x.shape = PE_SHAPE(2, 3);
  PU_OK(pe_seq_exec_run(e, &feed, 1, fetch, 2, out));
  ck_assert_int_eq(out[0]->shape.d[0], 2);
  ck_assert_ptr_eq(out[0]->data, yd);
  ck_assert(memcmp(first, yd, 4 * sizeof(float)) == 0);
  pe_seq_exec_free(e);
  pe_tensor_release(&x);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

/* Startup with uniform_random (seed 0: the program generator). */
static pe_program *random_init_program(void) {
  pe_program *p = pe_program_new();
  pe_block *m, *s;
  PU_OK(pe_program_add_block(p, -1, &m));
  PU_OK(pe_program_add_block(p, -1, &s));
  p->startup_block = 1;
  pu_param(m, "w", PE_SHAPE(4, 4));
  pe_op_desc *u = pu_op(s, "uniform_random", NULL, "Out", "w", NULL);
  PU_OK(pe_op_set_ints(u, "shape", 2, (int64_t[]){4, 4}));
  PU_OK(pe_program_validate(p));
  return p;
}

static void init_with_seed(const pe_program *p, uint64_t seed, float out[16]) {
  pe_scope *model = pe_scope_new(NULL);
  pe_seq_exec *e;
  pe_exec_opts o = {seed, 1};
  PU_OK(pe_seq_exec_new(p, p->startup_block, model, &o, &e));
  PU_OK(pe_seq_exec_run(e, NULL, 0, NULL, 0, NULL));
  pe_var *w = pe_scope_find(model, "w");
  ck_assert_ptr_nonnull(w);
  ck_assert(w->persistable);
  memcpy(out, w->t.data, 16 * sizeof(float));
  pe_seq_exec_free(e);
  pe_scope_free(model);
}

START_TEST(program_generator_is_seeded) {
  pe_program *p = random_init_program();
  float a[16], b[16], c[16];
  init_with_seed(p, 42, a);
  init_with_seed(p, 42, b);
  init_with_seed(p, 43, c);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  ck_assert(memcmp(a, c, sizeof a) != 0);
  for (int i = 0; i < 16; i++) ck_assert(a[i] >= -1.0f && a[i] < 1.0f);
  pe_program_free(p);
}
END_TEST

/* --- linear regression with the optimizer pass ------------------------------------ */

static const float TRUE_W[3] = {1.0f, -2.0f, 0.5f}, TRUE_B = 0.3f;
#define N_SAMPLES 32

/* loss = mean((x w + b - y)^2); w, b initialised by the startup block. */
static pe_program *regression_program(const char *opt, float lr) {
  pe_program *p = pe_program_new();
  pe_block *m, *s;
  PU_OK(pe_program_add_block(p, -1, &m));
  PU_OK(pe_program_add_block(p, -1, &s));
  p->startup_block = 1;
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 3));
  pu_feed(m, "y", PE_F32, PE_SHAPE(-1, 1));
  pu_param(m, "w", PE_SHAPE(3, 1));
  pu_param(m, "b", PE_SHAPE(1));
  const char *tmps[] = {"xw", "pred", "diff", "sq", "loss"};
  for (int i = 0; i < 5; i++) pu_var(m, tmps[i], PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "xw", NULL);
  pu_op(m, "elementwise_add", "X", "xw", "Y", "b", NULL, "Out", "pred", NULL);
  pu_op(m, "elementwise_sub", "X", "pred", "Y", "y", NULL, "Out", "diff", NULL);
  pu_op(m, "elementwise_mul", "X", "diff", "Y", "diff", NULL, "Out", "sq", NULL);
  pu_op(m, "mean", "X", "sq", NULL, "Out", "loss", NULL);
  pe_op_desc *u = pu_op(s, "uniform_random", NULL, "Out", "w", NULL);
  PU_OK(pe_op_set_ints(u, "shape", 2, (int64_t[]){3, 1}));
  pe_op_desc *f = pu_op(s, "fill_constant", NULL, "Out", "b", NULL);
  PU_OK(pe_op_set_ints(f, "shape", 1, (int64_t[]){1}));
  p->loss = strdup("loss");
  p->opt.type = strdup(opt);
  p->opt.lr = lr;
  return p;
}

/* A compiled regression program initialised (seed 7), with its fixed data
 * as feeds. */
typedef struct reg_run {
  pe_scope *model;
  pe_seq_exec *init, *step;
  pe_tensor x, y;
  pe_feed feeds[2];
} reg_run;

static void reg_open(pe_program *p, reg_run *r) {
  r->model = pe_scope_new(NULL);
  pe_exec_opts o = {7, 1};
  PU_OK(pe_seq_exec_new(p, p->startup_block, r->model, &o, &r->init));
  PU_OK(pe_seq_exec_run(r->init, NULL, 0, NULL, 0, NULL));
  PU_OK(pe_seq_exec_new(p, p->main_block, r->model, &o, &r->step));
  float xv[N_SAMPLES * 3], yv[N_SAMPLES];
  for (int i = 0; i < N_SAMPLES; i++) {
    yv[i] = TRUE_B;
    for (int k = 0; k < 3; k++) {
      xv[i * 3 + k] = (float)pe_rng_uniform(99, (uint64_t)(i * 3 + k)) * 2 - 1;
      yv[i] += xv[i * 3 + k] * TRUE_W[k];
    }
  }
  r->x = make_f32(PE_SHAPE(N_SAMPLES, 3), xv);
  r->y = make_f32(PE_SHAPE(N_SAMPLES, 1), yv);
  r->feeds[0] = (pe_feed){"x", &r->x};
  r->feeds[1] = (pe_feed){"y", &r->y};
}

static void reg_close(reg_run *r) {
  pe_seq_exec_free(r->step);
  pe_seq_exec_free(r->init);
  pe_tensor_release(&r->x);
  pe_tensor_release(&r->y);
  pe_scope_free(r->model);
}

/* Train for `steps` on fixed data; returns the final loss. With set_lr, the
 * model's learning_rate is set to set_lr[s] before step s; with lr_seen,
 * lr_seen[s] is learning_rate after step s. */
static float train_lr(pe_program *p, int steps, const float *set_lr, float *lr_seen, float *w_out,
                      float *b_out, float *first_loss) {
  PU_OK(pe_program_compile(p, false));
  reg_run r;
  reg_open(p, &r);
  pe_scope *model = r.model;
  pe_seq_exec *step = r.step;
  pe_feed *feeds = r.feeds;
  const char *fetch = "loss";
  const pe_tensor *out;
  float loss = 0;
  for (int s = 0; s < steps; s++) {
    if (set_lr) pe_f32(&pe_scope_find(model, "learning_rate")->t)[0] = set_lr[s];
    PU_OK(pe_seq_exec_run(step, feeds, 2, &fetch, 1, &out));
    loss = pe_f32(out)[0];
    if (s == 0) *first_loss = loss;
    if (lr_seen) lr_seen[s] = pe_f32(&pe_scope_find(model, "learning_rate")->t)[0];
  }
  memcpy(w_out, pe_scope_find(model, "w")->t.data, 3 * sizeof(float));
  *b_out = pe_f32(&pe_scope_find(model, "b")->t)[0];
  reg_close(&r);
  return loss;
}

static float train(pe_program *p, int steps, float *w_out, float *b_out, float *first_loss) {
  return train_lr(p, steps, NULL, NULL, w_out, b_out, first_loss);
}

static void expect_converges(const char *opt, float lr, int steps) {
  pe_program *p = regression_program(opt, lr);
  float w[3], b, first;
  float loss = train(p, steps, w, &b, &first);
  ck_assert_msg(loss < 1e-4f && loss < first * 1e-3f, "%s: loss %g (first %g)", opt, loss, first);
  for (int k = 0; k < 3; k++)
    ck_assert_msg(fabsf(w[k] - TRUE_W[k]) < 1e-2f, "%s: w[%d] = %g", opt, k, w[k]);
  ck_assert_msg(fabsf(b - TRUE_B) < 1e-2f, "%s: b = %g", opt, b);
  pe_program_free(p);
}

START_TEST(sgd_converges) {
  expect_converges("sgd", 0.3f, 400);
}
END_TEST

START_TEST(momentum_converges) {
  expect_converges("momentum", 0.05f, 300);
}
END_TEST

START_TEST(adam_converges) {
  expect_converges("adam", 0.05f, 600);
}
END_TEST

/* Weight decay: the program's optimizer weight_decay L makes the optimizer
 * pass's updates minimise loss + L/2 |theta|^2 (theta = w and b), so
 * training converges to the ridge solution of the same data,
 * (2/N A^T A + L I) theta = 2/N A^T y with A = [x, 1], solved here in double;
 * with L = 0.5 it lies far from the unregularised TRUE_W / TRUE_B. With b
 * marked no_weight_decay only w is decayed: the last diagonal entry gets no
 * L (the usual "no decay on biases"). */
static void ridge_solution(float lambda, bool decay_b, double theta[4]) {
  double m[4][5] = {{0}};
  for (int i = 0; i < N_SAMPLES; i++) {
    double a[4] = {0, 0, 0, 1}, y = TRUE_B;
    for (int k = 0; k < 3; k++) {
      a[k] = (float)pe_rng_uniform(99, (uint64_t)(i * 3 + k)) * 2 - 1; /* train()'s x */
      y += a[k] * TRUE_W[k];
    }
    for (int r = 0; r < 4; r++) {
      for (int c = 0; c < 4; c++) m[r][c] += 2.0 / N_SAMPLES * a[r] * a[c];
      m[r][4] += 2.0 / N_SAMPLES * a[r] * y;
    }
  }
  for (int r = 0; r < 4; r++) m[r][r] += r < 3 || decay_b ? lambda : 0.0;
  for (int c = 0; c < 4; c++) /* Gauss-Jordan: the matrix is symmetric positive definite */
    for (int r = 0; r < 4; r++) {
      if (r == c) continue;
      double f = m[r][c] / m[c][c];
      for (int k = c; k < 5; k++) m[r][k] -= f * m[c][k];
    }
  for (int r = 0; r < 4; r++) theta[r] = m[r][4] / m[r][r];
}

static void expect_ridge(const char *opt, float lr, int steps, float tol, bool decay_b) {
  const float lambda = 0.5f;
  pe_program *p = regression_program(opt, lr);
  p->opt.weight_decay = lambda;
  pe_block_find_var_local(pe_program_main(p), "b")->no_weight_decay = !decay_b;
  float w[3], b, first;
  train(p, steps, w, &b, &first);
  double theta[4], all[4];
  ridge_solution(lambda, decay_b, theta);
  ridge_solution(lambda, true, all);
  for (int k = 0; k < 4; k++) {
    float got = k < 3 ? w[k] : b, truth = k < 3 ? TRUE_W[k] : TRUE_B;
    ck_assert_msg(fabs(got - theta[k]) < tol, "%s: theta[%d] = %.6f, ridge %.6f", opt, k, got,
                  theta[k]);
    ck_assert_msg(fabs(theta[k] - truth) > 0.05, "ridge theta[%d] %.6f too close to %.6f", k,
                  theta[k], truth);
  }
  /* The two ridge problems' b differ enough to tell which one was solved. */
  ck_assert_msg(decay_b || fabs(theta[3] - all[3]) > 3 * tol, "b: %.6f vs %.6f", theta[3], all[3]);
  pe_program_free(p);
}

START_TEST(weight_decay_converges_to_ridge) {
  expect_ridge("sgd", 0.3f, 400, 1e-4f, true);
  expect_ridge("momentum", 0.05f, 300, 1e-4f, true);
  expect_ridge("adam", 0.05f, 600, 1e-2f, true);
}
END_TEST

/* b marked no_weight_decay: training solves the ridge problem that
 * penalises w only. */
START_TEST(no_weight_decay_excludes_the_bias) {
  expect_ridge("sgd", 0.3f, 400, 1e-4f, false);
  expect_ridge("momentum", 0.05f, 300, 1e-4f, false);
  expect_ridge("adam", 0.05f, 600, 1e-2f, false);
}
END_TEST

/* adamw: the adam op with decoupled decay (weight_decay 0: 0.01); a
 * parameter marked no_weight_decay gets plain adam. With every parameter
 * excluded it trains bit for bit like adam; with decay, like adam whose
 * parameters shrink by 1 - lr c before each step, so the weights end
 * nearer 0 than adam's while the loss still falls. */
START_TEST(adamw_decoupled_decay) {
  pe_program *p = regression_program("adamw", 0.05f);
  pe_block_find_var_local(pe_program_main(p), "b")->no_weight_decay = true;
  PU_OK(pe_program_compile(p, false));
  pe_block *m = pe_program_main(p);
  int a = pu_find_op(m, "adam", 0);
  ck_assert_int_ge(a, 0);
  ck_assert_str_eq(pe_op_input_arg(m->ops[a], "Param"), "w");
  const pe_attr *rm = pe_op_find_attr(m->ops[a], "regularization_method");
  const pe_attr *rc = pe_op_find_attr(m->ops[a], "regularization_coeff");
  ck_assert(rm && rc && !strcmp(rm->s, "decoupled_decay") && rc->f == 0.01f);
  int ab = pu_find_op(m, "adam", a + 1);
  ck_assert_str_eq(pe_op_input_arg(m->ops[ab], "Param"), "b");
  ck_assert_ptr_null(pe_op_find_attr(m->ops[ab], "regularization_method"));
  ck_assert_ptr_nonnull(pe_block_find_var_local(m, "w@MOMENT1")); /* adam's state */
  pe_program_free(p);

  float w_adam[3], b_adam, w_off[3], b_off, w_dec[3], b_dec, first, first_dec;
  p = regression_program("adam", 0.05f);
  float loss_adam = train(p, 300, w_adam, &b_adam, &first);
  pe_program_free(p);
  p = regression_program("adamw", 0.05f);
  p->opt.weight_decay = 0.5f;
  pe_block_find_var_local(pe_program_main(p), "w")->no_weight_decay = true;
  pe_block_find_var_local(pe_program_main(p), "b")->no_weight_decay = true;
  float loss_off = train(p, 300, w_off, &b_off, &first);
  pe_program_free(p);
  ck_assert(loss_off == loss_adam && b_off == b_adam && !memcmp(w_off, w_adam, sizeof w_adam));
  p = regression_program("adamw", 0.05f);
  p->opt.weight_decay = 0.5f;
  float loss_dec = train(p, 300, w_dec, &b_dec, &first_dec);
  pe_program_free(p);
  double n_adam = 0, n_dec = 0;
  for (int k = 0; k < 3; k++) {
    n_adam += w_adam[k] * w_adam[k];
    n_dec += w_dec[k] * w_dec[k];
  }
  ck_assert_msg(n_dec < 0.9 * n_adam, "|w|^2 adamw %g, adam %g", n_dec, n_adam);
  ck_assert_msg(loss_dec < first_dec * 0.5f && loss_dec > loss_adam, "loss %g (first %g, adam %g)",
                loss_dec, first_dec, loss_adam);
}
END_TEST

START_TEST(optimizer_pass_structure) {
  pe_program *p = regression_program("adam", 0.01f);
  free(p->opt.type);
  p->opt.type = strdup("adagrad");
  pu_expect(pe_passes_run(&(pe_ir){.prog = p}, "validate,backward,optimizer"), PE_EINVAL, "adagrad",
            NULL);
  pe_program_free(p);

  /* No startup block: the pass creates one. */
  p = regression_program("adam", 0.01f);
  p->startup_block = -1; /* block 1 becomes an unused root block */
  while (p->blocks[1]->n_ops) pe_block_remove_op(p->blocks[1], 0);
  PU_OK(pe_program_compile(p, false));
  ck_assert_int_eq(p->startup_block, 2);
  pe_block *m = pe_program_main(p), *s = pe_program_startup(p);
  const char *state[] = {"learning_rate", "w@MOMENT1",  "w@MOMENT2",
                         "w@BETA1POW",    "w@BETA2POW", "b@MOMENT1"};
  for (int i = 0; i < 6; i++) {
    pe_var_desc *v = pe_block_find_var_local(m, state[i]);
    ck_assert_msg(v && v->persistable && v->stop_gradient, "%s", state[i]);
    ck_assert_int_eq(pu_writers(s, state[i]), 1);
  }
  pe_shape ws = PE_SHAPE(3, 1);
  ck_assert(pe_shape_equal(&pe_block_find_var_local(m, "w@MOMENT1")->shape, &ws));
  int a = pu_find_op(m, "adam", 0);
  ck_assert_int_ge(a, 0);
  ck_assert_str_eq(pe_op_input_arg(m->ops[a], "Param"), "w");
  ck_assert_str_eq(pe_op_input_arg(m->ops[a], "Grad"), "w@GRAD");
  ck_assert_str_eq(pe_op_output_arg(m->ops[a], "ParamOut"), "w");
  ck_assert_int_ge(pu_find_op(m, "adam", a + 1), 0);       /* b */
  ck_assert_int_lt(pu_find_op(m, "adam", a + 2), 0);       /* only two params */
  const pe_attr *b1 = pe_op_find_attr(m->ops[a], "beta1"); /* 0 in opt: default */
  ck_assert(b1 && fabsf(b1->f - 0.9f) < 1e-7f);
  ck_assert_ptr_null(pe_op_find_attr(m->ops[a], "regularization_method")); /* no weight decay */
  pe_program_free(p);

  /* weight_decay: every update op gets l2_decay and the coefficient; a
   * negative one is refused. */
  p = regression_program("momentum", 0.1f);
  p->opt.weight_decay = 0.25f;
  PU_OK(pe_program_compile(p, false));
  m = pe_program_main(p);
  for (int k = 0, at = -1; k < 2; k++) {
    at = pu_find_op(m, "momentum", at + 1);
    ck_assert_int_ge(at, 0);
    const pe_attr *rm = pe_op_find_attr(m->ops[at], "regularization_method");
    const pe_attr *rc = pe_op_find_attr(m->ops[at], "regularization_coeff");
    ck_assert(rm && rc && !strcmp(rm->s, "l2_decay") && rc->f == 0.25f);
  }
  pe_program_free(p);
  p = regression_program("sgd", 0.1f);
  p->opt.weight_decay = -1.0f;
  pu_expect(pe_passes_run(&(pe_ir){.prog = p}, "validate,backward,optimizer"), PE_EINVAL,
            "optimizer sgd: weight_decay -1 must be finite and >= 0", NULL);
  pe_program_free(p);

  /* Without an optimizer type the pass changes nothing. */
  p = regression_program("sgd", 0.1f);
  free(p->opt.type);
  p->opt.type = NULL;
  PU_OK(pe_passes_run(&(pe_ir){.prog = p}, "validate,backward"));
  int n = pe_program_main(p)->n_ops;
  PU_OK(pe_pass_run(&(pe_ir){.prog = p}, "optimizer"));
  ck_assert_int_eq(pe_program_main(p)->n_ops, n);
  pe_program_free(p);
}
END_TEST

/* A learning-rate schedule: the optimizer pass declares the step counter and
 * puts one lr_schedule op before the updates; training with it is training
 * with learning_rate set by hand to the schedule's rate before every step
 * (bit for bit), so each update uses the rate of its own step. */
/* grad_clip_norm: one clip_by_global_norm after backward over both
 * gradients, the updates reading its outputs. With sgd, each step moves
 * (w, b) by lr * the clipped gradient: a vector of norm lr * max_norm
 * whenever the fetched global norm is above max_norm, never more. A limit
 * far above the gradients trains bit for bit like no clipping. */
START_TEST(clip_grad_norm_bounds_each_step) {
  const float lr = 0.1f, max_norm = 0.05f;
  pe_program *p = regression_program("sgd", lr);
  p->opt.grad_clip_norm = max_norm;
  PU_OK(pe_program_compile(p, false));
  pe_block *m = pe_program_main(p);
  int c = pu_find_op(m, "clip_by_global_norm", 0), u = pu_find_op(m, "sgd", 0);
  ck_assert_int_ge(c, 0);
  ck_assert_int_gt(u, c);
  ck_assert_int_lt(pu_find_op(m, "clip_by_global_norm", c + 1), 0);
  for (int i = 0; i < c; i++) ck_assert_str_ne(m->ops[i]->type, "sgd");
  ck_assert_int_eq(pe_op_find_input(m->ops[c], "X")->n, 2);
  ck_assert_str_eq(pe_op_find_input(m->ops[c], "X")->args[0], "w@GRAD");
  ck_assert_str_eq(pe_op_find_output(m->ops[c], "Out")->args[1], "b@GRAD@CLIP");
  ck_assert_str_eq(pe_op_output_arg(m->ops[c], "GlobalNorm"), "@GRAD_GLOBAL_NORM@");
  ck_assert_str_eq(pe_op_input_arg(m->ops[u], "Grad"), "w@GRAD@CLIP");
  ck_assert(!pe_block_find_var_local(m, "w@GRAD@CLIP")->persistable);

  reg_run r;
  reg_open(p, &r);
  pe_scope *model = r.model;
  const char *fetch[] = {"loss", "@GRAD_GLOBAL_NORM@"};
  const pe_tensor *out[2];
  int clipped = 0;
  float first = 0, loss = 0;
  for (int s = 0; s < 60; s++) {
    float before[4], after[4];
    memcpy(before, pe_scope_find(model, "w")->t.data, 3 * sizeof(float));
    before[3] = pe_f32(&pe_scope_find(model, "b")->t)[0];
    PU_OK(pe_seq_exec_run(r.step, r.feeds, 2, fetch, 2, out));
    loss = pe_f32(out[0])[0];
    if (!s) first = loss;
    float norm = pe_f32(out[1])[0];
    memcpy(after, pe_scope_find(model, "w")->t.data, 3 * sizeof(float));
    after[3] = pe_f32(&pe_scope_find(model, "b")->t)[0];
    double d = 0;
    for (int k = 0; k < 4; k++) d += ((double)after[k] - before[k]) * (after[k] - before[k]);
    d = sqrt(d);
    ck_assert_msg(d <= lr * max_norm * (1 + 1e-4), "step %d moved %g > %g", s, d, lr * max_norm);
    if (norm > max_norm) {
      clipped++;
      ck_assert_msg(fabs(d - lr * max_norm) < 1e-3 * lr * max_norm,
                    "step %d (norm %g): moved %g, not %g", s, norm, d, lr * max_norm);
    } else {
      ck_assert_msg(fabs(d - lr * norm) < 1e-3 * lr * norm + 1e-9, "step %d: moved %g, not %g", s,
                    d, lr * norm);
    }
  }
  ck_assert_int_ge(clipped, 30); /* the limit is well below the early gradients */
  ck_assert_msg(loss < first, "loss %g -> %g", first, loss);
  reg_close(&r);
  pe_program_free(p);

  /* A limit the gradients never reach: training as without clipping. */
  float w1[3], b1, f1, w2[3], b2, f2;
  p = regression_program("momentum", 0.05f);
  float l1 = train(p, 100, w1, &b1, &f1);
  pe_program_free(p);
  p = regression_program("momentum", 0.05f);
  p->opt.grad_clip_norm = 1e6f;
  float l2 = train(p, 100, w2, &b2, &f2);
  pe_program_free(p);
  ck_assert(l1 == l2 && b1 == b2 && !memcmp(w1, w2, sizeof w1));
  /* A negative limit is refused by the pass. */
  p = regression_program("sgd", 0.1f);
  p->opt.grad_clip_norm = -1.0f;
  pu_expect(pe_passes_run(&(pe_ir){.prog = p}, "validate,backward,optimizer"), PE_EINVAL,
            "grad_clip_norm -1 must be finite and >= 0", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(lr_schedule_drives_the_updates) {
  pe_program *p = regression_program("momentum", 0.2f);
  p->opt.sched.type = strdup("cosine");
  p->opt.sched.warmup_steps = 5;
  p->opt.sched.decay_steps = 20;
  p->opt.sched.min_lr = 0.01f;
  pe_program *hand = NULL;
  PU_OK(pe_program_clone(p, &hand));
  free(hand->opt.sched.type);
  hand->opt.sched.type = NULL;

  enum { STEPS = 30 };
  float want[STEPS], seen[STEPS], seen_hand[STEPS];
  /* warmup 5, then cosine 0.2 -> 0.01 over 20, from the f32 attributes. */
  const double base = 0.2f, min = 0.01f;
  for (int s = 0; s < STEPS; s++) {
    double t = s - 5, tt = t < 20 ? t : 20;
    want[s] =
        (float)(s < 5 ? base * (s + 1) / 5 : min + (base - min) * (1 + cos(M_PI * tt / 20)) / 2);
  }
  float w[3], b, first, wh[3], bh, firsth;
  float loss = train_lr(p, STEPS, NULL, seen, w, &b, &first);
  float loss_h = train_lr(hand, STEPS, want, seen_hand, wh, &bh, &firsth);
  for (int s = 0; s < STEPS; s++)
    ck_assert_msg(fabsf(seen[s] - want[s]) <= 1e-7f * want[s], "step %d: lr %.9g, want %.9g", s,
                  seen[s], want[s]);
  ck_assert_msg(memcmp(w, wh, sizeof w) == 0 && memcmp(&b, &bh, sizeof b) == 0 &&
                    memcmp(&loss, &loss_h, sizeof loss) == 0,
                "scheduled w %.9g %.9g %.9g b %.9g loss %.9g; by hand %.9g %.9g %.9g %.9g %.9g",
                w[0], w[1], w[2], b, loss, wh[0], wh[1], wh[2], bh, loss_h);
  ck_assert_msg(loss < first * 0.05f, "loss %g (first %g)", loss, first);
  /* train_lr compiled p. */
  pe_block *m = pe_program_main(p), *st = pe_program_startup(p);
  pe_var_desc *c = pe_block_find_var_local(m, "@LR_DECAY_COUNTER@");
  ck_assert(c && c->persistable && c->stop_gradient && c->dtype == PE_I64);
  ck_assert(c->shape.ndim == 1 && c->shape.d[0] == 1);
  ck_assert_int_eq(pu_writers(st, "@LR_DECAY_COUNTER@"), 1);
  int at = pu_find_op(m, "lr_schedule", 0), upd = pu_find_op(m, "momentum", 0);
  ck_assert_int_ge(at, 0);
  ck_assert_int_lt(at, upd); /* before every update */
  ck_assert_int_lt(pu_find_op(m, "lr_schedule", at + 1), 0);
  ck_assert_str_eq(pe_op_output_arg(m->ops[at], "LearningRate"), "learning_rate");
  ck_assert_str_eq(pe_op_output_arg(m->ops[at], "StepOut"), "@LR_DECAY_COUNTER@");
  ck_assert_str_eq(pe_op_find_attr(m->ops[at], "schedule")->s, "cosine");
  ck_assert(pe_op_find_attr(m->ops[at], "base_lr")->f == 0.2f);
  ck_assert_int_eq(pe_op_find_attr(m->ops[at], "decay_steps")->i, 20);
  ck_assert_int_eq(pe_op_find_attr(m->ops[at], "warmup_steps")->i, 5);
  /* Without a schedule: neither counter nor op. */
  pe_program *plain = regression_program("momentum", 0.2f);
  PU_OK(pe_program_compile(plain, false));
  ck_assert_ptr_null(pe_block_find_var_local(pe_program_main(plain), "@LR_DECAY_COUNTER@"));
  ck_assert_int_lt(pu_find_op(pe_program_main(plain), "lr_schedule", 0), 0);
  pe_program_free(plain);

  pe_program_free(hand);
  pe_program_free(p);

  /* The pass checks the schedule as decode does. */
  p = regression_program("sgd", 0.1f);
  p->opt.sched.type = strdup("cosine");
  p->opt.sched.decay_steps = 10;
  p->opt.sched.min_lr = 0.5f;
  pu_expect(pe_passes_run(&(pe_ir){.prog = p}, "validate,backward,optimizer"), PE_EINVAL,
            "optimizer sgd: lr_schedule cosine: min_lr 0.5 must be in [0, learning rate 0.1)",
            NULL);
  pe_program_free(p);
}
END_TEST

/* The client's MLP: decode, compile for training and for test, share one
 * model scope between the train, eval and startup executors, and fit a
 * synthetic separable batch. */
START_TEST(client_model_trains) {
  pe_model_spec md;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &md, err, sizeof err) == 0, "%s", err);
  pe_program *p, *t;
  PU_OK(pe_program_decode(md.bytes, md.len, &p));
  PU_OK(pe_program_decode(md.bytes, md.len, &t));
  PU_OK(pe_program_compile(p, false));
  PU_OK(pe_program_compile(t, true));
  pe_scope *model = pe_scope_new(NULL);
  pe_exec_opts o = {3, 1};
  pe_seq_exec *init, *step, *eval;
  PU_OK(pe_seq_exec_new(p, p->startup_block, model, &o, &init));
  PU_OK(pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL));
  PU_OK(pe_seq_exec_new(p, p->main_block, model, &o, &step));
  PU_OK(pe_seq_exec_new(t, t->main_block, model, &o, &eval));
  enum { B = 16 };
  pe_tensor x = make_f32(PE_SHAPE(B, 784), NULL), y;
  pe_tensor_init(&y);
  pe_shape ys = PE_SHAPE(B, 1);
  PU_OK(pe_tensor_resize(&y, PE_I64, &ys, "y"));
  for (int i = 0; i < B; i++) {
    int c = i % 10;
    pe_i64(&y)[i] = c;
    for (int k = 0; k < 784; k++)
      pe_f32(&x)[i * 784 + k] =
          (float)(0.3 * pe_rng_uniform(6, (uint64_t)(i * 784 + k)) + (k * 10 / 784 == c));
  }
  pe_feed feeds[] = {{md.image, &x}, {md.label, &y}};
  const char *fetch[] = {md.loss, md.accuracy};
  const pe_tensor *out[2];
  PU_OK(pe_seq_exec_run(eval, feeds, 2, fetch, 2, out));
  float before = pe_f32(out[0])[0];
  for (int s = 0; s < 15; s++) PU_OK(pe_seq_exec_run(step, feeds, 2, fetch, 2, out));
  PU_OK(pe_seq_exec_run(eval, feeds, 2, fetch, 2, out));
  ck_assert_msg(pe_f32(out[0])[0] < 0.1f * before, "loss %g -> %g", before, pe_f32(out[0])[0]);
  ck_assert_float_eq(pe_f32(out[1])[0], 1.0f);
  pe_seq_exec_free(init);
  pe_seq_exec_free(step);
  pe_seq_exec_free(eval);
  pe_tensor_release(&x);
  pe_tensor_release(&y);
  pe_scope_free(model);
  pe_program_free(p);
  pe_program_free(t);
  pe_model_spec_release(&md);
}
END_TEST

static Suite *seq_exec_suite(void) {
  Suite *s = suite_create("seq_executor");
  TCase *tc = tcase_create("seq_executor");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, runs_small_program);
  tcase_add_test(tc, feed_errors);
  tcase_add_test(tc, fetch_of_a_fused_intermediate_says_how_to_keep_it);
  tcase_add_test(tc, op_error_propagates_with_op_index);
  tcase_add_test(tc, uninitialised_parameter);
  tcase_add_test(tc, running_twice_reuses_buffers);
  tcase_add_test(tc, program_generator_is_seeded);
  tcase_add_test(tc, sgd_converges);
  tcase_add_test(tc, momentum_converges);
  tcase_add_test(tc, adam_converges);
  tcase_add_test(tc, weight_decay_converges_to_ridge);
  tcase_add_test(tc, no_weight_decay_excludes_the_bias);
  tcase_add_test(tc, adamw_decoupled_decay);
  tcase_add_test(tc, clip_grad_norm_bounds_each_step);
  tcase_add_test(tc, optimizer_pass_structure);
  tcase_add_test(tc, lr_schedule_drives_the_updates);
  tcase_add_test(tc, client_model_trains);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(seq_exec_suite)
