/* The backward pass: generated op lists (renaming + sum for shared
 * variables, pruning of stop_gradient inputs, labels and dead branches) and
 * gradient values, checked by running the program with the sequential
 * executor against central differences of the loss. */
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
#include "prog_util.h"

/* --- running programs ------------------------------------------------------- */

/* Values in +-[0.2, 1.0): away from relu's kink at 0. */
static void fill_values(pe_tensor *t, uint64_t seed) {
  float *v = pe_f32(t);
  for (int64_t i = 0; i < pe_tensor_numel(t); i++) {
    double u = pe_rng_uniform(seed, (uint64_t)i);
    v[i] = (float)((u < 0.5 ? -1 : 1) * (0.2 + 1.6 * fabs(u - 0.5)));
  }
}

static pe_tensor *set_param(pe_scope *model, const char *name, pe_shape shape, uint64_t seed) {
  pe_var *v;
  PU_OK(pe_scope_var(model, name, &v));
  v->persistable = true;
  PU_OK(pe_tensor_resize(&v->t, PE_F32, &shape, name));
  fill_values(&v->t, seed);
  return &v->t;
}

static double run_loss(pe_seq_exec *e, const pe_feed *feeds, int n_feeds, const char *loss) {
  const pe_tensor *out;
  PU_OK(pe_seq_exec_run(e, feeds, n_feeds, &loss, 1, &out));
  ck_assert_int_eq(pe_tensor_numel(out), 1);
  return pe_f32(out)[0];
}

/* Compare name@GRAD from the program with central differences of the loss
 * over every element of the persistable `name`. */
static void check_grad(pe_seq_exec *e, pe_scope *model, const pe_feed *feeds, int n_feeds,
                       const char *loss, const char *name) {
  char gname[128];
  snprintf(gname, sizeof gname, "%s@GRAD", name);
  const char *fetch[] = {loss, gname};
  const pe_tensor *out[2];
  PU_OK(pe_seq_exec_run(e, feeds, n_feeds, fetch, 2, out));
  pe_tensor *x = &pe_scope_find(model, name)->t;
  ck_assert(pe_shape_equal(&out[1]->shape, &x->shape));
  int64_t n = pe_tensor_numel(x);
  float *analytic = malloc((size_t)n * sizeof(float));
  memcpy(analytic, out[1]->data, (size_t)n * sizeof(float));
  const double eps = 1e-3;
  for (int64_t i = 0; i < n; i++) {
    float orig = pe_f32(x)[i];
    pe_f32(x)[i] = (float)(orig + eps);
    double lp = run_loss(e, feeds, n_feeds, loss);
    pe_f32(x)[i] = (float)(orig - eps);
    double lm = run_loss(e, feeds, n_feeds, loss);
    pe_f32(x)[i] = orig;
    double num = (lp - lm) / (2 * eps), a = analytic[i];
    ck_assert_msg(fabs(num - a) <= 2e-3 + 2e-2 * fabs(num), "%s[%lld]: analytic %g, numeric %g",
                  gname, (long long)i, a, num);
  }
  free(analytic);
}

static void backward(pe_program *p, const char *loss) {
  p->loss = strdup(loss);
  PU_OK(pe_passes_run(&(pe_ir){.prog = p}, "validate,backward"));
}

/* Types of ops [from, n_ops) joined by spaces. */
static const char *op_types(const pe_block *b, int from, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = from; i < b->n_ops && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, "%s%s", i > from ? " " : "", b->ops[i]->type);
  return buf;
}

static const pe_slot *out_slot(const pe_op_desc *op, const char *slot) {
  const pe_slot *s = pe_op_find_output(op, slot);
  ck_assert_msg(s != NULL, "%s has no output slot %s", op->type, slot);
  return s;
}
static const pe_slot *in_slot(const pe_op_desc *op, const char *slot) {
  const pe_slot *s = pe_op_find_input(op, slot);
  ck_assert_msg(s != NULL, "%s has no input slot %s", op->type, slot);
  return s;
}

/* --- tests --------------------------------------------------------------------- */

/* x (parameter) feeds relu and tanh; their sum is averaged. */
START_TEST(shared_variable_renamed_and_summed) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_param(m, "x", PE_SHAPE(2, 3));
  pu_var(m, "a", PE_F32, NULL);
  pu_var(m, "c", PE_F32, NULL);
  pu_var(m, "s", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "relu", "X", "x", NULL, "Out", "a", NULL);
  pu_op(m, "tanh", "X", "x", NULL, "Out", "c", NULL);
  pu_op(m, "elementwise_add", "X", "a", "Y", "c", NULL, "Out", "s", NULL);
  pu_op(m, "mean", "X", "s", NULL, "Out", "loss", NULL);
  backward(p, "loss");

  char types[512];
  ck_assert_str_eq(op_types(m, 4, types, sizeof types),
                   "fill_constant mean_grad elementwise_add_grad tanh_grad relu_grad sum");
  const pe_op_desc *tg = m->ops[7], *rg = m->ops[8], *sum = m->ops[9];
  ck_assert_str_eq(out_slot(tg, "X@GRAD")->args[0], "x@GRAD@RENAME@0");
  ck_assert_str_eq(out_slot(rg, "X@GRAD")->args[0], "x@GRAD@RENAME@1");
  const pe_slot *sx = in_slot(sum, "X");
  ck_assert_int_eq(sx->n, 2);
  ck_assert_str_eq(sx->args[0], "x@GRAD@RENAME@0");
  ck_assert_str_eq(sx->args[1], "x@GRAD@RENAME@1");
  ck_assert_str_eq(out_slot(sum, "Out")->args[0], "x@GRAD");
  ck_assert_int_eq(pu_writers(m, "x@GRAD"), 1);
  /* The seed and the grad vars are declared with their forward shapes. */
  const pe_op_desc *fill = m->ops[4];
  ck_assert_str_eq(out_slot(fill, "Out")->args[0], "loss@GRAD");
  pe_var_desc *xg = pe_block_find_var_local(m, "x@GRAD"),
              *r0 = pe_block_find_var_local(m, "x@GRAD@RENAME@0");
  ck_assert_ptr_nonnull(xg);
  ck_assert_ptr_nonnull(r0);
  pe_shape want = PE_SHAPE(2, 3);
  ck_assert(pe_shape_equal(&xg->shape, &want));
  ck_assert(pe_shape_equal(&r0->shape, &want));

  pe_scope *model = pe_scope_new(NULL);
  set_param(model, "x", PE_SHAPE(2, 3), 11);
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  check_grad(e, model, NULL, 0, "loss", "x");
  pe_seq_exec_free(e);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

/* One op reading the same variable twice: loss = mean(x * x). */
START_TEST(same_op_reads_variable_twice) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_param(m, "x", PE_SHAPE(3, 2));
  pu_var(m, "sq", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "elementwise_mul", "X", "x", "Y", "x", NULL, "Out", "sq", NULL);
  pu_op(m, "mean", "X", "sq", NULL, "Out", "loss", NULL);
  backward(p, "loss");
  char types[256];
  ck_assert_str_eq(op_types(m, 2, types, sizeof types),
                   "fill_constant mean_grad elementwise_mul_grad sum");
  const pe_op_desc *mg = m->ops[4];
  ck_assert_str_eq(out_slot(mg, "X@GRAD")->args[0], "x@GRAD@RENAME@0");
  ck_assert_str_eq(out_slot(mg, "Y@GRAD")->args[0], "x@GRAD@RENAME@1");

  pe_scope *model = pe_scope_new(NULL);
  pe_tensor *x = set_param(model, "x", PE_SHAPE(3, 2), 5);
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  check_grad(e, model, NULL, 0, "loss", "x");
  /* Exact: d mean(x^2) / dx = 2x / 6. */
  const char *fetch = "x@GRAD";
  const pe_tensor *g;
  PU_OK(pe_seq_exec_run(e, NULL, 0, &fetch, 1, &g));
  for (int i = 0; i < 6; i++) ck_assert_float_eq_tol(pe_f32(g)[i], pe_f32(x)[i] / 3.0f, 1e-6f);
  pe_seq_exec_free(e);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

/* h = x W splits into relu and sigmoid branches that join again:
 * loss = mean(relu(h) * sigmoid(h) + b). x is a feed (stop_gradient). */
START_TEST(branches_join) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 4));
  pu_param(m, "w", PE_SHAPE(4, 3));
  pu_param(m, "b", PE_SHAPE(3));
  const char *tmps[] = {"h", "r", "g", "rg", "y", "loss"};
  for (int i = 0; i < 6; i++) pu_var(m, tmps[i], PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pu_op(m, "relu", "X", "h", NULL, "Out", "r", NULL);
  pu_op(m, "sigmoid", "X", "h", NULL, "Out", "g", NULL);
  pu_op(m, "elementwise_mul", "X", "r", "Y", "g", NULL, "Out", "rg", NULL);
  pu_op(m, "elementwise_add", "X", "rg", "Y", "b", NULL, "Out", "y", NULL);
  pu_op(m, "mean", "X", "y", NULL, "Out", "loss", NULL);
  backward(p, "loss");
  char types[512];
  ck_assert_str_eq(op_types(m, 6, types, sizeof types),
                   "fill_constant mean_grad elementwise_add_grad elementwise_mul_grad "
                   "sigmoid_grad relu_grad sum matmul_grad");
  /* x is a stop_gradient feed: matmul_grad computes no X@GRAD. */
  const pe_op_desc *mmg = m->ops[m->n_ops - 1];
  ck_assert_int_eq(out_slot(mmg, "X@GRAD")->n, 0);
  ck_assert_str_eq(out_slot(mmg, "Y@GRAD")->args[0], "w@GRAD");
  ck_assert_ptr_null(pe_block_find_var_local(m, "x@GRAD"));
  ck_assert_str_eq(in_slot(mmg, "Out@GRAD")->args[0], "h@GRAD");

  pe_scope *model = pe_scope_new(NULL);
  set_param(model, "w", PE_SHAPE(4, 3), 21);
  set_param(model, "b", PE_SHAPE(3), 22);
  pe_tensor xt;
  pe_tensor_init(&xt);
  pe_shape xs = PE_SHAPE(5, 4);
  PU_OK(pe_tensor_resize(&xt, PE_F32, &xs, "x"));
  fill_values(&xt, 23);
  pe_feed feed = {"x", &xt};
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  check_grad(e, model, &feed, 1, "loss", "w");
  check_grad(e, model, &feed, 1, "loss", "b");
  pe_seq_exec_free(e);
  pe_tensor_release(&xt);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

/* Pruning: a label (no-grad slot), a frozen (stop_gradient) parameter, a
 * metric, and a side branch with its own parameter that never reaches the
 * loss get no gradient ops and no @GRAD variables. */
START_TEST(pruned_paths) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 4));
  pu_feed(m, "label", PE_I64, PE_SHAPE(-1, 1));
  pu_param(m, "w", PE_SHAPE(4, 3));
  pu_param(m, "frozen", PE_SHAPE(3))->stop_gradient = true;
  pu_param(m, "w_side", PE_SHAPE(3, 2));
  const char *tmps[] = {"h", "logits", "prob", "ce", "loss", "acc", "side", "side_t", "side_loss"};
  for (int i = 0; i < 9; i++) pu_var(m, tmps[i], PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pe_op_desc *add =
      pu_op(m, "elementwise_add", "X", "h", "Y", "frozen", NULL, "Out", "logits", NULL);
  PU_OK(pe_op_set_int(add, "axis", 1));
  pu_op(m, "softmax_with_cross_entropy", "Logits", "logits", "Label", "label", NULL, "Softmax",
        "prob", "Loss", "ce", NULL);
  pu_op(m, "mean", "X", "ce", NULL, "Out", "loss", NULL);
  pu_op(m, "accuracy", "X", "prob", "Label", "label", NULL, "Accuracy", "acc", NULL);
  pu_op(m, "matmul", "X", "logits", "Y", "w_side", NULL, "Out", "side", NULL);
  pu_op(m, "tanh", "X", "side", NULL, "Out", "side_t", NULL);
  pu_op(m, "mean", "X", "side_t", NULL, "Out", "side_loss", NULL);
  int n_fwd = m->n_ops;
  PU_OK(pe_passes_run(&(pe_ir){.prog = p}, "validate"));
  backward(p, "loss");
  char types[512];
  ck_assert_str_eq(op_types(m, n_fwd, types, sizeof types),
                   "fill_constant mean_grad softmax_with_cross_entropy_grad "
                   "elementwise_add_grad matmul_grad");
  const pe_op_desc *swg = m->ops[n_fwd + 2];
  ck_assert_ptr_null(pe_op_find_output(swg, "Label@GRAD")); /* no-grad slot */
  ck_assert_int_eq(in_slot(swg, "Softmax@GRAD")->n, 0);     /* prob feeds only the metric */
  ck_assert_str_eq(in_slot(swg, "Loss@GRAD")->args[0], "ce@GRAD");
  const pe_op_desc *ag = m->ops[n_fwd + 3];
  ck_assert_int_eq(out_slot(ag, "Y@GRAD")->n, 0); /* frozen */
  ck_assert_str_eq(out_slot(ag, "X@GRAD")->args[0], "h@GRAD");
  const pe_op_desc *mg = m->ops[n_fwd + 4];
  ck_assert_int_eq(out_slot(mg, "X@GRAD")->n, 0); /* feed x */
  const char *none[] = {"label@GRAD", "frozen@GRAD", "w_side@GRAD", "side@GRAD",
                        "acc@GRAD",   "prob@GRAD",   "x@GRAD"};
  for (int i = 0; i < 7; i++)
    ck_assert_msg(!pe_block_find_var_local(m, none[i]), "%s was declared", none[i]);
  ck_assert_ptr_nonnull(pe_block_find_var_local(m, "w@GRAD"));

  /* Numerically right for w. */
  pe_scope *model = pe_scope_new(NULL);
  set_param(model, "w", PE_SHAPE(4, 3), 31);
  set_param(model, "frozen", PE_SHAPE(3), 32);
  set_param(model, "w_side", PE_SHAPE(3, 2), 33);
  pe_tensor xt, lt;
  pe_tensor_init(&xt);
  pe_tensor_init(&lt);
  pe_shape xs = PE_SHAPE(4, 4), ls = PE_SHAPE(4, 1);
  PU_OK(pe_tensor_resize(&xt, PE_F32, &xs, "x"));
  PU_OK(pe_tensor_resize(&lt, PE_I64, &ls, "label"));
  fill_values(&xt, 34);
  for (int i = 0; i < 4; i++) pe_i64(&lt)[i] = i % 3;
  pe_feed feeds[] = {{"x", &xt}, {"label", &lt}};
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  check_grad(e, model, feeds, 2, "loss", "w");
  pe_seq_exec_free(e);
  pe_tensor_release(&xt);
  pe_tensor_release(&lt);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

/* sum(p1, frozen): sum_grad's X@GRAD slot keeps its positions; the frozen
 * argument's gradient goes to a private discard variable. */
START_TEST(partially_pruned_multi_argument_slot) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_param(m, "p1", PE_SHAPE(2, 2));
  pu_param(m, "frozen", PE_SHAPE(2, 2))->stop_gradient = true;
  pu_var(m, "t", PE_F32, NULL);
  pu_var(m, "s", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "tanh", "X", "p1", NULL, "Out", "t", NULL);
  pe_op_desc *sum = pu_op(m, "sum", NULL, "Out", "s", NULL);
  const char *xs[] = {"t", "frozen"};
  PU_OK(pe_op_set_input(sum, "X", 2, xs));
  pu_op(m, "mean", "X", "s", NULL, "Out", "loss", NULL);
  backward(p, "loss");
  char types[256];
  ck_assert_str_eq(op_types(m, 3, types, sizeof types),
                   "fill_constant mean_grad sum_grad tanh_grad");
  const pe_slot *g = out_slot(m->ops[5], "X@GRAD");
  ck_assert_int_eq(g->n, 2);
  ck_assert_str_eq(g->args[0], "t@GRAD");
  ck_assert_str_eq(g->args[1], "frozen@GRAD@DISCARD@0");
  ck_assert_ptr_null(pe_block_find_var_local(m, "frozen@GRAD"));

  pe_scope *model = pe_scope_new(NULL);
  set_param(model, "p1", PE_SHAPE(2, 2), 41);
  set_param(model, "frozen", PE_SHAPE(2, 2), 42);
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, NULL, &e));
  check_grad(e, model, NULL, 0, "loss", "p1");
  pe_seq_exec_free(e);
  pe_scope_free(model);
  pe_program_free(p);
}
END_TEST

START_TEST(errors) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_param(m, "w", PE_SHAPE(2, 2));
  pu_feed(m, "x", PE_F32, PE_SHAPE(2, 2));
  pu_var(m, "y", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_var(m, "xloss", PE_F32, NULL);
  pu_var(m, "ilabel", PE_I64, NULL);
  pu_op(m, "relu_grad", "X", "w", "Out@GRAD", "w", NULL, "X@GRAD", "y", NULL);
  pu_op(m, "mean", "X", "y", NULL, "Out", "loss", NULL);
  pu_op(m, "mean", "X", "x", NULL, "Out", "xloss", NULL);
  PU_OK(pe_program_validate(p));
  pe_pass_opts o = {"nope"};
  pu_expect(pe_pass_backward(&(pe_ir){.prog = p, .opts = &o}), PE_EUNKNOWN_VAR, "'nope'", NULL);
  o.loss = "ilabel";
  pu_expect(pe_pass_backward(&(pe_ir){.prog = p, .opts = &o}), PE_EDTYPE, "'ilabel'", "i64", NULL);
  o.loss = "xloss"; /* depends on the stop_gradient feed only */
  pu_expect(pe_pass_backward(&(pe_ir){.prog = p, .opts = &o}), PE_ENOGRAD, "'xloss'", NULL);
  o.loss = "loss"; /* relu_grad is on the path and has no gradient itself */
  pu_expect(pe_pass_backward(&(pe_ir){.prog = p, .opts = &o}), PE_ENOGRAD, "op #0 (relu_grad)",
            "'loss'", NULL);
  ck_assert_int_eq(m->n_ops, 3); /* failures leave the block as it was */
  pu_expect(pe_pass_backward(&(pe_ir){.prog = p}), PE_EINVAL, "no loss", NULL);
  pe_program_free(p);

  /* In-place write of a variable on the gradient path. */
  p = pe_program_new();
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_param(m, "w", PE_SHAPE(2, 2));
  pu_var(m, "h", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "tanh", "X", "w", NULL, "Out", "h", NULL);
  pu_op(m, "relu", "X", "h", NULL, "Out", "h", NULL);
  pu_op(m, "mean", "X", "h", NULL, "Out", "loss", NULL);
  p->loss = strdup("loss");
  PU_OK(pe_program_validate(p));
  pu_expect(pe_pass_backward(&(pe_ir){.prog = p}), PE_EINVAL, "op #1 (relu)", "'h'", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(twice_is_an_error_and_output_is_deterministic) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_param(m, "x", PE_SHAPE(2, 3));
  pu_var(m, "a", PE_F32, NULL);
  pu_var(m, "c", PE_F32, NULL);
  pu_var(m, "s", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "relu", "X", "x", NULL, "Out", "a", NULL);
  pu_op(m, "tanh", "X", "x", NULL, "Out", "c", NULL);
  pu_op(m, "elementwise_add", "X", "a", "Y", "c", NULL, "Out", "s", NULL);
  pu_op(m, "mean", "X", "s", NULL, "Out", "loss", NULL);
  p->loss = strdup("loss");
  pe_program *q;
  PU_OK(pe_program_clone(p, &q));
  PU_OK(pe_passes_run(&(pe_ir){.prog = p}, "validate,backward"));
  PU_OK(pe_passes_run(&(pe_ir){.prog = q}, "validate,backward"));
  uint8_t *b1, *b2;
  size_t l1, l2;
  PU_OK(pe_program_encode(p, &b1, &l1));
  PU_OK(pe_program_encode(q, &b2, &l2));
  ck_assert_uint_eq(l1, l2);
  ck_assert(memcmp(b1, b2, l1) == 0);
  free(b1);
  free(b2);
  pu_expect(pe_pass_backward(&(pe_ir){.prog = p}), PE_EINVAL, "loss@GRAD", "already", NULL);
  pe_program_free(p);
  pe_program_free(q);
}
END_TEST

static Suite *backward_suite(void) {
  Suite *s = suite_create("backward");
  TCase *tc = tcase_create("backward");
  tcase_add_test(tc, shared_variable_renamed_and_summed);
  tcase_add_test(tc, same_op_reads_variable_twice);
  tcase_add_test(tc, branches_join);
  tcase_add_test(tc, pruned_paths);
  tcase_add_test(tc, partially_pruned_multi_argument_slot);
  tcase_add_test(tc, errors);
  tcase_add_test(tc, twice_is_an_error_and_output_is_deterministic);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(backward_suite)
