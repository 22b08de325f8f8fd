/* pe_omp_policy_* (omp_policy.h): OMP_WAIT_POLICY=passive unless the user
 * chose, through one re-exec. */
#include "core/omp_policy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set in the environment of the re-executed image only, so that it knows the
 * policy is this program's choice (and never re-executes twice). */
#define MARK "PE_OMP_POLICY_DEFAULTED"

static enum { FROM_ENV, DEFAULTED, EXEC_FAILED } source = FROM_ENV;
static const char *prog_name = "pe";
static int exec_errno;

bool pe_omp_policy_init(const char *prog, char **argv) {
  prog_name = prog;
  if (getenv(MARK)) {
    unsetenv(MARK); /* not inherited by anything this process starts */
    source = DEFAULTED;
    return true;
  }
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return true;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv(MARK, "1", 1);
  execv("/proc/self/exe", argv);
  /* Still libgomp's default here: say so, and keep the environment true. */
  exec_errno = errno;
  unsetenv("OMP_WAIT_POLICY");
  unsetenv(MARK);
  source = EXEC_FAILED;
  return false;
}

const char *pe_omp_policy_value(void) {
  return getenv("OMP_WAIT_POLICY");
}

const char *pe_omp_policy_describe(char *buf, size_t n) {
  const char *pol = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
  switch (source) {
    case DEFAULTED:
      snprintf(buf, n,
               "OpenMP wait policy passive (%s's default; set OMP_WAIT_POLICY or GOMP_SPINCOUNT "
               "to choose another)",
               prog_name);
      break;
    case EXEC_FAILED:
      snprintf(buf, n,
               "OpenMP wait policy: libgomp's default (spinning): re-executing %s with "
               "OMP_WAIT_POLICY=passive failed: %s; set OMP_WAIT_POLICY=passive in its "
               "environment (kernels run several times slower on shared cores)",
               prog_name, strerror(exec_errno));
      break;
    default:
      snprintf(buf, n, "OpenMP wait policy from the environment: OMP_WAIT_POLICY=%s%s%s",
               pol ? pol : "(unset)", spin ? " GOMP_SPINCOUNT=" : "", spin ? spin : "");
      break;
  }
  return buf;
}
