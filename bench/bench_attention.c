/* pe-bench attention: forward + backward of one multi-head attention
 * layer (pe_builder_multi_head_attention with the causal mask, as the
 * charlm's) built twice, with the fused scaled_dot_product_attention op
 * and with its composition (matmul_v2, scale, elementwise_add, softmax,
 * matmul_v2), trained in-process on the sequential executor. The steps of
 * the two alternate, so that a load on the host falls on both alike; the
 * line gives each one's median step time and composed / fused. The layer's
 * four fc projections are in both: the ratio is the layer's, as training
 * sees it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "compiler/pass.h"
#include "core/scope.h"
#include "engine/seq_executor.h"
#include "ir/program.h"
#include "pe_builder.h"

void pe_bench_attention_usage(FILE *f) {
  fprintf(f,
          "usage: pe-bench attention [--batch N] [--seq T] [--heads H] [--head-dim D]\n"
          "                          [--steps N] [--threads N] [--json]\n\n"
          "  --batch N     examples per step (32)\n"
          "  --seq T       sequence length (128)\n"
          "  --heads H     heads (4)\n"
          "  --head-dim D  dims per head (32); the model is H * D wide\n"
          "  --steps N     timed steps of each variant (20), after 3 untimed ones\n"
          "  --threads N   intra-op threads (0: all cores)\n"
          "  --json        print one JSON line on stdout\n");
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct variant {
  pe_program *prog;
  pe_scope *scope;
  pe_seq_exec *step;
  char loss[256];
  double *ms;
} variant;

/* x [-1, T, H*D] -> causal attention -> mean: the program's bytes. */
static int build(bool composed, long t, long h, long d, uint8_t **bytes, size_t *len, char *loss) {
  pe_builder *b = pe_builder_new();
  if (!b) return 1;
  const char *x = pe_builder_data(b, "x", PE_B_F32, 3, (const int64_t[]){-1, t, h * d});
  const char *m = pe_builder_causal_mask(b, t, NULL);
  const char *l = NULL;
  if (x && m && !pe_builder_attention_composed(b, composed)) {
    const char *a = pe_builder_multi_head_attention(b, x, (int)h, m, NULL);
    l = a ? pe_builder_mean(b, a) : NULL;
  }
  if (l) snprintf(loss, 256, "%s", l);
  int rc = l && !pe_builder_append_backward(b, l) && !pe_builder_sgd(b, 1e-4f)
               ? pe_builder_finish(b, bytes, len)
               : 1;
  if (rc) pe_bench_error("FAILED", "program: %s", pe_builder_error(b));
  pe_builder_free(b);
  return rc;
}

static int fail(pe_status *st, const char *what) {
  const char *code = pe_code_name(pe_status_code(st));
  pe_bench_error(code, "%s: %s", what, pe_status_msg(st));
  pe_status_free(st);
  return 1;
}

static int setup(variant *v, bool composed, long t, long h, long d, long threads) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (build(composed, t, h, d, &bytes, &len, v->loss)) return 1;
  pe_status *st = pe_program_decode(bytes, len, &v->prog);
  free(bytes);
  pe_pass_opts po = {0};
  if (!st) st = pe_program_compile_opts(v->prog, false, &po);
  if (st) return fail(st, "compile");
  if (!(v->scope = pe_scope_new(NULL))) return fail(pe_error(PE_ENOMEM, "scope"), "setup");
  pe_exec_opts eo = {.seed = 1, .threads = (int)threads};
  pe_seq_exec *init = NULL;
  st = pe_seq_exec_new(v->prog, v->prog->startup_block, v->scope, &eo, &init);
  if (!st) st = pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL);
  pe_seq_exec_free(init);
  if (!st) st = pe_seq_exec_new(v->prog, v->prog->main_block, v->scope, &eo, &v->step);
  return st ? fail(st, "executor") : 0;
}

static void teardown(variant *v) {
  pe_seq_exec_free(v->step);
  if (v->scope) pe_scope_free(v->scope);
  pe_program_free(v->prog);
  free(v->ms);
}

static int step(variant *v, const pe_tensor *x, double *ms, float *loss) {
  pe_feed feed = {"x", x};
  const char *fetch[1] = {v->loss};
  const pe_tensor *out[1];
  double t0 = now_ms();
  pe_status *st = pe_seq_exec_run(v->step, &feed, 1, fetch, 1, out);
  if (st) return fail(st, "step");
  *ms = now_ms() - t0;
  *loss = pe_f32(out[0])[0];
  return 0;
}

static int parse(int argc, char **argv, long *vals, const char *const *names, int n, int *json) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      *json = 1;
      continue;
    }
    int k = 0;
    while (k < n && strcmp(argv[i], names[k])) k++;
    char *end;
    errno = 0;
    long v = k < n && i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
    if (k == n || i + 1 >= argc || errno || *end || v < (k == n - 1 ? 0 : 1) || v > 100000) {
      pe_bench_error("USAGE", "bad option or value '%s'", argv[i]);
      fputc('\n', stderr);
      pe_bench_attention_usage(stderr);
      return 2;
    }
    vals[k] = v;
    i++;
  }
  return 0;
}

int pe_bench_attention(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      pe_bench_attention_usage(stdout);
      return 0;
    }
  static const char *const names[] = {"--batch",    "--seq",   "--heads",
                                      "--head-dim", "--steps", "--threads"};
  long o[6] = {32, 128, 4, 32, 20, 0};
  int json = 0;
  int rc = parse(argc, argv, o, names, 6, &json);
  if (rc) return rc;
  long batch = o[0], t = o[1], h = o[2], d = o[3], steps = o[4], threads = o[5];
  variant v[2] = {{0}, {0}}; /* fused, composed */
  pe_tensor x;
  pe_tensor_init(&x);
  pe_shape xs = PE_SHAPE(batch, t, h * d);
  pe_status *st = pe_tensor_resize(&x, PE_F32, &xs, "x");
  if (st) return fail(st, "input");
  for (int64_t i = 0; i < pe_tensor_numel(&x); i++)
    pe_f32(&x)[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  rc = setup(&v[0], false, t, h, d, threads) || setup(&v[1], true, t, h, d, threads);
  for (int k = 0; !rc && k < 2; k++)
    if (!(v[k].ms = calloc((size_t)steps, sizeof(double)))) rc = 1;
  float loss[2] = {0, 0};
  for (long s = -3; !rc && s < steps; s++)
    for (int k = 0; !rc && k < 2; k++) {
      double ms;
      rc = step(&v[k], &x, &ms, &loss[k]);
      if (!rc && s >= 0) v[k].ms[s] = ms;
    }
  if (!rc) {
    double med[2];
    for (int k = 0; k < 2; k++) {
      qsort(v[k].ms, (size_t)steps, sizeof(double), cmp_double);
      med[k] = v[k].ms[steps / 2];
    }
    if (json)
      printf(
          "{\"bench\":\"attention\",\"ok\":true,\"batch\":%ld,\"seq\":%ld,\"heads\":%ld,"
          "\"head_dim\":%ld,\"threads\":%ld,\"steps\":%ld,\"fused_ms\":%.3f,"
          "\"composed_ms\":%.3f,\"composed_over_fused\":%.3f,\"loss_fused\":%.6g,"
          "\"loss_composed\":%.6g}\n",
          batch, t, h, d, threads, steps, med[0], med[1], med[1] / med[0], loss[0], loss[1]);
    else
      printf(
          "attention B=%ld T=%ld H=%ld D=%ld: fused %.3f ms, composed %.3f ms per step "
          "(composed / fused %.3f)\n",
          batch, t, h, d, med[0], med[1], med[1] / med[0]);
  }
  for (int k = 0; k < 2; k++) teardown(&v[k]);
  pe_tensor_release(&x);
  return rc;
}
