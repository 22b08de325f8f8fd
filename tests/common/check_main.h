/* A main() for Check suites: PE_CHECK_MAIN(suite_fn) runs the suite in
 * CK_FORK mode and exits non-zero on any failure. */
#ifndef PE_TESTS_CHECK_MAIN_H
#define PE_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

#define PE_CHECK_MAIN(suite_fn)                         \
  int main(void) {                                      \
    SRunner *sr = srunner_create(suite_fn());           \
    srunner_run_all(sr, CK_NORMAL);                     \
    int failed = srunner_ntests_failed(sr);             \
    srunner_free(sr);                                   \
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;        \
  }

#endif
