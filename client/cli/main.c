/* pe-client [--socket ADDR] [--json] [--timeout MS] COMMAND [options]
 *
 * The command line for pe-executord. Global options may appear anywhere;
 * they are taken out of argv before the command's own options are parsed.
 * Commands live in tables, one file per group (cli.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "peclient_version.h"
#include "suggest.h"

static const cli_cmd *const groups[] = {cli_cmds_daemon, cli_cmds_state, cli_cmds_params,
                                        cli_cmds_run, cli_cmds_train};

static void usage(FILE *f) {
  fprintf(f,
          "usage: pe-client [--socket ADDR] [--json] [--timeout MS] COMMAND [options]\n\n"
          "commands:\n");
  int width = 0; /* the longest usage summary: one column for the help texts */
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (const cli_cmd *c = groups[g]; c->name; c++)
      if ((int)strlen(c->args) > width) width = (int)strlen(c->args);
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (const cli_cmd *c = groups[g]; c->name; c++)
      fprintf(f, "  %-10s %-*s %s\n", c->name, width, c->args, c->help);
  char addr[512];
  fprintf(
      f,
      "\nThe socket comes from --socket, else $PE_SOCKET, else the daemon's default\n"
      "(here %s). --json prints one JSON object as the last stdout line:\n"
      "{\"cmd\":...,\"ok\":true,...}, or on failure\n"
      "{\"cmd\":...,\"ok\":false,\"error\":\"...\",\"code\":\"...\"} (code: the daemon's, USAGE\n"
      "or FAILED). COMMAND --help lists a command's options. Exit status: 0 ok,\n"
      "1 failed, 2 usage, 3 daemon unreachable (timeout, no socket, or it shut down).\n",
      pe_client_default_address(addr, sizeof addr));
}

static const cli_cmd *find_cmd(const char *name) {
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (const cli_cmd *c = groups[g]; c->name; c++)
      if (!strcmp(c->name, name)) return c;
  return NULL;
}

/* The command closest to a mistyped name, when one is close; else NULL. */
static const char *closest_cmd(const char *name) {
  const char *best = NULL;
  size_t best_d = 0;
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (const cli_cmd *c = groups[g]; c->name; c++) {
      size_t d = cli_edit_distance(name, c->name);
      if (cli_is_close(name, c->name) && (!best || d < best_d)) best = c->name, best_d = d;
    }
  return best;
}

/* Take the global options out of argv (in place); returns the new argc or -1. */
static int take_globals(cli_ctx *ctx, int argc, char **argv) {
  int out = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = NULL;
    if (!strcmp(a, "--json")) {
      ctx->json = true;
      continue;
    }
    if (!strcmp(a, "--socket") || !strcmp(a, "--timeout")) {
      if (i + 1 >= argc) {
        cli_usage(ctx, "option '%s' needs a value", a);
        return -1;
      }
      val = argv[++i];
    } else if (!strncmp(a, "--socket=", 9) || !strncmp(a, "--timeout=", 10)) {
      val = strchr(a, '=') + 1;
    } else {
      argv[out++] = argv[i];
      continue;
    }
    if (a[2] == 's') {
      ctx->socket = val;
    } else {
      char *end;
      errno = 0;
      long v = strtol(val, &end, 10);
      if (errno || end == val || *end || v <= 0 || v > 86400000) {
        cli_usage(ctx, "--timeout '%s' is not a number of ms in [1, 86400000]", val);
        return -1;
      }
      ctx->timeout_ms = v;
    }
  }
  argv[out] = NULL;
  return out;
}

/* --json anywhere on the line, before the rest is parsed: a usage error
 * in the global options still ends with the JSON failure line. */
static bool wants_json(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--json")) return true;
  return false;
}

static int run(cli_ctx *ctx, int argc, char **argv) {
  argc = take_globals(ctx, argc, argv);
  if (argc < 0) return CLI_USAGE;
  if (argc < 2) {
    int rc = cli_usage(ctx, "no command");
    usage(stderr);
    return rc;
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
    usage(stdout);
    return CLI_OK;
  }
  if (!strcmp(name, "--version")) {
    printf("pe-client %s\n", pe_client_version());
    return CLI_OK;
  }
  const cli_cmd *cmd = find_cmd(name);
  if (!cmd) {
    const char *near = closest_cmd(name);
    int rc = near ? cli_usage(ctx, "unknown command '%s' (did you mean '%s'?)", name, near)
                  : cli_usage(ctx, "unknown command '%s'", name);
    fputc('\n', stderr);
    usage(stderr);
    return rc;
  }
  ctx->cmd = cmd->name;
  /* The command sees argv[0] = its name, then its options. */
  return cmd->fn(ctx, argc - 1, argv + 1);
}

int main(int argc, char **argv) {
  cli_ctx ctx = {.json = wants_json(argc, argv)};
  int rc = run(&ctx, argc, argv);
  cli_finish(&ctx, rc);
  return rc;
}
