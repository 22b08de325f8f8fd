/* main() for the GPU suites: skip (exit 77) unless at least `min_gpus`
 * GPUs are usable, else run the suite without forking (a CUDA context does
 * not survive fork, and counting devices already created one).
 *
 * The suites print every test's result (CK_VERBOSE), line-buffered: they
 * run only on a lent GPU machine, where the log is the record of what ran,
 * and a crash must not lose the lines before it.
 *
 * ASan: the CUDA driver maps memory where ASan keeps its shadow gap;
 * protect_shadow_gap=0 lets the sanitizer build run on a GPU. */
#ifndef PE_TESTS_CUDA_TEST_MAIN_H
#define PE_TESTS_CUDA_TEST_MAIN_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_ctx.h"

#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "protect_shadow_gap=0";
}
#endif

#define PE_CUDA_MAIN(suite_fn, min_gpus)                                                          \
  int main(void) {                                                                                \
    setvbuf(stdout, NULL, _IOLBF, 0);                                                             \
    pe_status *why = NULL;                                                                        \
    int n = pe_cuda_device_count(&why);                                                           \
    if (n < (min_gpus)) {                                                                         \
      printf("skip: %d usable GPU(s), this suite needs %d%s%s\n", n, (min_gpus), why ? ": " : "", \
             why ? why->msg : "");                                                                \
      pe_status_free(why);                                                                        \
      return 77;                                                                                  \
    }                                                                                             \
    SRunner *sr = srunner_create(suite_fn());                                                     \
    srunner_set_fork_status(sr, CK_NOFORK);                                                       \
    srunner_run_all(sr, CK_VERBOSE);                                                              \
    int failed = srunner_ntests_failed(sr);                                                       \
    srunner_free(sr);                                                                             \
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;                                                  \
  }

#endif
