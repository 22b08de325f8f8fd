/* Program builder at scale: a 100,002-op program (a chain of 33,333 fc
 * layers) builds, serialises, decodes and validates. A builder that looks
 * every layer input up by a scan of all variables is quadratic and takes
 * minutes at this size (measured: 12k ops 2.3 s, 48k 55 s, 100k 326 s);
 * a linear one takes about a second, a few under the sanitizers. The test
 * bounds the build at MAX_BUILD_S, far above the linear time on a loaded
 * machine and far below the quadratic one. */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "builder_util.h"
#include "check_main.h"
#include "compiler/validate.h"
#include "test_assert.h"

enum { LAYERS = 33333 }; /* fc: mul, elementwise_add, relu: 3 ops a layer */
enum { MAX_BUILD_S = 120 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

START_TEST(deep_chain_of_100k_ops_builds_in_linear_time) {
  double t0 = now_s();
  pe_builder *b = pe_builder_new();
  const char *h = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
  for (int i = 0; i < LAYERS; i++)
    h = pe_builder_fc(b, h, 4, &(pe_b_fc_opts){.act = PE_B_ACT_RELU});
  ck_assert_msg(h, "%s", pe_builder_error(b));
  char last[64];
  snprintf(last, sizeof last, "fc_%d.out", LAYERS - 1);
  ck_assert_str_eq(h, last);
  const char *loss = pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, h, y, NULL));
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  ck_assert_int_eq(pe_builder_sgd(b, 0.1f), 0);
  pe_program *p = tb_finish(b);
  pe_block *main = pe_program_main(p);
  ck_assert_int_eq(main->n_ops, 3 * LAYERS + 2);
  ck_assert_int_eq(pe_program_startup(p)->n_ops, 2 * LAYERS); /* weight and bias each */
  ck_assert_str_eq(main->ops[main->n_ops - 1]->type, "mean");
  PE_CK_OK(pe_program_validate(p));
  pe_program_free(p);
  double took = now_s() - t0;
  ck_assert_msg(took < MAX_BUILD_S, "100k ops took %.1f s to build and validate (bound %d s)", took,
                MAX_BUILD_S);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("builder_large");
  TCase *tc = tcase_create("scale");
  tcase_add_test(tc, deep_chain_of_100k_ops_builds_in_linear_time);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
