/* The sequential executor with the startup and optimizer passes, end to
 * end on a linear regression: sgd, momentum and adam converge, weight decay
 * reaches the ridge solution (no_weight_decay, adamw's decoupled decay),
 * the optimizer pass's structure, gradient clipping and learning-rate
 * schedules. Split from test_seq_executor.c (make_f32: seq_test_util.h). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "core/rng.h"
#include "engine/seq_executor.h"
#include "seq_test_util.h"

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

static Suite *seq_exec_suite(void) {
  Suite *s = suite_create("seq_executor_optimizer");
  TCase *tc = tcase_create("seq_executor_optimizer");
  tcase_add_test(tc, sgd_converges);
  tcase_add_test(tc, momentum_converges);
  tcase_add_test(tc, adam_converges);
  tcase_add_test(tc, weight_decay_converges_to_ridge);
  tcase_add_test(tc, no_weight_decay_excludes_the_bias);
  tcase_add_test(tc, adamw_decoupled_decay);
  tcase_add_test(tc, clip_grad_norm_bounds_each_step);
  tcase_add_test(tc, optimizer_pass_structure);
  tcase_add_test(tc, lr_schedule_drives_the_updates);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(seq_exec_suite)
