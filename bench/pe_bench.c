/* pe-bench: benchmarks that print one JSON line each. Subcommands are rows
 * of a table (name -> handler); `ipc` joins as a row later. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_engine.h"
#include "core/omp_policy.h"
#include "json_out.h"
#include "peclient_version.h"

typedef struct bench_cmd {
  const char *name;
  int (*run)(int argc, char **argv);
  void (*usage)(FILE *f);
  const char *summary;
} bench_cmd;

static const bench_cmd cmds[] = {
    {"train", pe_bench_train, pe_bench_train_usage,
     "train a model on Fashion-MNIST in-process, then evaluate it"},
    {"engine", pe_bench_engine_main, pe_bench_engine_usage,
     "scheduling overhead: static graph runner vs dependency engine"},
    {"rtt", pe_bench_rtt, pe_bench_rtt_usage,
     "round trip of a tiny program's run through the daemon (libpeclient)"},
    {"sparse", pe_bench_sparse, pe_bench_sparse_usage,
     "an embedding trained with sparse vs dense gradients on cpu:1 and cpu:2"},
    {"attention", pe_bench_attention, pe_bench_attention_usage,
     "multi-head attention forward + backward: fused op vs its composition"},
};

/* On stdout when asked for (--help), on stderr after a usage error. */
static void usage(FILE *f) {
  fprintf(f, "usage: pe-bench <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].summary);
  fprintf(f, "\n'pe-bench <command> --help' describes a command's options.\n");
}

/* The running subcommand and its first error (pe_bench_error). */
static const char *current;
static struct {
  char msg[1024];
  const char *code;
} last_error;

void pe_bench_error(const char *code, const char *fmt, ...) {
  char msg[sizeof last_error.msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "pe-bench%s%s: %s\n", current ? " " : "", current ? current : "", msg);
  if (last_error.code) return;
  memcpy(last_error.msg, msg, sizeof msg);
  last_error.code = code;
}

static int run(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) { /* as pe-executord and pe-client */
    printf("pe-bench %s\n", pe_client_version());
    return 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) {
      current = cmds[i].name;
      return cmds[i].run(argc - 1, argv + 1);
    }
  pe_bench_error("USAGE", "unknown command '%s'", argv[1]);
  fputc('\n', stderr);
  usage(stderr);
  return 2;
}

/* --json promises one JSON line: a failed run prints the failure line
 * (the subcommand's first error); the exit status stays its own. */
int main(int argc, char **argv) {
  /* First: it may re-execute pe-bench (core/omp_policy.h); the train line
   * reports the policy (omp_wait_policy). */
  if (!pe_omp_policy_init("pe-bench", argv)) {
    char line[320];
    fprintf(stderr, "pe-bench: %s\n", pe_omp_policy_describe(line, sizeof line));
  }
  bool json = false;
  for (int i = 2; i < argc; i++) json = json || !strcmp(argv[i], "--json");
  int rc = run(argc, argv);
  if (json && rc) {
    fflush(stdout);
    cli_json_failure(stdout, "bench", current, last_error.code ? last_error.msg : "failed",
                     last_error.code ? last_error.code
                     : rc == 2       ? "USAGE"
                                     : "FAILED");
  }
  return rc;
}
