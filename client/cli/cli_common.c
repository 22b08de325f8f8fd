/* Helpers shared by the command files: option tables, connecting, errors,
 * model resolution, JSON strings. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "interrupt.h"
#include "pe_dataset.h"
#include "pe_model_file.h"
#include "suggest.h"

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void cli_print_opts(FILE *f, const cli_ctx *ctx, const cli_opt *opts, size_t n_opts) {
  int width = 0; /* the longest name: one column for the help texts */
  for (size_t i = 0; i < n_opts; i++)
    if ((int)strlen(opts[i].name) > width) width = (int)strlen(opts[i].name);
  fprintf(f, "options of pe-client %s:\n", ctx->cmd);
  for (size_t i = 0; i < n_opts; i++)
    fprintf(f, "  --%-*s %-5s %s\n", width, opts[i].name,
            opts[i].kind == CLI_FLAG    ? ""
            : opts[i].kind == CLI_INT   ? "N"
            : opts[i].kind == CLI_FLOAT ? "X"
                                        : "VALUE",
            opts[i].help);
  fprintf(f, "global: --socket ADDR, --json, --timeout MS (anywhere on the line)\n");
}

/* The command's error, for the JSON failure line: the process runs one
 * command, and its first error is the one the line reports (what follows
 * it is a consequence). */
static struct {
  char msg[1024];
  const char *code;
} last_error;

static void report(const cli_ctx *ctx, const char *code, const char *fmt, va_list ap) {
  if (cli_interrupted()) return; /* a request refused because the process is ending */
  char msg[sizeof last_error.msg];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (ctx->cmd)
    fprintf(stderr, "pe-client %s: %s\n", ctx->cmd, msg);
  else
    fprintf(stderr, "pe-client: %s\n", msg);
  if (last_error.code) return;
  memcpy(last_error.msg, msg, sizeof msg);
  last_error.code = code;
}

int cli_error(const cli_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(ctx, "FAILED", fmt, ap);
  va_end(ap);
  return CLI_FAIL;
}

int cli_usage(const cli_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(ctx, "USAGE", fmt, ap);
  va_end(ap);
  return CLI_USAGE;
}

static void report_code(const cli_ctx *ctx, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report_code(const cli_ctx *ctx, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(ctx, code, fmt, ap);
  va_end(ap);
}

int cli_fail_at(const cli_ctx *ctx, pe_client *c, int code, const char *what) {
  /* libpeclient names the request ("run: ..."): not again when it is the
   * command's name ("pe-client run: run: ..."). */
  const char *msg = pe_client_error(c);
  size_t n = ctx->cmd ? strlen(ctx->cmd) : 0;
  if (n && !strncmp(msg, ctx->cmd, n) && msg[n] == ':' && msg[n + 1] == ' ') msg += n + 2;
  report_code(ctx, pe_client_code_name(code), "%s%s%s (%s)", what ? what : "", what ? ": " : "",
              msg, pe_client_code_name(code));
  bool away = code == PE_C_ETIMEDOUT || code == PE_C_ECONNECT || code == PE_C_ESHUTDOWN;
  return away ? CLI_UNREACHABLE : CLI_FAIL;
}

int cli_fail(const cli_ctx *ctx, pe_client *c, int code) {
  return cli_fail_at(ctx, c, code, NULL);
}

void cli_json_begin(const cli_ctx *ctx) {
  printf("{\"cmd\":");
  cli_json_str(stdout, ctx->cmd);
  printf(",\"ok\":true");
}

void cli_finish(const cli_ctx *ctx, int rc) {
  if (!ctx->json || rc == CLI_OK) return;
  /* A failure nothing reported (should not happen): still one line. */
  const char *msg = last_error.code ? last_error.msg : "failed";
  const char *code = last_error.code ? last_error.code : rc == CLI_USAGE ? "USAGE" : "FAILED";
  fflush(stdout);
  cli_json_failure(stdout, "cmd", ctx->cmd, msg, code);
}

static int usage_error(const cli_ctx *ctx, const cli_opt *opts, size_t n_opts, const char *fmt,
                       const char *a) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, a);
  cli_usage(ctx, "%s", msg);
  cli_print_opts(stderr, ctx, opts, n_opts);
  return CLI_USAGE;
}

/* "unknown option '--x'", with the closest option when one is close. */
static int unknown_option(const cli_ctx *ctx, const cli_opt *opts, size_t n_opts, const char *arg,
                          size_t nlen) {
  char typed[128];
  snprintf(typed, sizeof typed, "%.*s", (int)nlen, arg + 2);
  static const char *const globals[] = {"socket", "json", "timeout"};
  const size_t n_globals = sizeof globals / sizeof globals[0];
  const char *best = NULL;
  size_t best_d = 0;
  for (size_t k = 0; k < n_opts + n_globals; k++) {
    const char *name = k < n_opts ? opts[k].name : globals[k - n_opts];
    size_t d = cli_edit_distance(typed, name);
    if (cli_is_close(typed, name) && (!best || d < best_d)) best = name, best_d = d;
  }
  if (!best) return usage_error(ctx, opts, n_opts, "unknown option '%s'", arg);
  char fmt[256];
  snprintf(fmt, sizeof fmt, "unknown option '%%s' (did you mean '--%s'?)", best);
  return usage_error(ctx, opts, n_opts, fmt, arg);
}

int cli_parse(const cli_ctx *ctx, const cli_opt *opts, size_t n_opts, int argc, char **argv,
              void *cfg, bool *help) {
  *help = false;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      *help = true;
      cli_print_opts(stdout, ctx, opts, n_opts);
      return CLI_OK;
    }
    if (strncmp(arg, "--", 2) != 0)
      return usage_error(ctx, opts, n_opts, "unexpected argument '%s'", arg);
    const char *eq = strchr(arg + 2, '=');
    size_t nlen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    const cli_opt *o = NULL;
    for (size_t k = 0; k < n_opts; k++)
      if (strlen(opts[k].name) == nlen && !strncmp(opts[k].name, arg + 2, nlen)) o = &opts[k];
    if (!o) return unknown_option(ctx, opts, n_opts, arg, nlen);
    char *field = (char *)cfg + o->off;
    if (o->kind == CLI_FLAG) {
      if (eq) return usage_error(ctx, opts, n_opts, "option '%s' takes no value", arg);
      *(bool *)field = true;
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!val) return usage_error(ctx, opts, n_opts, "option '%s' needs a value", arg);
    if (o->kind == CLI_STR) {
      *(const char **)field = val;
      continue;
    }
    char *end;
    errno = 0;
    if (o->kind == CLI_FLOAT) {
      double x = strtod(val, &end);
      if (errno || end == val || *end || !(x >= (double)o->min && x <= (double)o->max)) {
        char msg[160];
        snprintf(msg, sizeof msg, "option '--%s': '%%s' is not a number in [%ld, %ld]", o->name,
                 o->min, o->max);
        return usage_error(ctx, opts, n_opts, msg, val);
      }
      *(double *)field = x;
      continue;
    }
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < o->min || v > o->max) {
      char msg[160];
      snprintf(msg, sizeof msg, "option '--%s': '%%s' is not a number in [%ld, %ld]", o->name,
               o->min, o->max);
      return usage_error(ctx, opts, n_opts, msg, val);
    }
    *(long *)field = v;
  }
  return CLI_OK;
}

pe_client *cli_connect(const cli_ctx *ctx, int *rc) {
  return cli_connect_with(ctx, (pe_client_opts){0}, rc);
}

pe_client *cli_connect_lasting(const cli_ctx *ctx, int *rc) {
  return cli_connect_with(ctx, (pe_client_opts){.outlive_process = true}, rc);
}

const char cli_lasting_note[] =
    "The program stays registered after this command exits, for later commands (save, load,\n"
    "run, eval of the model), until the daemon's session TTL (ttl, 600 s by default) passes\n"
    "with no further request of this command's session; so does a non-persistent model only\n"
    "it uses. pe-client deregister --handle H (H as register prints it; another command's\n"
    "program: with --force) frees it sooner.\n";

pe_client *cli_connect_with(const cli_ctx *ctx, pe_client_opts o, int *rc) {
  pe_client *c = pe_client_new();
  if (!c) {
    *rc = cli_error(ctx, "out of memory");
    return NULL;
  }
  o.address = ctx->socket;
  o.timeout_ms = (int)ctx->timeout_ms;
  int code = pe_client_connect(c, &o);
  if (code) {
    /* A socket address (or a $PE_ variable) that is not one: usage. */
    *rc = code == PE_C_EARG
              ? cli_usage(ctx, "%s (%s)", pe_client_error(c), pe_client_code_name(code))
              : cli_fail(ctx, c, code);
    pe_client_free(c);
    return NULL;
  }
  *rc = CLI_OK;
  return c;
}

void cli_end(const cli_ctx *ctx, pe_client *c, int rc) {
  enum { CLOSE_TIMEOUT_MS = 5000 };
  if (!c) return;
  if (rc != CLI_UNREACHABLE) {
    if (ctx->timeout_ms <= 0 || ctx->timeout_ms > CLOSE_TIMEOUT_MS)
      pe_client_set_timeout(c, CLOSE_TIMEOUT_MS);
    int code = pe_client_close(c);
    if (code)
      fprintf(stderr,
              "pe-client %s: warning: %s (%s); the daemon drops the session after its TTL\n",
              ctx->cmd, pe_client_error(c), pe_client_code_name(code));
  }
  pe_client_free(c);
}

int cli_model_load(const cli_ctx *ctx, const char *spec, pe_model_spec *out) {
  char err[1024];
  /* Every pe-client training program has the epoch count, so that a model
   * registered by one command (register --init, run) and trained by
   * another, or imported from an export, has one name set. */
  pe_model_opts o = {.counter = CLI_EPOCHS_DONE};
  if (pe_model_resolve_opts(spec, &o, out, err, sizeof err)) {
    cli_error(ctx, "%s", err);
    return -1;
  }
  return 0;
}

void cli_handle_str(uint64_t h, char buf[24]) {
  snprintf(buf, 24, "0x%016llx", (unsigned long long)h);
}

int cli_handle_parse(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *end || *s == '-') return -1;
  *out = v;
  return 0;
}

/* --strategy by name; the daemon checks the rest of the graph options. */
static int parse_strategy(const cli_ctx *ctx, const char *name, pe_client_strategy *out) {
  *out = PE_C_STRATEGY_AUTO;
  if (!name) return CLI_OK;
  for (pe_client_strategy s = PE_C_STRATEGY_AUTO; s <= PE_C_SHARDED; s++)
    if (!strcmp(name, pe_client_strategy_name(s))) {
      *out = s;
      return CLI_OK;
    }
  return cli_usage(ctx, "--strategy '%s' unknown (auto, allreduce, reduce, sharded)", name);
}

/* The names a trainer fetches, then --keep's (split at commas in buf). */
enum { KEEP_MAX = 35 };
static int keep_list(const cli_ctx *ctx, const pe_model_spec *m, const char *extra, char *buf,
                     size_t len, const char **keep, size_t *n) {
  /* a regression model has no accuracy nor correct count */
  const char *own[] = {m->loss, m->accuracy, m->correct};
  *n = 0;
  for (int i = 0; i < 3; i++)
    if (own[i][0]) keep[(*n)++] = own[i];
  size_t n_own = *n;
  if (!extra) return CLI_OK;
  if (strlen(extra) >= len) return cli_usage(ctx, "--keep: longer than %zu bytes", len - 1);
  snprintf(buf, len, "%s", extra);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (*n == KEEP_MAX) return cli_usage(ctx, "--keep: more than %d names", KEEP_MAX - 3);
    keep[(*n)++] = t;
  }
  return *n > n_own ? CLI_OK : cli_usage(ctx, "--keep: no names in '%s'", extra);
}

int cli_register(const cli_ctx *ctx, pe_client *c, const pe_model_spec *m, const cli_reg *r,
                 pe_client_program *out) {
  const cli_graph_opts none = {0}, *g = r->graph ? r->graph : &none;
  pe_client_strategy strategy;
  int rc = parse_strategy(ctx, g->strategy, &strategy);
  if (rc) return rc;
  pe_client_cuda_graph cuda_graph = PE_C_CUDA_GRAPH_DAEMON;
  if (g->cuda_graph) {
    static const char *const modes[] = {"auto", "on", "off"};
    for (int i = 0; i < 3; i++)
      if (!strcmp(g->cuda_graph, modes[i])) cuda_graph = (pe_client_cuda_graph)(i + 1);
    if (cuda_graph == PE_C_CUDA_GRAPH_DAEMON)
      return cli_usage(ctx, "--cuda-graph '%s' unknown (auto, on, off)", g->cuda_graph);
  }
  const char *keep[KEEP_MAX];
  char keep_buf[1024];
  size_t n_keep;
  if ((rc = keep_list(ctx, m, g->keep, keep_buf, sizeof keep_buf, keep, &n_keep))) return rc;
  pe_client_register_args a = {
      .program = m->bytes,
      .program_len = m->len,
      .model = r->ns,
      .places = r->places,
      .seed = (uint64_t)r->seed,
      .for_test = r->for_test,
      .persistent = r->persistent,
      .strategy = strategy,
      .sync = g->sync,
      .fuse_allreduce = g->fuse,
      .fuse_bucket_bytes = g->fuse_bucket,
      .keep = keep,
      .n_keep = n_keep,
      .no_op_fusion = g->no_op_fusion,
      .batch_hint = r->batch,
      .cuda_graph = cuda_graph,
      .job = r->job,
      .job_world = r->world,
      .job_rank = r->rank,
      .job_rendezvous = r->rendezvous,
      .job_token = r->job_token,
  };
  int code = pe_client_register(c, &a, out);
  return code ? cli_fail(ctx, c, code) : CLI_OK;
}

void cli_json_places_trial(FILE *f, const pe_client_places_trial *t) {
  fprintf(f, "{\"places\":");
  cli_json_str(f, t->places);
  fprintf(f, ",\"strategy\":");
  cli_json_str(f, pe_client_strategy_name(t->strategy));
  fprintf(f,
          ",\"fused\":%s,\"remembered\":%s,\"batch\":%lld,\"trial_seconds\":%.3f,"
          "\"candidates\":[",
          t->fused ? "true" : "false", t->remembered ? "true" : "false", (long long)t->batch,
          t->trial_s);
  for (size_t i = 0; i < t->n_candidates; i++) {
    const pe_client_places_candidate *c = &t->candidates[i];
    fprintf(f, "%s{\"places\":", i ? "," : "");
    cli_json_str(f, c->places);
    fprintf(f, ",\"strategy\":");
    cli_json_str(f, pe_client_strategy_name(c->strategy));
    fprintf(f, ",\"fused\":%s,\"step_ms\":", c->fused ? "true" : "false");
    cli_json_num(f, "%.4f", c->step_ms > 0 ? c->step_ms : NAN);
    if (c->error[0]) {
      fprintf(f, ",\"error\":");
      cli_json_str(f, c->error);
    }
    fputc('}', f);
  }
  fprintf(f, "]}");
}

void cli_print_places_trial(FILE *f, const pe_client_places_trial *t) {
  fprintf(f, "places: %s %s%s (%s, batch %lld):", t->places, pe_client_strategy_name(t->strategy),
          t->fused ? " fused" : "", t->remembered ? "remembered" : "timed", (long long)t->batch);
  for (size_t i = 0; i < t->n_candidates; i++) {
    const pe_client_places_candidate *c = &t->candidates[i];
    if (c->step_ms > 0)
      fprintf(f, " %s %s%s %.3f ms;", c->places, pe_client_strategy_name(c->strategy),
              c->fused ? " fused" : "", c->step_ms);
  }
  fputc('\n', f);
}

int cli_data_load(const cli_ctx *ctx, const pe_model_spec *m, const char *dir, long limit,
                  pe_dataset **train, pe_dataset **test) {
  char err[512];
  if (!dir) dir = pe_dataset_default_dir();
  *train = NULL;
  if (test) *test = NULL;
  if (pe_dataset_open(dir, "train", train, err, sizeof err) ||
      (test && pe_dataset_open(dir, "t10k", test, err, sizeof err)) ||
      pe_dataset_check_input(*train, m->image, m->image_ndim, m->image_dims, err, sizeof err)) {
    pe_dataset_free(*train);
    *train = NULL;
    if (test) {
      pe_dataset_free(*test);
      *test = NULL;
    }
    return cli_error(ctx, "%s", err);
  }
  float mean, std;
  pe_dataset_stats(*train, &mean, &std);
  pe_dataset_normalize(*train, mean, std);
  if (test) pe_dataset_normalize(*test, mean, std);
  /* Fewer examples: the arrays stay as loaded, only n shrinks. */
  if (limit > 0 && limit < (*train)->n) (*train)->n = limit;
  if (test && limit > 0 && limit < (*test)->n) (*test)->n = limit;
  return CLI_OK;
}

void cli_batch_feeds(const pe_model_spec *m, int n, const float *x, const int64_t *y,
                     pe_client_tensor feeds[2]) {
  int64_t xs[4], ys[2] = {n, 1};
  memcpy(xs, m->image_dims, sizeof xs);
  xs[0] = n;
  pe_client_tensor_set(&feeds[0], m->image, PE_B_F32, m->image_ndim, xs, x);
  pe_client_tensor_set(&feeds[1], m->label, PE_B_I64, 2, ys, y);
}
