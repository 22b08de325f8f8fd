/* A model's claimed dtypes and shapes (server/registry/model_shapes.h): the first
 * claim of a name holds; a misfit is refused naming the model, the variable
 * and both shapes (declaration and value wording); a check that refuses
 * claims nothing; -1 dims fit any size; concurrent conflicting claimers:
 * exactly one wins. */
#include <pthread.h>

#include "check_main.h"
#include "server/registry/model_shapes.h"
#include "test_assert.h"

static pe_var_info var(const char *name, pe_dtype dt, pe_shape s) {
  return (pe_var_info){(char *)name, dt, s};
}

START_TEST(test_first_claim_holds) {
  pe_shape_claims c;
  pe_shape_claims_init(&c);
  pe_var_info mlp[] = {var("fc_0.w", PE_F32, PE_SHAPE(784, 256)),
                       var("fc_0.b", PE_F32, PE_SHAPE(256))};
  PE_CK_OK(pe_shape_claims_check(&c, "mlp", mlp, 2, PE_FIT_DECL, true));
  PE_CK_OK(pe_shape_claims_check(&c, "mlp", mlp, 2, PE_FIT_DECL, true)); /* again: fits */
  pe_var_info wide[] = {var("fc_0.w", PE_F32, PE_SHAPE(784, 512))};
  expect_error(pe_shape_claims_check(&c, "mlp", wide, 1, PE_FIT_DECL, true), PE_ESHAPE,
               "model 'mlp': 'fc_0.w' has shape [784,256], the program declares [784,512]");
  expect_error(pe_shape_claims_check(&c, "mlp", wide, 1, PE_FIT_VALUE, true), PE_ESHAPE,
               "model 'mlp': 'fc_0.w' has shape [784,256], the value has [784,512]");
  pe_var_info f64[] = {var("fc_0.b", PE_F64, PE_SHAPE(256))};
  expect_error(pe_shape_claims_check(&c, "mlp", f64, 1, PE_FIT_VALUE, true), PE_EDTYPE,
               "model 'mlp': 'fc_0.b' is f32 [256], the value is f64 [256]");
  expect_error(pe_shape_claims_check(&c, "mlp", f64, 1, PE_FIT_DECL, true), PE_EDTYPE,
               "'fc_0.b' is f32 [256], the program declares f64 [256]");
  pe_shape_claims_destroy(&c);
}
END_TEST

/* A refused check claims none of its names, also those that fit; a check
 * without claim claims nothing. */
START_TEST(test_refused_claims_nothing) {
  pe_shape_claims c;
  pe_shape_claims_init(&c);
  pe_var_info have[] = {var("w", PE_F32, PE_SHAPE(2, 3))};
  PE_CK_OK(pe_shape_claims_check(&c, "m", have, 1, PE_FIT_DECL, true));
  pe_var_info mixed[] = {var("new", PE_F32, PE_SHAPE(4)), var("w", PE_F32, PE_SHAPE(3, 2))};
  expect_error(pe_shape_claims_check(&c, "m", mixed, 2, PE_FIT_DECL, true), PE_ESHAPE, "'w'");
  pe_var_info other[] = {var("new", PE_F32, PE_SHAPE(5))};
  PE_CK_OK(pe_shape_claims_check(&c, "m", other, 1, PE_FIT_DECL, false)); /* "new" unclaimed */
  pe_var_info again[] = {var("new", PE_F32, PE_SHAPE(6))};
  PE_CK_OK(pe_shape_claims_check(&c, "m", again, 1, PE_FIT_DECL, true)); /* still unclaimed */
  expect_error(pe_shape_claims_check(&c, "m", other, 1, PE_FIT_DECL, false), PE_ESHAPE,
               "'new' has shape [6], the program declares [5]");
  pe_shape_claims_destroy(&c);
}
END_TEST

START_TEST(test_unknown_dims_fit) {
  pe_shape_claims c;
  pe_shape_claims_init(&c);
  pe_var_info decl[] = {var("s", PE_F32, PE_SHAPE(-1, 8))};
  PE_CK_OK(pe_shape_claims_check(&c, "m", decl, 1, PE_FIT_DECL, true));
  pe_var_info value[] = {var("s", PE_F32, PE_SHAPE(32, 8))};
  PE_CK_OK(pe_shape_claims_check(&c, "m", value, 1, PE_FIT_VALUE, true));
  pe_var_info bad[] = {var("s", PE_F32, PE_SHAPE(32, 9))};
  expect_error(pe_shape_claims_check(&c, "m", bad, 1, PE_FIT_VALUE, true), PE_ESHAPE,
               "'s' has shape [-1,8], the value has [32,9]");
  pe_var_info rank[] = {var("s", PE_F32, PE_SHAPE(8))};
  expect_error(pe_shape_claims_check(&c, "m", rank, 1, PE_FIT_VALUE, true), PE_ESHAPE, "[8]");
  pe_shape_claims_destroy(&c);
}
END_TEST

typedef struct racer {
  pe_shape_claims *c;
  int64_t width;
  pe_status *st;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  pe_var_info v[] = {var("w", PE_F32, PE_SHAPE(784, r->width))};
  r->st = pe_shape_claims_check(r->c, "m", v, 1, PE_FIT_DECL, true);
  return NULL;
}

/* Two claimers of one name with other shapes, at once: one wins, the other
 * is refused (check and claim are one hold of the lock). */
START_TEST(test_concurrent_claims_one_wins) {
  for (int round = 0; round < 200; round++) {
    pe_shape_claims c;
    pe_shape_claims_init(&c);
    racer a = {&c, 256, NULL}, b = {&c, 512, NULL};
    pthread_t ta, tb;
    ck_assert_int_eq(pthread_create(&ta, NULL, race, &a), 0);
    ck_assert_int_eq(pthread_create(&tb, NULL, race, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_msg((a.st == NULL) != (b.st == NULL), "round %d: %s / %s", round, pe_status_msg(a.st),
                  pe_status_msg(b.st));
    pe_status *lost = a.st ? a.st : b.st;
    ck_assert_int_eq(pe_status_code(lost), PE_ESHAPE);
    pe_status_free(lost);
    pe_shape_claims_destroy(&c);
  }
}
END_TEST

/* The bytes the claims describe (memory_per_client counts a program's
 * persistables with them): claimed names once, items not claimed yet
 * added (and reported apart), -1 dims unknown (0), huge dims saturate. */
START_TEST(test_claimed_bytes) {
  pe_shape_claims c;
  pe_shape_claims_init(&c);
  int64_t added = -1;
  ck_assert_int_eq(pe_shape_claims_bytes(&c, NULL, 0, &added), 0);
  ck_assert_int_eq(added, 0);
  pe_var_info train[] = {var("w", PE_F32, PE_SHAPE(784, 256)),
                         var("w_moment", PE_F32, PE_SHAPE(784, 256)),
                         var("step", PE_I64, PE_SHAPE(1))};
  ck_assert_int_eq(pe_shape_claims_bytes(&c, train, 3, &added), 2 * 784 * 256 * 4 + 8);
  ck_assert_int_eq(added, 2 * 784 * 256 * 4 + 8);
  PE_CK_OK(pe_shape_claims_check(&c, "m", train, 3, PE_FIT_DECL, true));
  /* An eval program's parameters are claimed already: it adds nothing. */
  ck_assert_int_eq(pe_shape_claims_bytes(&c, train, 1, &added), 2 * 784 * 256 * 4 + 8);
  ck_assert_int_eq(added, 0);
  pe_var_info more[] = {var("w", PE_F32, PE_SHAPE(784, 256)), var("b", PE_F32, PE_SHAPE(256)),
                        var("any", PE_F32, PE_SHAPE(-1, 4))};
  ck_assert_int_eq(pe_shape_claims_bytes(&c, more, 3, &added), 2 * 784 * 256 * 4 + 8 + 1024);
  ck_assert_int_eq(added, 1024);
  pe_var_info huge[] = {var("h", PE_F64, PE_SHAPE((int64_t)1 << 40, (int64_t)1 << 40))};
  ck_assert_int_eq(pe_var_info_bytes(&huge[0]), INT64_MAX);
  ck_assert_int_eq(pe_shape_claims_bytes(&c, huge, 1, &added), INT64_MAX);
  ck_assert_int_eq(added, INT64_MAX);
  pe_shape_claims_destroy(&c);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("shape_claims");
  TCase *tc = tcase_create("claims");
  tcase_add_test(tc, test_first_claim_holds);
  tcase_add_test(tc, test_refused_claims_nothing);
  tcase_add_test(tc, test_unknown_dims_fit);
  tcase_add_test(tc, test_concurrent_claims_one_wins);
  tcase_add_test(tc, test_claimed_bytes);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
