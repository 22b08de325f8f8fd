/* pe-bench rtt: the round trip of a tiny program's run through the daemon,
 * from C (libpeclient), to set beside the same loop in Python
 * (bench/python_rtt.py). The program is relu then mean of a [1, 4] feed,
 * registered for evaluation, so a run is one request, one small op chain
 * and one fetch: what is left is the client, the socket and the daemon's
 * request path. Each run is timed on its own; the line gives the median,
 * the mean and the 99th percentile in microseconds. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "pe_builder.h"
#include "pe_client.h"

void pe_bench_rtt_usage(FILE *f) {
  fprintf(f,
          "usage: pe-bench rtt [--socket ADDR] [--count N] [--json]\n\n"
          "  --socket ADDR  the daemon ($PE_SOCKET, else the default)\n"
          "  --count N      timed runs (2000), after 100 untimed ones\n"
          "  --json         print one JSON line on stdout\n");
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int usage_error(const char *what, const char *arg) {
  pe_bench_error("USAGE", "%s '%s'", what, arg);
  fputc('\n', stderr);
  pe_bench_rtt_usage(stderr);
  return 2;
}

/* relu(x) then its mean: bytes and length, or 1 with the builder's error. */
static int build_program(uint8_t **bytes, size_t *len, const char **fetch) {
  pe_builder *b = pe_builder_new();
  if (!b) return 1;
  static const int64_t dims[2] = {-1, 4};
  const char *x = pe_builder_data(b, "x", PE_B_F32, 2, dims);
  const char *m = x ? pe_builder_mean(b, pe_builder_relu(b, x)) : NULL;
  static char name[128];
  if (m) snprintf(name, sizeof name, "%s", m);
  int rc = m ? pe_builder_finish(b, bytes, len) : 1;
  if (rc) pe_bench_error("FAILED", "program: %s", pe_builder_error(b));
  pe_builder_free(b);
  *fetch = name;
  return rc;
}

static int timed_runs(pe_client *c, uint64_t handle, const char *fetch, long count, double *us) {
  static const float x[4] = {-1, 2, -3, 4};
  pe_client_tensor feed = {
      .name = "x", .dtype = PE_B_F32, .ndim = 2, .shape = {1, 4}, .data = x, .nbytes = sizeof x};
  for (long i = -100; i < count; i++) {
    pe_client_run_result r;
    double t0 = now_us();
    if (pe_client_run(c, handle, &feed, 1, &fetch, 1, NULL, &r)) {
      pe_bench_error("FAILED", "run: %s", pe_client_error(c));
      return 1;
    }
    if (i >= 0) us[i] = now_us() - t0;
  }
  return 0;
}

int pe_bench_rtt(int argc, char **argv) {
  const char *socket = NULL;
  long count = 2000;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      json = 1;
    } else if (!strcmp(argv[i], "--help")) {
      pe_bench_rtt_usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
      socket = argv[++i];
    } else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
      char *end;
      errno = 0;
      count = strtol(argv[++i], &end, 10);
      if (errno || *end || count < 1 || count > 10000000)
        return usage_error("--count: not a number in [1, 10000000]:", argv[i]);
    } else {
      return usage_error("unknown or incomplete option", argv[i]);
    }
  }
  uint8_t *bytes = NULL;
  size_t len = 0;
  const char *fetch;
  if (build_program(&bytes, &len, &fetch)) return 1;
  double *us = malloc(sizeof(double) * (size_t)count);
  pe_client *c = pe_client_new();
  pe_client_opts o = {.address = socket};
  pe_client_register_args a = {.program = bytes,
                               .program_len = len,
                               .model = "pe_bench_rtt",
                               .places = "cpu:1",
                               .for_test = true};
  pe_client_program p;
  int rc = 1;
  if (!us || !c) {
    pe_bench_error("FAILED", "out of memory");
  } else if (pe_client_connect(c, &o) || pe_client_register(c, &a, &p)) {
    pe_bench_error("FAILED", "%s", pe_client_error(c));
  } else if (!timed_runs(c, p.handle, fetch, count, us)) {
    double sum = 0;
    for (long i = 0; i < count; i++) sum += us[i];
    qsort(us, (size_t)count, sizeof *us, cmp_double);
    double med = us[count / 2], p99 = us[(long)((double)(count - 1) * 0.99)];
    if (json)
      printf(
          "{\"bench\":\"rtt\",\"ok\":true,\"client\":\"c\",\"count\":%ld,\"us_median\":%.1f,"
          "\"us_mean\":%.1f,\"us_p99\":%.1f}\n",
          count, med, sum / (double)count, p99);
    else
      printf("rtt (C): %ld runs: median %.1f us, mean %.1f, p99 %.1f\n", count, med,
             sum / (double)count, p99);
    pe_client_deregister(c, p.handle);
    rc = 0;
  }
  if (c) pe_client_close(c);
  pe_client_free(c);
  free(us);
  free(bytes);
  return rc;
}
