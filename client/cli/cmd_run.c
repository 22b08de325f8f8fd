/* Commands that run one request on a batch of Fashion-MNIST: run (print the
 * fetched tensors) and trace (write the run's Chrome trace to a file).
 * Both register the model's training program (idempotent: same handle) and
 * initialise its parameters when they do not exist yet. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "pe_dataset.h"

typedef struct run_cfg {
  const char *model, *name, *places, *fetch, *out, *data;
  long batch, steps, seed;
  bool eval;
  cli_graph_opts graph;
} run_cfg;

#define RUN_OPTS                                                                                   \
  {"model", CLI_STR, offsetof(run_cfg, model), 0, 0, "mlp | cnn | FILE (required)"},               \
      {"model-name", CLI_STR, offsetof(run_cfg, name), 0, 0, "parameter namespace"},               \
      {"places", CLI_STR, offsetof(run_cfg, places), 0, 0, "cpu:N, sim:N, cuda:0 (daemon's)"},     \
      {"batch", CLI_INT, offsetof(run_cfg, batch), 1, 1 << 16, "batch size (model default)"},      \
      {"steps", CLI_INT, offsetof(run_cfg, steps), 1, 1 << 20, "steps on the same batch (1)"},     \
      {"seed", CLI_INT, offsetof(run_cfg, seed), 0, 1L << 62, "initialisation seed (1)"},          \
      {"eval", CLI_FLAG, offsetof(run_cfg, eval), 0, 0, "run the evaluation program"},             \
      {"data", CLI_STR, offsetof(run_cfg, data), 0, 0, "Fashion-MNIST directory"},                 \
      {"fetch", CLI_STR, offsetof(run_cfg, fetch), 0, 0, "comma-separated names (loss,accuracy)"}, \
      CLI_GRAPH_OPTS(run_cfg, graph)

static const cli_opt run_opts[] = {RUN_OPTS};
static const cli_opt trace_opts[] = {
    RUN_OPTS, {"out", CLI_STR, offsetof(run_cfg, out), 0, 0, "trace file (pe-trace.json)"}};

#define MAX_FETCH 16

static void print_tensor(const pe_client_tensor *t) {
  printf("%s %s [", t->name, pe_client_dtype_name(t->dtype));
  for (int d = 0; d < t->ndim; d++) printf("%s%lld", d ? "," : "", (long long)t->shape[d]);
  printf("]:");
  int64_t n = pe_client_tensor_numel(t), show = n < 8 ? n : 8;
  for (int64_t i = 0; i < show; i++) {
    if (t->dtype == PE_B_F32) printf(" %.6g", ((const float *)t->data)[i]);
    if (t->dtype == PE_B_F64) printf(" %.9g", ((const double *)t->data)[i]);
    if (t->dtype == PE_B_I64) printf(" %lld", (long long)((const int64_t *)t->data)[i]);
    if (t->dtype == PE_B_I32) printf(" %d", ((const int32_t *)t->data)[i]);
    if (t->dtype == PE_B_U8) printf(" %u", ((const uint8_t *)t->data)[i]);
  }
  printf("%s\n", show < n ? " ..." : "");
}

/* The first scalar of t as a double (JSON output). */
static double first_value(const pe_client_tensor *t) {
  if (pe_client_tensor_numel(t) < 1) return 0;
  switch (t->dtype) {
    case PE_B_F32: return ((const float *)t->data)[0];
    case PE_B_F64: return ((const double *)t->data)[0];
    case PE_B_I32: return ((const int32_t *)t->data)[0];
    case PE_B_I64: return (double)((const int64_t *)t->data)[0];
    case PE_B_U8: return ((const uint8_t *)t->data)[0];
  }
  return 0;
}

static int run_or_trace(cli_ctx *ctx, int argc, char **argv, bool trace) {
  run_cfg cfg = {.seed = 1, .steps = 1, .out = "pe-trace.json"};
  bool help;
  int rc = trace ? cli_parse(ctx, trace_opts, sizeof trace_opts / sizeof trace_opts[0], argc, argv,
                             &cfg, &help)
                 : cli_parse(ctx, run_opts, sizeof run_opts / sizeof run_opts[0], argc, argv, &cfg,
                             &help);
  if (rc || help) return rc;
  if (!cfg.model) {
    fprintf(stderr, "pe-client %s: --model is required (%s | FILE)\n", ctx->cmd,
            pe_model_spec_names());
    return CLI_USAGE;
  }
  pe_model_spec m;
  if (cli_model_load(ctx, cfg.model, &m)) return CLI_FAIL;
  if (!cfg.batch) cfg.batch = m.default_batch;
  /* fetch names: copies, split at commas */
  char fetch_buf[1024];
  const char *fetch[MAX_FETCH];
  size_t n_fetch = 0;
  if (cfg.fetch) {
    snprintf(fetch_buf, sizeof fetch_buf, "%s", cfg.fetch);
    for (char *save = NULL, *t = strtok_r(fetch_buf, ",", &save); t && n_fetch < MAX_FETCH;
         t = strtok_r(NULL, ",", &save))
      fetch[n_fetch++] = t;
  } else {
    fetch[n_fetch++] = m.loss;
    fetch[n_fetch++] = m.accuracy;
  }
  pe_dataset *ds = NULL;
  float *x = NULL;
  int64_t *y = NULL;
  pe_client *c = NULL;
  if ((rc = cli_data_load(ctx, &m, cfg.data, cfg.batch, &ds, NULL))) goto out;
  int n = (int)ds->n; /* the first `batch` training examples */
  x = ds->images;
  y = ds->labels;
  if (!(c = cli_connect(ctx, &rc))) goto out;
  cli_reg r = {.ns = cfg.name ? cfg.name : m.name,
               .places = cfg.places,
               .seed = cfg.seed,
               .for_test = cfg.eval,
               .graph = &cfg.graph};
  pe_client_program prog;
  if ((rc = cli_register(ctx, c, &m, &r, &prog))) goto out;
  int code = pe_client_init(c, prog.handle, false, NULL);
  pe_client_tensor feeds[2];
  cli_batch_feeds(&m, n, x, y, feeds);
  pe_client_run_opts ro = {.steps = (uint32_t)cfg.steps, .trace = trace};
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
    FILE *f = fopen(cfg.out, "wb");
    if (!f || fwrite(res.trace_json, 1, res.trace_len, f) != res.trace_len || fclose(f)) {
      rc = cli_error(ctx, "cannot write %s", cfg.out);
      goto out;
    }
  }
  if (ctx->json) {
    printf("{\"cmd\":\"%s\",\"model\":", ctx->cmd);
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
      printf(":%.9g", first_value(&res.fetched[i]));
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
    {"run", "--model M [--batch N] [--steps K] [--fetch A,B]", "run on one batch, print fetches",
     cmd_run},
    {"trace", "--model M [--out FILE]", "run one step traced, write the Chrome trace", cmd_trace},
    {NULL, NULL, NULL, NULL},
};
