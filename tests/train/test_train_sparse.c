/* Sparse embedding gradients (lookup_table_v2 is_sparse) trained by the
 * sequential executor against the same model with a dense gradient: sgd and
 * momentum give the same parameters, adam's lazy_mode equals dense adam on
 * the rows every batch touches and leaves untouched rows' moments alone,
 * padding_idx rows never move; batches repeat ids. What a sparse gradient
 * cannot take is an error at compile time naming the parameter: gradient
 * clipping, weight decay, a parameter read by two ops (several places:
 * test_train_sparse_par.c).
 *
 * The model: loss = mean(square(W[ids])), W [VOCAB, DIM]. The square makes
 * each row's gradient depend on its values. The sparse gradient sums a
 * row's repeats in the dense sum's order, so the two runs agree to the bit
 * in practice; the assertion allows 1e-6 relative. The same holds for the
 * program libpeclient's builder makes (pe_builder_embedding_ex with
 * is_sparse, then mse_loss against a fed target). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder_util.h"
#include "check_main.h"
#include "compiler/pass.h"
#include "core/scope.h"
#include "engine/parallel/executor.h"
#include "engine/seq_executor.h"
#include "pe_builder.h"
#include "sparse_emb_prog.h"

enum { VOCAB = 40, DIM = 8, BATCH = 6, SEQ = 3, STEPS = 12 };
/* Row ALWAYS is in every batch; row ONCE only in the first; PAD is the
 * padding_idx and in every batch; rows >= NEVER are never used. */
enum { ALWAYS = 5, ONCE = 33, PAD = 2, NEVER = 34 };

static pe_program *emb_program(const char *opt, bool sparse) {
  return se_square_mean(VOCAB, DIM, SEQ, PAD, sparse, opt, 0.5f);
}

/* Batch s: ALWAYS, PAD, ONCE (step 0 only) and repeats of a few rows
 * below NEVER. */
static void batch_ids(int s, int64_t *ids) {
  for (int i = 0; i < BATCH * SEQ; i++) ids[i] = 6 + (s * 7 + i * 3) % 9; /* repeats */
  ids[0] = ALWAYS;
  ids[4] = ALWAYS;
  ids[7] = PAD;
  ids[11] = s == 0 ? ONCE : ALWAYS;
}

/* The first values of W, the same for every run. */
static void initial_w(float *w) {
  for (int i = 0; i < VOCAB * DIM; i++) w[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
}

/* Step s's feed: ids (batch_ids) viewed by *t. */
static pe_feed step_feed(int s, int64_t ids[BATCH * SEQ], pe_tensor *t) {
  batch_ids(s, ids);
  pe_tensor_init(t);
  pe_shape is = PE_SHAPE(BATCH, SEQ);
  pe_tensor_view(t, PE_I64, &is, ids);
  return (pe_feed){"ids", t};
}

typedef struct trained {
  pe_scope *model;
  pe_program *p;
} trained;

/* The builder's model: emb = embedding(ids) named "emb" (table "emb.w",
 * padding_idx PAD), loss = mse_loss(emb, y), the optimizer opt. */
static pe_program *builder_program(const char *opt, bool sparse) {
  pe_builder *b = pe_builder_new();
  const char *ids = pe_builder_data(b, "ids", PE_B_I64, PE_B_SHAPE(-1, SEQ));
  const char *y = pe_builder_data(b, "y", PE_B_F32, PE_B_SHAPE(-1, SEQ, DIM));
  pe_b_embedding_opts eo = {.name = "emb", .is_sparse = sparse};
  const char *e = pe_builder_embedding_ex(b, ids, VOCAB, DIM, PAD, &eo);
  const char *loss = pe_builder_mse_loss(b, e, y);
  ck_assert_msg(loss != NULL, "%s", pe_builder_error(b));
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  int rc =
      !strcmp(opt, "sgd") ? pe_builder_sgd(b, 0.5f) : pe_builder_momentum(b, 0.5f, 0.9f, false);
  ck_assert_msg(rc == 0, "%s", pe_builder_error(b));
  return tb_finish(b);
}

/* Step s's target for the builder's model. */
static void step_target(int s, float *y) {
  for (int i = 0; i < BATCH * SEQ * DIM; i++) y[i] = (float)((s * 5 + i * 11) % 13) / 13.0f;
}

/* Compile p, set its table w, train `steps` steps (feeding the target y
 * when the program has one); the model scope holds the result. */
static trained train_program(pe_program *p, const char *w_name, int steps) {
  trained t = {pe_scope_new(NULL), p};
  bool feed_y = pe_block_find_var_local(pe_program_main(p), "y") != NULL;
  PU_OK(pe_program_compile(t.p, false));
  pe_exec_opts o = {7, 1};
  pe_seq_exec *init, *step;
  PU_OK(pe_seq_exec_new(t.p, t.p->startup_block, t.model, &o, &init));
  PU_OK(pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL));
  pe_seq_exec_free(init);
  float w[VOCAB * DIM];
  initial_w(w);
  ph_set_f32(t.model, w_name, PE_SHAPE(VOCAB, DIM), w);
  PU_OK(pe_seq_exec_new(t.p, t.p->main_block, t.model, &o, &step));
  for (int s = 0; s < steps; s++) {
    int64_t ids[BATCH * SEQ];
    float y[BATCH * SEQ * DIM];
    pe_tensor it, yt;
    pe_feed f[2] = {step_feed(s, ids, &it), {"y", &yt}};
    step_target(s, y);
    pe_tensor_init(&yt);
    pe_shape ys = PE_SHAPE(BATCH, SEQ, DIM);
    pe_tensor_view(&yt, PE_F32, &ys, y);
    const char *fetch = t.p->loss;
    const pe_tensor *out;
    PU_OK(pe_seq_exec_run(step, f, feed_y ? 2 : 1, &fetch, 1, &out));
    ck_assert(isfinite(pe_f32(out)[0]));
  }
  pe_seq_exec_free(step);
  return t;
}

static trained train(const char *opt, bool sparse, int steps) {
  return train_program(emb_program(opt, sparse), "w", steps);
}

static void trained_free(trained *t) {
  pe_scope_free(t->model);
  pe_program_free(t->p);
}

static const float *var_f32(trained *t, const char *name) {
  pe_tensor *v = ph_get(t->model, name);
  ck_assert_msg(v != NULL, "no variable '%s'", name);
  return pe_f32(v);
}

/* Rows [r0, r1) of a and b agree within 1e-6 relative. */
static void expect_rows_close(const float *a, const float *b, int r0, int r1, const char *what) {
  for (int i = r0 * DIM; i < r1 * DIM; i++) {
    double tol = 1e-6 * fmax(1.0, fabs(b[i]));
    ck_assert_msg(fabs(a[i] - b[i]) <= tol, "%s row %d col %d: %.9g vs %.9g", what, i / DIM,
                  i % DIM, a[i], b[i]);
  }
}

static void expect_rows_equal(const float *a, const float *b, int r0, int r1, const char *what) {
  for (int i = r0 * DIM; i < r1 * DIM; i++)
    ck_assert_msg(a[i] == b[i], "%s row %d col %d: %.9g vs %.9g", what, i / DIM, i % DIM, a[i],
                  b[i]);
}

/* The sparse run compiled to GradRows on the update and lazy_mode on adam. */
static void expect_sparse_update(const pe_program *p, const char *type) {
  const pe_op_desc *u = pu_main_op(p, type);
  ck_assert_ptr_nonnull(u);
  const char *rows = pe_op_input_arg(u, "GradRows");
  ck_assert_ptr_nonnull(rows);
  ck_assert_str_eq(rows, "w@GRAD@ROWS");
}

static void sparse_equals_dense(const char *opt) {
  trained d = train(opt, false, STEPS), s = train(opt, true, STEPS);
  expect_sparse_update(s.p, opt);
  ck_assert_ptr_null(pe_op_input_arg(pu_main_op(d.p, opt), "GradRows"));
  const float *wd = var_f32(&d, "w"), *ws = var_f32(&s, "w");
  expect_rows_close(ws, wd, 0, VOCAB, opt);
  /* The rows used moved, padding and unused rows did not. */
  float w0[VOCAB * DIM];
  initial_w(w0);
  ck_assert(ws[ALWAYS * DIM] != w0[ALWAYS * DIM]);
  expect_rows_equal(ws, w0, PAD, PAD + 1, "padding row");
  expect_rows_equal(ws, w0, NEVER, VOCAB, "unused rows");
  if (!strcmp(opt, "momentum"))
    expect_rows_close(var_f32(&s, "w@VELOCITY"), var_f32(&d, "w@VELOCITY"), 0, VOCAB, "velocity");
  trained_free(&d);
  trained_free(&s);
}

START_TEST(sgd_sparse_equals_dense) {
  sparse_equals_dense("sgd");
}
END_TEST

START_TEST(momentum_sparse_equals_dense) {
  sparse_equals_dense("momentum");
}
END_TEST

START_TEST(adam_lazy_matches_dense_on_rows_touched_every_step) {
  trained d = train("adam", false, STEPS), s = train("adam", true, STEPS);
  expect_sparse_update(s.p, "adam");
  const pe_op_desc *u = pu_main_op(s.p, "adam");
  bool lazy = false;
  for (int i = 0; i < u->n_attr; i++)
    if (!strcmp(u->attrs[i].name, "lazy_mode")) lazy = u->attrs[i].i != 0;
  ck_assert(lazy);
  const char *vars[] = {"w", "w@MOMENT1", "w@MOMENT2"};
  for (int v = 0; v < 3; v++)
    expect_rows_close(var_f32(&s, vars[v]), var_f32(&d, vars[v]), ALWAYS, ALWAYS + 1, vars[v]);
  ck_assert(var_f32(&s, "w@BETA1POW")[0] == var_f32(&d, "w@BETA1POW")[0]);
  /* ONCE: one update at step 0, then its moments stay (lazy) where dense
   * adam decays them; its values stay after step 0 too. */
  trained s1 = train("adam", true, 1);
  for (int v = 0; v < 3; v++)
    expect_rows_equal(var_f32(&s, vars[v]), var_f32(&s1, vars[v]), ONCE, ONCE + 1, vars[v]);
  const float *m1d = var_f32(&d, "w@MOMENT1"), *m1s = var_f32(&s, "w@MOMENT1");
  ck_assert(m1s[ONCE * DIM] != 0.0f);
  ck_assert_msg(fabsf(m1d[ONCE * DIM]) < fabsf(m1s[ONCE * DIM]), "dense %g, lazy %g",
                m1d[ONCE * DIM], m1s[ONCE * DIM]);
  /* Padding and unused rows: no moments at all. */
  for (int i = PAD * DIM; i < (PAD + 1) * DIM; i++) ck_assert(m1s[i] == 0.0f);
  for (int i = NEVER * DIM; i < VOCAB * DIM; i++) ck_assert(m1s[i] == 0.0f);
  trained_free(&d);
  trained_free(&s);
  trained_free(&s1);
}
END_TEST

/* The builder's is_sparse: the program compiles to a sparse update and
 * trains to the dense program's parameters (sgd and momentum). */
START_TEST(builder_sparse_equals_dense) {
  const char *opts[] = {"sgd", "momentum"};
  for (int k = 0; k < 2; k++) {
    trained d = train_program(builder_program(opts[k], false), "emb.w", STEPS);
    trained s = train_program(builder_program(opts[k], true), "emb.w", STEPS);
    const pe_op_desc *u = pu_main_op(s.p, opts[k]);
    ck_assert_ptr_nonnull(u);
    const char *rows = pe_op_input_arg(u, "GradRows");
    ck_assert_ptr_nonnull(rows);
    ck_assert_str_eq(rows, "emb.w@GRAD@ROWS");
    ck_assert_ptr_null(pe_op_input_arg(pu_main_op(d.p, opts[k]), "GradRows"));
    const float *wd = var_f32(&d, "emb.w"), *ws = var_f32(&s, "emb.w");
    expect_rows_close(ws, wd, 0, VOCAB, opts[k]);
    float w0[VOCAB * DIM];
    initial_w(w0);
    ck_assert(ws[ALWAYS * DIM] != w0[ALWAYS * DIM]);
    expect_rows_equal(ws, w0, PAD, PAD + 1, "padding row");
    expect_rows_equal(ws, w0, NEVER, VOCAB, "unused rows");
    trained_free(&d);
    trained_free(&s);
  }
}
END_TEST

/* One place: the parallel executor (the daemon's) trains the sparse model
 * as the sequential executor does. */
START_TEST(one_place_parallel_equals_sequential) {
  trained s = train("adam", true, STEPS);
  pe_program *p = emb_program("adam", true);
  pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 1};
  pe_runtime_opts ro = {.threads = 1, .cores = 2};
  se_par r = se_par_new(p, &o, &ro);
  pe_model *m = r.m;
  float w[VOCAB * DIM];
  initial_w(w);
  pe_tensor wt, out;
  pe_tensor_init(&wt);
  pe_tensor_init(&out);
  pe_shape ws = PE_SHAPE(VOCAB, DIM);
  pe_tensor_view(&wt, PE_F32, &ws, w);
  PU_OK(pe_model_set(m, "w", &wt));
  for (int st = 0; st < STEPS; st++) {
    int64_t ids[BATCH * SEQ];
    pe_tensor it;
    pe_feed f = step_feed(st, ids, &it);
    const char *fetch = "loss";
    PU_OK(pe_par_exec_run(r.step, &f, 1, &fetch, 1, &out, NULL, NULL));
  }
  const char *vars[] = {"w", "w@MOMENT1", "w@MOMENT2"};
  for (int v = 0; v < 3; v++) {
    PU_OK(pe_model_get(m, vars[v], &out));
    expect_rows_close(pe_f32(&out), var_f32(&s, vars[v]), 0, VOCAB, vars[v]);
  }
  pe_tensor_release(&out);
  se_par_free(&r);
  pe_program_free(p);
  trained_free(&s);
}
END_TEST

/* --- refusals ---------------------------------------------------------------------- */

START_TEST(clip_and_weight_decay_refuse_a_sparse_gradient) {
  pe_program *p = emb_program("sgd", true);
  p->opt.grad_clip_norm = 1.0f;
  pu_expect(pe_program_compile(p, false), PE_EINVAL, "grad_clip_norm", "'w'", "w@GRAD@ROWS",
            "is_sparse", NULL);
  pe_program_free(p);
  p = emb_program("momentum", true);
  p->opt.weight_decay = 0.01f;
  pu_expect(pe_program_compile(p, false), PE_EINVAL, "weight_decay", "'w'", "is_sparse", NULL);
  pe_program_free(p);
  /* adamw decays by default; no_weight_decay on the table lets it through. */
  p = emb_program("adamw", true);
  pu_expect(pe_program_compile(p, false), PE_EINVAL, "weight_decay", "'w'", NULL);
  pe_program_free(p);
  p = emb_program("adamw", true);
  pe_block_find_var_local(pe_program_main(p), "w")->no_weight_decay = true;
  PU_OK(pe_program_compile(p, false));
  pe_program_free(p);
}
END_TEST

START_TEST(a_table_read_twice_refuses_a_sparse_gradient) {
  pe_program *p = emb_program("sgd", true);
  pe_block *m = pe_program_main(p);
  pu_var(m, "emb2", PE_F32, NULL);
  pu_var(m, "both", PE_F32, NULL);
  pe_op_desc *e = pu_op(m, "lookup_table_v2", "W", "w", "Ids", "ids", NULL, "Out", "emb2", NULL);
  PU_OK(pe_op_set_bool(e, "is_sparse", true));
  /* loss = mean(square(emb) + emb2): rewire mean's input. */
  pe_op_desc *add = pu_op(m, "elementwise_add", "X", "sq", "Y", "emb2", NULL, "Out", "both", NULL);
  (void)add;
  pe_op_desc *mean = m->ops[2];
  ck_assert_str_eq(mean->type, "mean");
  PU_OK(pe_op_input1(mean, "X", "both"));
  /* mean must come last: move it behind the add. */
  m->ops[2] = m->ops[3];
  m->ops[3] = m->ops[4];
  m->ops[4] = mean;
  pu_expect(pe_program_compile(p, false), PE_EINVAL, "w@GRAD", "sparse", "is_sparse false", NULL);
  pe_program_free(p);
}
END_TEST

static Suite *sparse_suite(void) {
  Suite *s = suite_create("train.sparse");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, sgd_sparse_equals_dense);
  tcase_add_test(tc, momentum_sparse_equals_dense);
  tcase_add_test(tc, adam_lazy_matches_dense_on_rows_touched_every_step);
  tcase_add_test(tc, builder_sparse_equals_dense);
  tcase_add_test(tc, one_place_parallel_equals_sequential);
  tcase_add_test(tc, clip_and_weight_decay_refuse_a_sparse_gradient);
  tcase_add_test(tc, a_table_read_twice_refuses_a_sparse_gradient);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(sparse_suite)
