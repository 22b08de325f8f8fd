/* pe-bench: benchmarks that print one JSON line each. Subcommands are rows
 * of a table (name -> handler); `ipc` joins as a row later. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_engine.h"

typedef struct bench_cmd {
  const char *name;
  int (*run)(int argc, char **argv);
  void (*usage)(void);
  const char *summary;
} bench_cmd;

static const bench_cmd cmds[] = {
    {"train", pe_bench_train, pe_bench_train_usage,
     "train a model on Fashion-MNIST in-process, then evaluate it"},
    {"engine", pe_bench_engine_main, pe_bench_engine_usage,
     "scheduling overhead: static graph runner vs dependency engine"},
};

static void usage(void) {
  fprintf(stderr, "usage: pe-bench <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    fprintf(stderr, "  %-8s %s\n", cmds[i].name, cmds[i].summary);
  fprintf(stderr, "\n'pe-bench <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage();
    return 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) return cmds[i].run(argc - 1, argv + 1);
  fprintf(stderr, "pe-bench: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
