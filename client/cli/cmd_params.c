/* export and import: a model's parameters to and from a file of one's own
 * (the daemon's checkpoint format, pe_params_file.h), through get_params and
 * set_params, so a trainer who cannot write the daemon's state directory
 * keeps copies, and one model starts from another's values (also train
 * --init-from, cmd_train.c). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "out_path.h"
#include "pe_params_file.h"

typedef struct params_cfg {
  const char *model, *out, *in;
} params_cfg;

static const cli_opt export_opts[] = {
    {"model", CLI_STR, offsetof(params_cfg, model), 0, 0, "model namespace (required)"},
    {"out", CLI_STR, offsetof(params_cfg, out), 0, 0, "the file to write (required)"},
};

static const cli_opt import_opts[] = {
    {"model", CLI_STR, offsetof(params_cfg, model), 0, 0, "model namespace (required)"},
    {"in", CLI_STR, offsetof(params_cfg, in), 0, 0, "a file of pe-client export, or a checkpoint"},
};

static void print_done(const cli_ctx *ctx, const char *verb, const char *model, const char *path,
                       size_t n, uint64_t bytes, size_t skipped) {
  if (ctx->json) {
    cli_json_begin(ctx);
    printf(",\"model\":");
    cli_json_str(stdout, model);
    printf(",\"path\":");
    cli_json_str(stdout, path);
    printf(",\"tensors\":%zu,\"bytes\":%llu", n, (unsigned long long)bytes);
    if (skipped) printf(",\"skipped\":%zu", skipped);
    printf("}\n");
  } else {
    printf("%s %s: %zu tensors, %s (%llu bytes)\n", verb, model, n, path,
           (unsigned long long)bytes);
  }
}

static int cmd_export(cli_ctx *ctx, int argc, char **argv) {
  params_cfg cfg = {0};
  bool help;
  int rc = cli_parse(ctx, export_opts, 2, argc, argv, &cfg, &help);
  if (rc || help) return rc;
  if (!cfg.model || !cfg.out) return cli_usage(ctx, "--model and --out are required");
  char err[512];
  if (cli_out_path_check(cfg.out, err, sizeof err)) return cli_error(ctx, "--out %s", err);
  pe_client *c = cli_connect(ctx, &rc);
  if (!c) return rc;
  const pe_client_tensor *v = NULL;
  size_t n = 0;
  uint64_t bytes = 0;
  int code = pe_client_get_params(c, cfg.model, NULL, 0, &v, &n);
  if (code)
    rc = cli_fail(ctx, c, code);
  else if (pe_params_file_write(v, n, cfg.out, &bytes, err, sizeof err))
    rc = cli_error(ctx, "export %s: %s", cfg.model, err);
  else
    print_done(ctx, "exported", cfg.model, cfg.out, n, bytes, 0);
  cli_end(ctx, c, rc);
  return rc;
}

int cli_params_import(const cli_ctx *ctx, pe_client *c, const char *model, const char *path,
                      bool (*take)(const char *name, void *arg), void *arg, size_t *n_set,
                      size_t *n_skipped, uint64_t *bytes) {
  pe_params_file p;
  char err[512];
  if (pe_params_file_read(path, &p, err, sizeof err)) return cli_error(ctx, "%s", err);
  size_t k = 0;
  for (size_t i = 0; i < p.n; i++)
    if (!take || take(p.t[i].name, arg)) p.t[k++] = p.t[i];
  *n_set = k;
  *n_skipped = p.n - k;
  *bytes = 0;
  for (size_t i = 0; i < k; i++) *bytes += p.t[i].nbytes;
  int rc = CLI_OK, code = k ? pe_client_set_params(c, model, p.t, k) : 0;
  if (code)
    rc = cli_fail_at(ctx, c, code, path);
  else if (!k)
    rc =
        cli_error(ctx, "%s: none of its %zu tensors is a variable of model '%s'", path, p.n, model);
  pe_params_file_free(&p);
  return rc;
}

static int cmd_import(cli_ctx *ctx, int argc, char **argv) {
  params_cfg cfg = {0};
  bool help;
  int rc = cli_parse(ctx, import_opts, 2, argc, argv, &cfg, &help);
  if (rc || help) return rc;
  if (!cfg.model || !cfg.in) return cli_usage(ctx, "--model and --in are required");
  pe_client *c = cli_connect(ctx, &rc);
  if (!c) return rc;
  size_t n, skipped;
  uint64_t bytes;
  rc = cli_params_import(ctx, c, cfg.model, cfg.in, NULL, NULL, &n, &skipped, &bytes);
  if (!rc) print_done(ctx, "imported", cfg.model, cfg.in, n, bytes, skipped);
  cli_end(ctx, c, rc);
  return rc;
}

const cli_cmd cli_cmds_params[] = {
    {"export", "--model NAME --out FILE", "write the model's parameters to a file of one's own",
     cmd_export},
    {"import", "--model NAME --in FILE", "set a registered model's parameters from such a file",
     cmd_import},
    {NULL, NULL, NULL, NULL},
};
