/* The value of one sample of a Prometheus text page (the daemon's
 * GET /metrics): the line that starts with `series` (name and labels,
 * exactly as rendered) and a space. Fails the test when there is none. */
#ifndef PE_TESTS_METRICS_SAMPLE_H
#define PE_TESTS_METRICS_SAMPLE_H

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline double metrics_sample(const char *page, const char *series) {
  size_t n = strlen(series);
  for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
  ck_abort_msg("no sample %s in:\n%s", series, page);
  return NAN;
}

#endif
