/* core/fpenv: flush-to-zero and denormals-are-zero on the calling thread,
 * scoped save/restore, and inheritance by threads the caller creates. */
#include <check.h>
#include <float.h>
#include <pthread.h>
#include <stdio.h>

#include "core/fpenv.h"

/* Through volatiles so the compiler cannot fold the arithmetic at build
 * time (which would ignore the thread's control register). */
static float denormal_product(void) {
  volatile float a = 1e-30f, b = 1e-10f;
  return a * b; /* 1e-40: below FLT_MIN (1.18e-38), so denormal */
}

/* A denormal input scaled into the normal range: only DAZ (the input read
 * as zero) can make this 0; the result itself is normal, so FTZ alone
 * would not. */
static float scaled_denormal(void) {
  volatile float d = 1e-40f, big = 1e30f;
  return d * big; /* ~1e-10 without DAZ */
}

START_TEST(flush_zeroes_denormal_results) {
  ck_assert(pe_fpenv_flush_denormals(false));
  ck_assert(!pe_fpenv_denormals_flushed());
  float kept = denormal_product();
  ck_assert(kept > 0.0f && kept < FLT_MIN);

  ck_assert(pe_fpenv_flush_denormals(true));
  ck_assert(pe_fpenv_denormals_flushed());
  ck_assert(denormal_product() == 0.0f);
  /* Normal arithmetic is untouched. */
  volatile float x = 3.0f, y = 0.5f;
  ck_assert(x * y == 1.5f);
}
END_TEST

START_TEST(flush_reads_denormal_inputs_as_zero) {
  pe_fpenv_flush_denormals(false);
  float r = scaled_denormal();
  ck_assert_float_eq_tol(r, 1e-10f, 1e-12f);
  pe_fpenv_flush_denormals(true);
  ck_assert(scaled_denormal() == 0.0f);
}
END_TEST

START_TEST(save_restore_is_scoped) {
  /* Off outside, on inside, off again after restore. */
  pe_fpenv_flush_denormals(false);
  pe_fpenv_state outer = pe_fpenv_save();
  pe_fpenv_flush_denormals(true);
  ck_assert(denormal_product() == 0.0f);
  pe_fpenv_restore(outer);
  ck_assert(!pe_fpenv_denormals_flushed());
  ck_assert(denormal_product() > 0.0f);

  /* And the other way round: a scope that clears it restores "on". */
  pe_fpenv_flush_denormals(true);
  outer = pe_fpenv_save();
  pe_fpenv_flush_denormals(false);
  ck_assert(denormal_product() > 0.0f);
  pe_fpenv_restore(outer);
  ck_assert(pe_fpenv_denormals_flushed());
  ck_assert(denormal_product() == 0.0f);
}
END_TEST

typedef struct child_seen {
  bool flushed;
  float product;
} child_seen;

static void *child_main(void *p) {
  child_seen *seen = p;
  seen->flushed = pe_fpenv_denormals_flushed();
  seen->product = denormal_product();
  return NULL;
}

static child_seen run_child(void) {
  child_seen seen = {false, -1.0f};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, child_main, &seen), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  return seen;
}

/* The claim fpenv.h (and the pool workers' OpenMP teams) rely on: a thread
 * starts with its creator's setting, both ways. */
START_TEST(child_thread_inherits_setting) {
  pe_fpenv_flush_denormals(true);
  child_seen on = run_child();
  ck_assert(on.flushed);
  ck_assert(on.product == 0.0f);

  pe_fpenv_flush_denormals(false);
  child_seen off = run_child();
  ck_assert(!off.flushed);
  ck_assert(off.product > 0.0f);
}
END_TEST

static Suite *fpenv_suite(void) {
  Suite *s = suite_create("fpenv");
  TCase *tc = tcase_create("fpenv");
  tcase_add_test(tc, flush_zeroes_denormal_results);
  tcase_add_test(tc, flush_reads_denormal_inputs_as_zero);
  tcase_add_test(tc, save_restore_is_scoped);
  tcase_add_test(tc, child_thread_inherits_setting);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (!pe_fpenv_supported()) {
    printf("fpenv: denormal flushing is not supported on this architecture; skipped\n");
    return 77;
  }
  SRunner *sr = srunner_create(fpenv_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
