/* pe-bench engine: scheduling overhead of the static graph runner and of
 * the dependency engine on empty ops (one JSON line with --json). Same
 * handler contract as bench.h: argv[0] is the subcommand; returns 0 ok,
 * 1 a run failed, 2 bad arguments. */
#ifndef PE_BENCH_ENGINE_H
#define PE_BENCH_ENGINE_H

#include <stdio.h>

int pe_bench_engine_main(int argc, char **argv);
void pe_bench_engine_usage(FILE *f);

#endif
