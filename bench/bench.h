/* pe-bench subcommands. Each is a row of the dispatch table in pe_bench.c:
 * a handler gets the arguments after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit status: 0 ok, 1 a run failed,
 * 2 bad arguments (after printing its usage). */
#ifndef PE_BENCH_H
#define PE_BENCH_H

int pe_bench_train(int argc, char **argv);
void pe_bench_train_usage(void);

#endif
