/* Every test binary links this object (tests/CMakeLists.txt): before main,
 * it turns off Check's per-test timeout (4 s unless a test sets its own),
 * so that a test's only time limit is ctest's TIMEOUT, sized for the
 * sanitizer builds on a loaded 2-core machine. A value already in the
 * environment is kept, to allow a hang to be caught sooner by hand.
 * Check reads CK_DEFAULT_TIMEOUT when a test case is created; 0 means
 * no timer. */
#include <stdlib.h>

__attribute__((constructor)) static void check_no_timeout(void) {
  setenv("CK_DEFAULT_TIMEOUT", "0", 0);
}
