/* Program builder, transformer layers: concat (several inputs in one slot),
 * split (several outputs), matmul, mse_loss and a transformer block
 * (embedding -> pre-LN block with a causal mask -> mse) decode and validate
 * in the daemon's IR with the declared shapes; bad arguments are refused
 * with messages naming the layer, the variables and their shapes. */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "compiler/validate.h"
#include "ir/program.h"
#include "ops/registry.h"
#include "pe_builder.h"
#include "test_assert.h"

/* Finish b, decode and validate; the caller frees the program. */
static pe_program *finish_valid(pe_builder *b) {
  uint8_t *bytes;
  size_t len;
  ck_assert_msg(pe_builder_finish(b, &bytes, &len) == 0, "%s", pe_builder_error(b));
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(bytes, len, &p));
  PE_CK_OK(pe_program_validate(p));
  free(bytes);
  return p;
}

static void expect_var(pe_block *blk, const char *name, pe_shape want) {
  pe_var_desc *v = pe_block_find_var_local(blk, name);
  ck_assert_msg(v != NULL, "no variable %s", name);
  expect_shape(&v->shape, want);
}

START_TEST(concat_split_matmul_mse) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4, 3));
  const char *y = pe_builder_data(b, "y", PE_B_F32, PE_B_SHAPE(-1, 4, 5));
  const char *parts[3];
  ck_assert_int_eq(pe_builder_split(b, y, 3, (const int64_t[]){1, 2, 2}, -1, parts), 0);
  const char *xs[] = {x, parts[0], parts[2]};
  const char *c = pe_builder_concat(b, 3, xs, 2);
  const char *w = pe_builder_data(b, "w", PE_B_F32, PE_B_SHAPE(2, 6));
  const char *m = pe_builder_matmul(b, c, w, false, true, NULL);
  const char *t = pe_builder_data(b, "t", PE_B_F32, PE_B_SHAPE(-1, 4, 2));
  const char *loss = pe_builder_mse_loss(b, m, t);
  ck_assert_msg(loss != NULL, "%s", pe_builder_error(b));
  pe_program *p = finish_valid(b);
  pe_block *main = pe_program_main(p);
  const char *types[] = {"split", "concat", "matmul_v2", "elementwise_sub", "square", "mean"};
  ck_assert_int_eq(main->n_ops, 6);
  for (int i = 0; i < 6; i++) ck_assert_str_eq(main->ops[i]->type, types[i]);
  /* one slot, several variables */
  ck_assert_int_eq(main->ops[0]->out[0].n, 3);
  ck_assert_int_eq(main->ops[1]->in[0].n, 3);
  ck_assert_str_eq(main->ops[1]->in[0].args[1], "split_0.out_0");
  expect_var(main, parts[1], PE_SHAPE(-1, 4, 2));
  expect_var(main, c, PE_SHAPE(-1, 4, 6));
  expect_var(main, m, PE_SHAPE(-1, 4, 2));
  expect_var(main, loss, PE_SHAPE(1));
  pe_program_free(p);
  pe_builder_free(b);
}
END_TEST

/* Ops of `type` in block blk. */
static int count_ops(const pe_block *blk, const char *type) {
  int n = 0;
  for (int i = 0; i < blk->n_ops; i++) n += strcmp(blk->ops[i]->type, type) == 0;
  return n;
}

/* A block over a fed [5, 5] mask, its attention fused or composed. */
static pe_program *transformer_program(bool composed) {
  pe_builder *b = pe_builder_new();
  ck_assert_int_eq(pe_builder_attention_composed(b, composed), 0);
  const char *ids = pe_builder_data(b, "ids", PE_B_I64, PE_B_SHAPE(-1, 5));
  const char *mask = pe_builder_data(b, "mask", PE_B_F32, PE_B_SHAPE(5, 5));
  const char *e = pe_builder_embedding(b, ids, 30, 8, -1, "emb");
  const char *blk = pe_builder_transformer_block(b, e, 2, 16, mask, NULL);
  const char *t = pe_builder_data(b, "t", PE_B_F32, PE_B_SHAPE(-1, 5, 8));
  const char *loss = pe_builder_mse_loss(b, blk, t);
  ck_assert_msg(loss != NULL, "%s", pe_builder_error(b));
  ck_assert_str_eq(blk, "transformer_0.res2.out");
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  ck_assert_int_eq(pe_builder_adam(b, 0.01f, 0.9f, 0.999f, 1e-8f), 0);
  pe_program *p = finish_valid(b);
  pe_builder_free(b);
  return p;
}

START_TEST(transformer_block_decodes_and_validates) {
  pe_program *p = transformer_program(false);
  pe_block *main = pe_program_main(p);
  ck_assert_int_eq(count_ops(main, "scaled_dot_product_attention"), 1);
  ck_assert_int_eq(count_ops(main, "matmul_v2"), 0);
  ck_assert_int_eq(count_ops(main, "transpose2"), 4);
  ck_assert_int_eq(count_ops(main, "layer_norm"), 2);
  ck_assert_int_eq(count_ops(main, "softmax"), 0);
  expect_var(main, "transformer_0.attn.probs", PE_SHAPE(-1, 2, 5, 5));
  expect_var(main, "transformer_0.attn.context", PE_SHAPE(-1, 2, 5, 4));
  expect_var(main, "transformer_0.attn.q_heads", PE_SHAPE(-1, 5, 2, 4));
  expect_var(main, "transformer_0.ffn1.w", PE_SHAPE(8, 16));
  expect_var(main, "transformer_0.res2.out", PE_SHAPE(-1, 5, 8));
  pe_program_free(p);
  /* the composition */
  p = transformer_program(true);
  main = pe_program_main(p);
  ck_assert_int_eq(count_ops(main, "scaled_dot_product_attention"), 0);
  ck_assert_int_eq(count_ops(main, "matmul_v2"), 2);
  ck_assert_int_eq(count_ops(main, "transpose2"), 4);
  ck_assert_int_eq(count_ops(main, "softmax"), 1);
  expect_var(main, "transformer_0.attn.scores.out", PE_SHAPE(-1, 2, 5, 5));
  pe_program_free(p);
}
END_TEST

/* pe_builder_causal_mask's mask becomes the fused op's causal flag (no
 * mask input); another mask stays an input. */
START_TEST(causal_mask_is_the_fused_flag) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 6, 8));
  const char *fed = pe_builder_data(b, "fed", PE_B_F32, PE_B_SHAPE(6, 6));
  const char *cm = pe_builder_causal_mask(b, 6, NULL);
  const char *a = pe_builder_multi_head_attention(b, x, 2, cm, NULL);
  const char *a2 = a ? pe_builder_multi_head_attention(b, a, 2, fed, NULL) : NULL;
  const char *loss = a2 ? pe_builder_mean(b, a2) : NULL;
  ck_assert_msg(loss != NULL, "%s", pe_builder_error(b));
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  pe_program *p = finish_valid(b);
  pe_block *main = pe_program_main(p);
  int seen = 0;
  for (int i = 0; i < main->n_ops; i++) {
    const pe_op_desc *op = main->ops[i];
    if (strcmp(op->type, "scaled_dot_product_attention")) continue;
    const pe_op_def *d = pe_op_lookup(op->type);
    bool has_mask = pe_op_find_input(op, "Mask") != NULL;
    ck_assert_int_eq(pe_attr_b(d, op, "causal"), seen == 0);
    ck_assert_int_eq(has_mask, seen == 1);
    seen++;
  }
  ck_assert_int_eq(seen, 2);
  pe_program_free(p);
  pe_builder_free(b);
}
END_TEST

/* A layer call that must fail: its error holds each of the strings. */
#define EXPECT_REFUSED(b, call, ...)                                                       \
  do {                                                                                     \
    ck_assert_msg(!(call), "expected %s to fail", #call);                                  \
    const char *want_[] = {__VA_ARGS__};                                                   \
    for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)                         \
      ck_assert_msg(strstr(pe_builder_error(b), want_[i_]), "'%s' not in '%s'", want_[i_], \
                    pe_builder_error(b));                                                  \
  } while (0)

START_TEST(bad_arguments_are_refused) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4, 3));
  const char *y = pe_builder_data(b, "y", PE_B_F32, PE_B_SHAPE(-1, 5, 3));
  EXPECT_REFUSED(b, pe_builder_concat(b, 2, (const char *[]){x, y}, 2),
                 "concat 'concat_0': 'y' [-1,5,3] does not fit 'x' [-1,4,3]");
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4, 3));
  const char *outs[2];
  ck_assert_int_eq(pe_builder_split(b, x, 2, NULL, 1, outs), 0);
  ck_assert_int_eq(pe_builder_split(b, x, 2, NULL, 2, outs), -1);
  ck_assert_ptr_nonnull(
      strstr(pe_builder_error(b), "split 'split_1': 'x' [-1,4,3] dim 2 (3) does not split"));
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4, 3));
  y = pe_builder_data(b, "y", PE_B_F32, PE_B_SHAPE(4, 3));
  EXPECT_REFUSED(b, pe_builder_matmul(b, x, y, false, false, NULL),
                 "matmul 'matmul_0': 'x' [-1,4,3] and 'y' [4,3] (trans_x 0, trans_y 0)",
                 "contraction dims 3 and 4");
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4, 6));
  const char *mask = pe_builder_data(b, "mask", PE_B_F32, PE_B_SHAPE(3, 4));
  EXPECT_REFUSED(b, pe_builder_multi_head_attention(b, x, 4, NULL, NULL),
                 "attention 'attention_0': input 'x' [-1,4,6]", "num_heads 4");
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4, 6));
  mask = pe_builder_data(b, "mask", PE_B_F32, PE_B_SHAPE(3, 4));
  EXPECT_REFUSED(b, pe_builder_multi_head_attention(b, x, 2, mask, NULL),
                 "mask 'mask' [3,4] must be f32 and broadcast to the scores [-1,2,4,4]");
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  y = pe_builder_data(b, "y", PE_B_F32, PE_B_SHAPE(-1, 3));
  EXPECT_REFUSED(b, pe_builder_mse_loss(b, x, y),
                 "mse_loss 'mse_loss_0': prediction 'x' [-1,4] and label 'y' [-1,3]");
  pe_builder_free(b);
}
END_TEST

static Suite *builder_transformer_suite(void) {
  Suite *s = suite_create("builder_transformer");
  TCase *tc = tcase_create("layers");
  tcase_add_test(tc, concat_split_matmul_mse);
  tcase_add_test(tc, transformer_block_decodes_and_validates);
  tcase_add_test(tc, causal_mask_is_the_fused_flag);
  tcase_add_test(tc, bad_arguments_are_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(builder_transformer_suite)
