/* Commands about programs and model state: register, save, load,
 * drop-model. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "session_record.h"

/* --- register ---------------------------------------------------------------------- */

typedef struct register_cfg {
  const char *model, *name, *places;
  long seed;
  bool eval, persistent, init;
  cli_graph_opts graph;
} register_cfg;

static const cli_opt register_opts[] = {
    {"model", CLI_STR, offsetof(register_cfg, model), 0, 0, "mlp | cnn | FILE (required)"},
    {"model-name", CLI_STR, offsetof(register_cfg, name), 0, 0,
     "parameter namespace (default: the model's name)"},
    {"places", CLI_STR, offsetof(register_cfg, places), 0, 0,
     "cpu:N, sim:N, cuda:0 (the model's, else the daemon's)"},
    {"seed", CLI_INT, offsetof(register_cfg, seed), 0, 1L << 62, "initialisation seed (1)"},
    {"eval", CLI_FLAG, offsetof(register_cfg, eval), 0, 0, "register the evaluation program"},
    {"persistent", CLI_FLAG, offsetof(register_cfg, persistent), 0, 0,
     "the model outlives this client's session"},
    {"init", CLI_FLAG, offsetof(register_cfg, init), 0, 0, "also initialise the parameters"},
    CLI_GRAPH_OPTS(register_cfg, graph),
    CLI_KEEP_OPTS(register_cfg, graph),
};

static int cmd_register(cli_ctx *ctx, int argc, char **argv) {
  register_cfg cfg = {.seed = 1};
  bool help;
  int rc = cli_parse(ctx, register_opts, sizeof register_opts / sizeof register_opts[0], argc, argv,
                     &cfg, &help);
  if (help) fputs(cli_lasting_note, stdout);
  if (rc || help) return rc;
  if (!cfg.model) return cli_usage(ctx, "--model is required (%s | FILE)", pe_model_spec_names());
  pe_model_spec m;
  if (cli_model_load(ctx, cfg.model, &m)) return CLI_FAIL;
  pe_client *c = cli_connect_lasting(ctx, &rc);
  if (!c) {
    pe_model_spec_release(&m);
    return rc;
  }
  cli_reg r = {.ns = cfg.name ? cfg.name : m.name,
               .places = cfg.places,
               .seed = cfg.seed,
               .for_test = cfg.eval,
               .persistent = cfg.persistent,
               .graph = &cfg.graph};
  pe_client_program prog;
  bool initialized = false;
  rc = cli_register(ctx, c, &m, &r, &prog);
  /* The reply's parameter list lasts until the next request (the init):
   * the JSON object is written now and printed once the init went well
   * (on a failure, main prints the failure line instead). */
  char *json = NULL;
  size_t json_len = 0;
  FILE *js = !rc && ctx->json ? open_memstream(&json, &json_len) : NULL;
  if (!rc && ctx->json && !js) rc = cli_error(ctx, "out of memory");
  char hs[24];
  cli_handle_str(prog.handle, hs);
  if (js) {
    fprintf(js, ",\"model\":");
    cli_json_str(js, r.ns);
    fprintf(js, ",\"places\":");
    cli_json_str(js, prog.places);
    fprintf(js, ",\"handle\":\"%s\",\"existed\":%s,\"for_test\":%s,\"params\":[", hs,
            prog.existed ? "true" : "false", cfg.eval ? "true" : "false");
    for (size_t i = 0; i < prog.n_params; i++) {
      fprintf(js, "%s{\"name\":", i ? "," : "");
      cli_json_str(js, prog.params[i].name);
      fprintf(js, ",\"dtype\":\"%s\",\"shape\":[", pe_client_dtype_name(prog.params[i].dtype));
      for (int d = 0; d < prog.params[i].ndim; d++)
        fprintf(js, "%s%lld", d ? "," : "", (long long)prog.params[i].shape[d]);
      fprintf(js, "]}");
    }
    fprintf(js, "]");
    if (fclose(js)) rc = cli_error(ctx, "out of memory");
  } else if (!rc) {
    printf("model %s on %s: %s program %s%s, %zu parameter(s)\n", r.ns, prog.places,
           cfg.eval ? "eval" : "train", hs, prog.existed ? " (already registered)" : "",
           prog.n_params);
    for (size_t i = 0; i < prog.n_params; i++) {
      printf("  %-24s %s [", prog.params[i].name, pe_client_dtype_name(prog.params[i].dtype));
      for (int d = 0; d < prog.params[i].ndim; d++)
        printf("%s%lld", d ? "," : "", (long long)prog.params[i].shape[d]);
      printf("]\n");
    }
  }
  if (!rc && cfg.init) {
    int code = pe_client_init(c, prog.handle, false, &initialized);
    if (code) rc = cli_fail(ctx, c, code);
  }
  if (!rc && ctx->json) {
    cli_json_begin(ctx);
    fwrite(json, 1, json_len, stdout);
    printf(",\"initialized\":%s}\n", initialized ? "true" : "false");
  } else if (!rc && cfg.init) {
    printf("%s\n", initialized ? "parameters initialised" : "parameters existed: kept");
  }
  /* For a deregister of this user's without --force (session_record.h). */
  cli_session s = {pe_client_id(c), pe_client_last_request_id(c)};
  if (!rc && !cli_session_save(pe_client_address(c), prog.handle, s))
    fprintf(stderr,
            "pe-client register: warning: the session could not be recorded; deregister "
            "--handle %s needs --force\n",
            hs);
  free(json);
  pe_client_free(c);
  pe_model_spec_release(&m);
  return rc;
}

/* --- save / load ------------------------------------------------------------------- */

typedef struct ckpt_cfg {
  const char *model, *checkpoint;
} ckpt_cfg;

static const cli_opt ckpt_opts[] = {
    {"model", CLI_STR, offsetof(ckpt_cfg, model), 0, 0, "model namespace (required)"},
    {"checkpoint", CLI_STR, offsetof(ckpt_cfg, checkpoint), 0, 0,
     "checkpoint name [A-Za-z0-9._-]{1,64} (required)"},
};

static int checkpoint_cmd(cli_ctx *ctx, int argc, char **argv, bool save) {
  ckpt_cfg cfg = {0};
  bool help;
  int rc = cli_parse(ctx, ckpt_opts, 2, argc, argv, &cfg, &help);
  if (rc || help) return rc;
  if (!cfg.model || !cfg.checkpoint) return cli_usage(ctx, "--model and --checkpoint are required");
  pe_client *c = cli_connect(ctx, &rc);
  if (!c) return rc;
  const char *path = NULL;
  uint64_t bytes = 0;
  int code = save ? pe_client_save(c, cfg.model, cfg.checkpoint, &path, &bytes)
                  : pe_client_load(c, cfg.model, cfg.checkpoint, &path, &bytes);
  if (code) {
    rc = cli_fail(ctx, c, code);
  } else if (ctx->json) {
    cli_json_begin(ctx);
    printf(",\"model\":");
    cli_json_str(stdout, cfg.model);
    printf(",\"checkpoint\":");
    cli_json_str(stdout, cfg.checkpoint);
    printf(",\"path\":");
    cli_json_str(stdout, path);
    printf(",\"bytes\":%llu}\n", (unsigned long long)bytes);
  } else {
    printf("%s %s: checkpoint %s (%s, %llu bytes)\n", save ? "saved" : "loaded", cfg.model,
           cfg.checkpoint, path && *path ? path : "?", (unsigned long long)bytes);
  }
  cli_end(ctx, c, rc);
  return rc;
}

static int cmd_save(cli_ctx *ctx, int argc, char **argv) {
  return checkpoint_cmd(ctx, argc, argv, true);
}

static int cmd_load(cli_ctx *ctx, int argc, char **argv) {
  return checkpoint_cmd(ctx, argc, argv, false);
}

/* --- drop-model -------------------------------------------------------------------- */

typedef struct drop_cfg {
  const char *model;
} drop_cfg;

static const cli_opt drop_opts[] = {
    {"model", CLI_STR, offsetof(drop_cfg, model), 0, 0, "model namespace (required)"},
};

static int cmd_drop_model(cli_ctx *ctx, int argc, char **argv) {
  drop_cfg cfg = {0};
  bool help;
  int rc = cli_parse(ctx, drop_opts, 1, argc, argv, &cfg, &help);
  if (rc || help) return rc;
  if (!cfg.model) return cli_usage(ctx, "--model is required");
  pe_client *c = cli_connect(ctx, &rc);
  if (!c) return rc;
  pe_client_drop_result d;
  int code = pe_client_drop_model(c, cfg.model, &d);
  if (code) {
    rc = cli_fail(ctx, c, code);
  } else if (ctx->json) {
    cli_json_begin(ctx);
    printf(",\"model\":");
    cli_json_str(stdout, cfg.model);
    printf(",\"freed\":%s,\"removed\":", d.freed ? "true" : "false");
    cli_json_str(stdout, d.removed);
    printf(",\"programs\":%d}\n", d.programs);
  } else {
    printf("dropped %s: %s; restart checkpoint %s\n", cfg.model,
           d.freed ? "freed in the daemon" : "not loaded in the daemon",
           *d.removed ? d.removed : "none");
  }
  cli_end(ctx, c, rc);
  return rc;
}

const cli_cmd cli_cmds_state[] = {
    {"register", "--model M [--eval] [--init] [--places P]", "register a program, list its params",
     cmd_register},
    {"save", "--model NAME --checkpoint CKPT", "write the model's parameters to a checkpoint",
     cmd_save},
    {"load", "--model NAME --checkpoint CKPT", "read the model's parameters back", cmd_load},
    {"drop-model", "--model NAME", "free a model and remove its restart checkpoint",
     cmd_drop_model},
    {NULL, NULL, NULL, NULL},
};
