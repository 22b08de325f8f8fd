/* Blocked activation layouts (ops/cpu/dnnl_act_layout.h, the
 * layout_blocked pass) against plain ones: the CNN of pe_models.h (two
 * conv + relu + max-pool layers) trained with the sequential executor and
 * op fusion, once with [runtime] conv_layout blocked and once plain, on the
 * same batches from the same start. Both run the same oneDNN convolutions
 * (the plain side reorders around them, the blocked side does not) and the
 * reorders are copies, so the losses and parameters agree to rounding
 * (EQ_LOSS_RTOL, 1e-5 relative; measured: identical). Also: the pass marks
 * the convolutions' and pools' activations and nothing else, a fetch of a
 * blocked temporary is refused naming it, and a kept one is plain. Run the
 * suite under ONEDNN_MAX_CPU_ISA=AVX2 and =SSE41 too: the block differs by
 * ISA (16 channels on AVX-512, 8 below). A small residual network (conv ->
 * batch_norm with fused relu -> conv, identity and projection shortcuts
 * joined by elementwise_add with fused relu) trains the same way: its batch
 * norms, adds and gradient sums keep the activations blocked between the
 * convolutions; the batch norms' sums run in another order blocked than
 * plain, so there the losses and parameters agree to EQ_LOSS_RTOL and
 * EQ_PARAM_RTOL (1e-5) rather than bit for bit. */
#include "check_main.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "par_equiv.h"

#define LAYOUT_STEPS 4

/* The sequential executor on p compiled as the daemon does (op fusion on a
 * cpu place), in layout mode `mode`, keeping `keep` fetchable (NULL: none). */
static void seq_new_mode(const pe_program *p, int mode, const char *keep, eq_seq *s) {
  pe_conv_layout_set_mode(mode);
  PE_CK_OK(pe_program_clone(p, &s->prog));
  const char *k[1] = {keep};
  pe_pass_opts o = {
      .place_kind = PE_PLACE_CPU, .fuse_conv_act = true, .n_keep = keep ? 1 : 0, .keep = k};
  PE_CK_OK(pe_program_compile_opts(s->prog, false, &o));
  pe_conv_layout_set_mode(PE_CONV_LAYOUT_BLOCKED);
  eq_seq_start(s);
}

/* Ops of the main block with layout_blocked bits set, and of which types. */
static int blocked_ops(const pe_program *p, int *other) {
  const pe_block *b = p->blocks[p->main_block];
  int n = 0;
  *other = 0;
  for (int i = 0; i < b->n_ops; i++) {
    const pe_attr *a = pe_op_find_attr(b->ops[i], PE_LAYOUT_ATTR);
    if (!a || a->i == 0) continue;
    n++;
    *other += strcmp(b->ops[i]->type, "conv2d") && strcmp(b->ops[i]->type, "conv2d_grad") &&
              strcmp(b->ops[i]->type, "pool2d") && strcmp(b->ops[i]->type, "pool2d_grad");
  }
  return n;
}

/* Ops of the main block of type `type` with layout_blocked bits set. */
static int blocked_of_type(const pe_program *p, const char *type) {
  const pe_block *b = p->blocks[p->main_block];
  int n = 0;
  for (int i = 0; i < b->n_ops; i++) {
    const pe_attr *a = pe_op_find_attr(b->ops[i], PE_LAYOUT_ATTR);
    n += a && a->i != 0 && strcmp(b->ops[i]->type, type) == 0;
  }
  return n;
}

/* Trains `model` blocked and plain from the same start on the same
 * batches: losses and parameters within EQ_LOSS_RTOL / EQ_PARAM_RTOL. */
static void blocked_trains_as_plain(const char *model, const char *what,
                                    void (*check)(const pe_program *blocked)) {
  pe_model_spec spec;
  pe_program *p = eq_program(model, &spec);
  eq_data d;
  eq_data_init(&d, &spec);
  eq_seq blk, pln;
  seq_new_mode(p, PE_CONV_LAYOUT_BLOCKED, NULL, &blk);
  seq_new_mode(p, PE_CONV_LAYOUT_PLAIN, NULL, &pln);
  int other;
  check(blk.prog);
  ck_assert_int_eq(blocked_ops(pln.prog, &other), 0);
  double worst = 0;
  for (int step = 0; step < LAYOUT_STEPS; step++) {
    int n = eq_data_batch(&d, step);
    float lb = eq_seq_step(&blk, &spec, &d, n), lp = eq_seq_step(&pln, &spec, &d, n);
    double rel = fabs((double)lb - lp) / fmax(1.0, fabs((double)lp));
    ck_assert_msg(isfinite(lb) && rel <= EQ_LOSS_RTOL,
                  "step %d: loss %.7g blocked, %.7g plain (relative %.3g)", step, lb, lp, rel);
    if (rel > worst) worst = rel;
  }
  int params = 0;
  for (int i = 0; i < pln.scope->n; i++) {
    const pe_var *v = pln.scope->order[i];
    if (!v->persistable || !v->t.data || v->t.dtype != PE_F32) continue;
    const pe_var *w = pe_scope_find(blk.scope, v->name);
    ck_assert_msg(w, "%s missing on the blocked side", v->name);
    double r = eq_max_rel(&w->t, &v->t, v->name);
    ck_assert_msg(r <= EQ_PARAM_RTOL, "%s differs by %.3g after %d steps", v->name, r,
                  LAYOUT_STEPS);
    params++;
  }
  ck_assert_int_gt(params, 0);
  printf("%s blocked vs plain: largest loss difference %.3g (relative)\n", what, worst);
  eq_seq_free(&blk);
  eq_seq_free(&pln);
  eq_data_free(&d);
  pe_program_free(p);
  pe_model_spec_release(&spec);
}

static void cnn_marks(const pe_program *blk) {
  int other;
  /* conv1, pool1, conv2, pool2 and their four gradients */
  ck_assert_int_ge(blocked_ops(blk, &other), 8);
  ck_assert_int_eq(other, 0);
}

START_TEST(cnn_blocked_trains_as_plain) {
  blocked_trains_as_plain("cnn", "cnn", cnn_marks);
}
END_TEST

/* conf/models/resnet's pattern at 12x12 with two blocks. */
static const char RESNET[] =
    "name resnet_small\n"
    "input image 1 12 12\n"
    "label label\n"
    "conv2d 16 3 pad=1 no_bias\n"
    "batch_norm act=relu\n"
    "save in\n"
    "conv2d 16 3 pad=1 no_bias\n"
    "batch_norm act=relu\n"
    "conv2d 16 3 pad=1 no_bias\n"
    "batch_norm\n"
    "add in act=relu\n"
    "save in\n"
    "conv2d 32 3 stride=2 pad=1 no_bias\n"
    "batch_norm act=relu\n"
    "conv2d 32 3 pad=1 no_bias\n"
    "batch_norm\n"
    "save main\n"
    "from in\n"
    "conv2d 32 1 stride=2 no_bias\n"
    "batch_norm\n"
    "add main act=relu\n"
    "pool2d avg global\n"
    "fc 10\n"
    "loss softmax_with_cross_entropy\n"
    "accuracy\n"
    "optimizer momentum lr=0.05 mu=0.9\n";

static void resnet_marks(const pe_program *blk) {
  int other;
  int n = blocked_ops(blk, &other);
  printf("resnet_small: %d ops marked blocked, %d of them not conv2d or pool2d\n", n, other);
  ck_assert_int_gt(blocked_of_type(blk, "conv2d"), 0);
  ck_assert_int_gt(blocked_of_type(blk, "batch_norm"), 0);
  ck_assert_int_gt(blocked_of_type(blk, "batch_norm_grad"), 0);
  ck_assert_int_gt(blocked_of_type(blk, "elementwise_add"), 0);
  ck_assert_int_gt(blocked_of_type(blk, "elementwise_add_grad"), 0);
}

START_TEST(resnet_blocked_trains_as_plain) {
  blocked_trains_as_plain(RESNET, "resnet_small", resnet_marks);
}
END_TEST

/* The first conv2d's Output: blocked, so not fetchable; kept, plain and
 * equal to the plain program's. */
START_TEST(cnn_blocked_fetch_refused_unless_kept) {
  pe_model_spec spec;
  pe_program *p = eq_program("cnn", &spec);
  eq_data d;
  eq_data_init(&d, &spec);
  eq_seq blk;
  seq_new_mode(p, PE_CONV_LAYOUT_BLOCKED, NULL, &blk);
  const pe_block *b = blk.prog->blocks[blk.prog->main_block];
  const char *name = NULL;
  for (int i = 0; i < b->n_ops && !name; i++)
    if (!strcmp(b->ops[i]->type, "conv2d")) name = pe_op_find_output(b->ops[i], "Output")->args[0];
  ck_assert(name);
  /* The op writes name@BLOCKED; name is what the model calls it. */
  ck_assert_msg(strstr(name, "@BLOCKED"), "conv2d writes '%s'", name);
  char *var = strndup(name, (size_t)(strstr(name, "@BLOCKED") - name));
  int n = eq_data_batch(&d, 0);
  pe_tensor xt, yt;
  pe_feed feeds[2];
  eq_feeds(&spec, &d, n, &xt, &yt, feeds);
  const char *fetch = var;
  const pe_tensor *out;
  pe_status *st = pe_seq_exec_run(blk.step, feeds, 2, &fetch, 1, &out);
  ck_assert_msg(st && strstr(pe_status_msg(st), var) && strstr(pe_status_msg(st), "blocked"),
                "fetch of blocked '%s': %s", var, st ? pe_status_msg(st) : "no error");
  pe_status_free(st);
  eq_seq_free(&blk);

  eq_seq kept, pln;
  seq_new_mode(p, PE_CONV_LAYOUT_BLOCKED, var, &kept);
  seq_new_mode(p, PE_CONV_LAYOUT_PLAIN, NULL, &pln);
  const pe_tensor *ok, *op;
  PE_CK_OK(pe_seq_exec_run(kept.step, feeds, 2, &fetch, 1, &ok));
  PE_CK_OK(pe_seq_exec_run(pln.step, feeds, 2, &fetch, 1, &op));
  ck_assert_double_le(eq_max_rel(ok, op, var), EQ_PARAM_RTOL);
  eq_seq_free(&kept);
  eq_seq_free(&pln);
  free(var);
  eq_data_free(&d);
  pe_program_free(p);
  pe_model_spec_release(&spec);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("train_conv_layout");
  TCase *tc = tcase_create("layout");
  tcase_add_test(tc, cnn_blocked_trains_as_plain);
  tcase_add_test(tc, cnn_blocked_fetch_refused_unless_kept);
  tcase_add_test(tc, resnet_blocked_trains_as_plain);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
