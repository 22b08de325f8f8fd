/* Program builder, sequence-model layers: embedding -> layer_norm -> gelu
 * -> transpose -> slice -> mean decodes and validates in the daemon's IR
 * with the declared shapes, an embedding's is_sparse option reaches its
 * lookup_table_v2 op, and bad arguments are refused with messages naming
 * the layer, the variable and its shape. */
#include <check.h>
#include <string.h>

#include "builder_util.h"
#include "check_main.h"
#include "compiler/validate.h"
#include "ir/program.h"
#include "pe_builder.h"
#include "test_assert.h"

START_TEST(layers_decode_and_validate) {
  pe_builder *b = pe_builder_new();
  const char *ids = pe_builder_data(b, "ids", PE_B_I64, PE_B_SHAPE(-1, 6));
  const char *e = pe_builder_embedding(b, ids, 50, 8, 0, "emb");
  const char *n = pe_builder_layer_norm(b, e, 2, 0, NULL);
  const char *g = pe_builder_gelu(b, n, true);
  const char *t = pe_builder_transpose(b, g, 3, (const int64_t[]){0, 2, 1});
  const char *s =
      pe_builder_slice(b, t, 1, (const int64_t[]){2}, (const int64_t[]){1}, (const int64_t[]){-1});
  const char *m = pe_builder_mean(b, s);
  ck_assert_msg(m != NULL, "%s", pe_builder_error(b));
  uint8_t *bytes;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(bytes, len, &p));
  PE_CK_OK(pe_program_validate(p));
  pe_block *main = pe_program_main(p);
  const char *types[] = {"lookup_table_v2", "layer_norm", "gelu", "transpose2", "slice", "mean"};
  ck_assert_int_eq(main->n_ops, 6);
  for (int i = 0; i < 6; i++) ck_assert_str_eq(main->ops[i]->type, types[i]);
  pe_var_desc *v = pe_block_find_var_local(main, s);
  ck_assert(v && v->shape.ndim == 3 && v->shape.d[0] == -1 && v->shape.d[1] == 8 &&
            v->shape.d[2] == 4);
  v = pe_block_find_var_local(main, "emb.w");
  ck_assert(v && v->persistable && v->shape.d[0] == 50 && v->shape.d[1] == 8);
  pe_program_free(p);
  free(bytes);
  pe_builder_free(b);
}
END_TEST

/* is_sparse reaches the op as a true BOOL attribute; left out (and
 * through pe_builder_embedding) the op has none, the daemon's default
 * (dense). */
START_TEST(embedding_is_sparse_reaches_the_op) {
  for (int sparse = 0; sparse < 3; sparse++) {
    pe_builder *b = pe_builder_new();
    const char *ids = pe_builder_data(b, "ids", PE_B_I64, PE_B_SHAPE(-1, 6));
    pe_b_embedding_opts o = {.name = "emb", .is_sparse = sparse == 1};
    const char *e = sparse == 2 ? pe_builder_embedding(b, ids, 50, 8, 3, "emb")
                                : pe_builder_embedding_ex(b, ids, 50, 8, 3, &o);
    ck_assert_msg(e != NULL, "%s", pe_builder_error(b));
    ck_assert_str_eq(e, "emb.out");
    pe_program *p = tb_finish(b);
    PE_CK_OK(pe_program_validate(p));
    const pe_op_desc *op = pe_program_main(p)->ops[0];
    ck_assert_str_eq(op->type, "lookup_table_v2");
    const pe_attr *a = pe_op_find_attr(op, "is_sparse");
    if (sparse == 1) {
      ck_assert_ptr_nonnull(a);
      ck_assert_int_eq(a->type, PE_ATTR_BOOL);
      ck_assert_int_eq(a->i, 1);
    } else {
      ck_assert_ptr_null(a);
    }
    a = pe_op_find_attr(op, "padding_idx");
    ck_assert(a && a->i == 3);
    pe_program_free(p);
  }
  /* NULL options: the defaults, named "embedding_<k>". */
  pe_builder *b = pe_builder_new();
  const char *ids = pe_builder_data(b, "ids", PE_B_I64, PE_B_SHAPE(-1, 6));
  ck_assert_str_eq(pe_builder_embedding_ex(b, ids, 50, 8, -1, NULL), "embedding_0.out");
  pe_builder_free(b);
}
END_TEST

START_TEST(bad_arguments_are_refused) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 6));
  ck_assert_ptr_null(pe_builder_embedding(b, x, 10, 4, -1, NULL));
  ck_assert_ptr_nonnull(strstr(pe_builder_error(b), "ids 'x' [-1,6] must be i64"));
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 6));
  ck_assert_ptr_null(pe_builder_transpose(b, x, 2, (const int64_t[]){1, 1}));
  ck_assert_ptr_nonnull(
      strstr(pe_builder_error(b), "perm is not a permutation of the 2 dims of 'x' [-1,6]"));
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 6));
  ck_assert_ptr_null(pe_builder_layer_norm(b, x, 2, 0, NULL));
  ck_assert_ptr_nonnull(strstr(pe_builder_error(b), "begin_norm_axis 2"));
  pe_builder_free(b);
}
END_TEST

static Suite *builder_sequence_suite(void) {
  Suite *s = suite_create("builder_sequence");
  TCase *tc = tcase_create("layers");
  tcase_add_test(tc, layers_decode_and_validate);
  tcase_add_test(tc, embedding_is_sparse_reaches_the_op);
  tcase_add_test(tc, bad_arguments_are_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(builder_sequence_suite)
