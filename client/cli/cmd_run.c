/* Commands that run one request on a batch: run (print the fetched
 * tensors) and trace (write the run's Chrome trace to a file). The batch is
 * the first examples of Fashion-MNIST, or with --data FILE the first rows
 * of the user's .npz, CSV or text file, read as train reads it
 * (data_load.c). Both register the model's training program (idempotent:
 * same handle) and initialise its parameters when they do not exist yet. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "out_path.h"
#include "pe_dataset.h"
#include "pe_feed_data.h"

typedef struct run_cfg {
  const char *model, *name, *places, *fetch, *out, *data, *label_column;
  long batch, steps, seed;
  bool eval, check_nan_inf;
  cli_graph_opts graph;
} run_cfg;

// clang-format off
#define RUN_OPTS                                                                                 \
  {"model", CLI_STR, offsetof(run_cfg, model), 0, 0, "mlp | cnn | FILE (required)"},             \
  {"model-name", CLI_STR, offsetof(run_cfg, name), 0, 0, "parameter namespace"},                 \
  {"places", CLI_STR, offsetof(run_cfg, places), 0, 0, "cpu:N, sim:N, cuda:0 (the model's, else the daemon's)"},       \
  {"batch", CLI_INT, offsetof(run_cfg, batch), 1, 1 << 16, "batch size (model default)"},        \
  {"steps", CLI_INT, offsetof(run_cfg, steps), 1, 1 << 20, "steps on the same batch (1)"},       \
  {"seed", CLI_INT, offsetof(run_cfg, seed), 0, 1L << 62, "initialisation seed (1)"},            \
  {"eval", CLI_FLAG, offsetof(run_cfg, eval), 0, 0, "run the evaluation program"},               \
  {"check-nan-inf", CLI_FLAG, offsetof(run_cfg, check_nan_inf), 0, 0,                            \
   "debug: fail at the first op that writes NaN/Inf, naming it (slower; cpu/sim)"},              \
  {"data", CLI_STR, offsetof(run_cfg, data), 0, 0,                                               \
   "Fashion-MNIST directory, or FILE.npz | FILE.csv | FILE.txt: the batch is its first rows"},   \
  {"label-column", CLI_STR, offsetof(run_cfg, label_column), 0, 0,                               \
   "the label column of --data FILE.csv (default: the last)"},                                   \
  {"fetch", CLI_STR, offsetof(run_cfg, fetch), 0, 0,                                             \
   "comma-separated variables; loss, accuracy, correct: the model's (loss,accuracy)"},           \
  CLI_GRAPH_OPTS(run_cfg, graph), CLI_KEEP_OPTS(run_cfg, graph)
// clang-format on

static const cli_opt run_opts[] = {RUN_OPTS};
static const cli_opt trace_opts[] = {
    RUN_OPTS, {"out", CLI_STR, offsetof(run_cfg, out), 0, 0, "trace file (pe-trace.json)"}};

#define MAX_FETCH 16

/* Element i of t as a double (the dtypes a fetch returns). */
static double value_at(const pe_client_tensor *t, int64_t i) {
  switch (t->dtype) {
    case PE_B_F32: return ((const float *)t->data)[i];
    case PE_B_F64: return ((const double *)t->data)[i];
    case PE_B_I32: return ((const int32_t *)t->data)[i];
    case PE_B_I64: return (double)((const int64_t *)t->data)[i];
    case PE_B_U8: return ((const uint8_t *)t->data)[i];
  }
  return 0;
}

/* Element i as text (f32 to 6 digits) or JSON (9 digits; NaN and the
 * infinities, which JSON lacks, as null). */
static void print_value(const pe_client_tensor *t, int64_t i, bool json) {
  double v = value_at(t, i);
  if (t->dtype != PE_B_F32 && t->dtype != PE_B_F64)
    printf("%.0f", v);
  else if (json)
    cli_json_num(stdout, "%.9g", v);
  else
    printf(t->dtype == PE_B_F64 ? "%.9g" : "%.6g", v);
}

static void print_shape(const pe_client_tensor *t) {
  for (int d = 0; d < t->ndim; d++) printf("%s%lld", d ? "," : "", (long long)t->shape[d]);
}

/* Text: the name, dtype, shape, the first 8 values and how many there are. */
static void print_tensor(const pe_client_tensor *t) {
  printf("%s %s [", t->name, pe_client_dtype_name(t->dtype));
  print_shape(t);
  printf("]:");
  int64_t n = pe_client_tensor_numel(t), show = n < 8 ? n : 8;
  for (int64_t i = 0; i < show; i++) {
    putchar(' ');
    print_value(t, i, false);
  }
  if (show < n) printf(" ... (%lld values; --json prints them all)", (long long)n);
  putchar('\n');
}

/* JSON: a one-element tensor (a loss, an accuracy) as its number; any
 * other as {"dtype":...,"shape":[...],"values":[every value, row-major]}. */
static void print_tensor_json(const pe_client_tensor *t) {
  int64_t n = pe_client_tensor_numel(t);
  if (n == 1) {
    print_value(t, 0, true);
    return;
  }
  printf("{\"dtype\":\"%s\",\"shape\":[", pe_client_dtype_name(t->dtype));
  print_shape(t);
  printf("],\"values\":[");
  for (int64_t i = 0; i < n; i++) {
    if (i) putchar(',');
    print_value(t, i, true);
  }
  printf("]}");
}

/* --fetch: names split at commas into fetch (buf holds them); loss,
 * accuracy and correct stand for the model's variables. */
static int parse_fetch(const cli_ctx *ctx, const pe_model_spec *m, const char *list, char *buf,
                       size_t len, const char **fetch, size_t *n_fetch) {
  *n_fetch = 0;
  if (!list) {
    fetch[(*n_fetch)++] = m->loss;
    fetch[(*n_fetch)++] = m->accuracy;
    return CLI_OK;
  }
  if (strlen(list) >= len) return cli_usage(ctx, "--fetch: longer than %zu bytes", len - 1);
  snprintf(buf, len, "%s", list);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (*n_fetch == MAX_FETCH) return cli_usage(ctx, "--fetch: more than %d names", MAX_FETCH);
    fetch[(*n_fetch)++] = !strcmp(t, "loss")       ? m->loss
                          : !strcmp(t, "accuracy") ? m->accuracy
                          : !strcmp(t, "correct")  ? m->correct
                                                   : t;
  }
  if (!*n_fetch) return cli_usage(ctx, "--fetch: no names in '%s'", list);
  return CLI_OK;
}

static int run_or_trace(cli_ctx *ctx, int argc, char **argv, bool trace) {
  run_cfg cfg = {.seed = 1, .steps = 1, .out = "pe-trace.json"};
  bool help;
  int rc = trace ? cli_parse(ctx, trace_opts, sizeof trace_opts / sizeof trace_opts[0], argc, argv,
                             &cfg, &help)
                 : cli_parse(ctx, run_opts, sizeof run_opts / sizeof run_opts[0], argc, argv, &cfg,
                             &help);
  if (help) fputs(cli_lasting_note, stdout);
  if (rc || help) return rc;
  if (!cfg.model) return cli_usage(ctx, "--model is required (%s | FILE)", pe_model_spec_names());
  /* The trace file is written after the step: a path that cannot be
   * written fails now, before the step changes the model. */
  char err[1024];
  if (trace && cli_out_path_check(cfg.out, err, sizeof err)) return cli_error(ctx, "--out %s", err);
  pe_model_spec m;
  if (cli_model_load(ctx, cfg.model, &m)) return CLI_FAIL;
  if (!cfg.batch) cfg.batch = m.default_batch;
  char fetch_buf[1024];
  const char *fetch[MAX_FETCH];
  size_t n_fetch = 0;
  if ((rc = parse_fetch(ctx, &m, cfg.fetch, fetch_buf, sizeof fetch_buf, fetch, &n_fetch))) {
    pe_model_spec_release(&m);
    return rc;
  }
  pe_dataset *ds = NULL;
  pe_feed_data *rows = NULL;
  pe_feed_decl xf, yf;
  pe_client *c = NULL;
  pe_client_tensor feeds[2];
  int n; /* the first `batch` examples */
  if (cli_data_is_file(cfg.data)) {
    if ((rc = cli_data_file_rows(ctx, &m, cfg.model, cfg.data, cfg.label_column, cfg.batch, &xf,
                                 &yf, &rows)))
      goto out;
    n = (int)rows->n;
    int64_t xs[PE_FEED_MAX_DIMS], ys[PE_FEED_MAX_DIMS];
    memcpy(xs, xf.dims, sizeof xs);
    memcpy(ys, yf.dims, sizeof ys);
    xs[0] = ys[0] = n;
    pe_client_tensor_set(&feeds[0], xf.name, (pe_b_dtype)xf.dtype, xf.ndim, xs, rows->x.data);
    pe_client_tensor_set(&feeds[1], yf.name, (pe_b_dtype)yf.dtype, yf.ndim, ys, rows->y.data);
  } else {
    if (cfg.label_column) {
      rc = cli_usage(ctx, "--label-column goes with --data FILE.csv");
      goto out;
    }
    if ((rc = cli_data_load(ctx, &m, cfg.data, cfg.batch, &ds, NULL))) goto out;
    n = (int)ds->n;
    cli_batch_feeds(&m, n, ds->images, ds->labels, feeds);
  }
  if (!(c = cli_connect_lasting(ctx, &rc))) goto out;
  cli_reg r = {.ns = cfg.name ? cfg.name : m.name,
               .places = cfg.places,
               .seed = cfg.seed,
               .for_test = cfg.eval,
               .graph = &cfg.graph};
  pe_client_program prog;
  if ((rc = cli_register(ctx, c, &m, &r, &prog))) goto out;
  int code = pe_client_init(c, prog.handle, false, NULL);
  pe_client_run_opts ro = {
      .steps = (uint32_t)cfg.steps, .trace = trace, .check_nan_inf = cfg.check_nan_inf};
  pe_client_run_result res;
  double t0 = cli_now();
  if (!code) code = pe_client_run(c, prog.handle, feeds, 2, fetch, n_fetch, &ro, &res);
  double wall_ms = (cli_now() - t0) * 1e3;
  if (code) {
    rc = cli_fail(ctx, c, code);
    goto out;
  }
  if (trace) {
    if (!res.trace_json) {
      rc = cli_error(ctx, "the daemon returned no trace for handle 0x%016llx",
                     (unsigned long long)prog.handle);
      goto out;
    }
    errno = 0;
    FILE *f = fopen(cfg.out, "wb");
    int e = f ? 0 : errno;
    if (f && fwrite(res.trace_json, 1, res.trace_len, f) != res.trace_len) e = errno ? errno : EIO;
    if (f && fclose(f) && !e) e = errno;
    if (e) {
      rc = cli_error(ctx, "cannot write %s: %s (the step ran)", cfg.out, strerror(e));
      goto out;
    }
  }
  if (ctx->json) {
    cli_json_begin(ctx);
    printf(",\"model\":");
    cli_json_str(stdout, r.ns);
    printf(",\"batch\":%d,\"steps\":%u,\"run_ms\":%.3f,\"queue_ms\":%.3f,\"wall_ms\":%.3f", n,
           res.steps, res.run_ms, res.queue_ms, wall_ms);
    if (trace) {
      printf(",\"trace_file\":");
      cli_json_str(stdout, cfg.out);
      printf(",\"trace_bytes\":%zu", res.trace_len);
    }
    printf(",\"fetched\":{");
    for (size_t i = 0; i < res.n_fetched; i++) {
      printf("%s", i ? "," : "");
      cli_json_str(stdout, res.fetched[i].name);
      putchar(':');
      print_tensor_json(&res.fetched[i]);
    }
    printf("}}\n");
  } else {
    for (size_t i = 0; i < res.n_fetched; i++) print_tensor(&res.fetched[i]);
    printf("%u step(s) on %d examples: run %.2f ms, queued %.2f ms, round trip %.2f ms\n",
           res.steps, n, res.run_ms, res.queue_ms, wall_ms);
    if (trace)
      printf("trace: %s (%zu bytes; open in chrome://tracing or Perfetto)\n", cfg.out,
             res.trace_len);
  }
out:
  pe_client_free(c);
  pe_dataset_free(ds);
  pe_feed_data_free(rows);
  pe_model_spec_release(&m);
  return rc;
}

static int cmd_run(cli_ctx *ctx, int argc, char **argv) {
  return run_or_trace(ctx, argc, argv, false);
}

static int cmd_trace(cli_ctx *ctx, int argc, char **argv) {
  return run_or_trace(ctx, argc, argv, true);
}

const cli_cmd cli_cmds_run[] = {
    {"run", "--model M [--data FILE] [--batch N] [--steps K] [--fetch A,B]",
     "run on one batch, print fetches", cmd_run},
    {"trace", "--model M [--out FILE]", "run one step traced, write the Chrome trace", cmd_trace},
    {NULL, NULL, NULL, NULL},
};
