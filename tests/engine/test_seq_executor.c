/* The sequential executor: values, feed errors, op error propagation, buffer
 * reuse across runs, the program generator, and the client's MLP trained
 * and evaluated on one model scope. The startup + optimizer passes end to
 * end (linear regression with sgd, momentum, adam, weight decay, clipping,
 * schedules) are test_seq_executor_optimizer.c. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "compiler/validate.h"
#include "core/rng.h"
#include "engine/seq_executor.h"
#include "pe_models.h"
#include "seq_test_util.h"

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
  tcase_add_test(tc, runs_small_program);
  tcase_add_test(tc, feed_errors);
  tcase_add_test(tc, fetch_of_a_fused_intermediate_says_how_to_keep_it);
  tcase_add_test(tc, op_error_propagates_with_op_index);
  tcase_add_test(tc, uninitialised_parameter);
  tcase_add_test(tc, running_twice_reuses_buffers);
  tcase_add_test(tc, program_generator_is_seeded);
  tcase_add_test(tc, client_model_trains);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(seq_exec_suite)
