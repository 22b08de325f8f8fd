/* pe-bench subcommands. Each is a row of the dispatch table in pe_bench.c:
 * a handler gets the arguments after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit status: 0 ok, 1 a run failed,
 * 2 bad arguments (after printing its usage). */
#ifndef PE_BENCH_H
#define PE_BENCH_H

#include <stdio.h>

int pe_bench_train(int argc, char **argv);
/* A subcommand's usage: on stdout for --help, on stderr after an error. */
void pe_bench_train_usage(FILE *f);
int pe_bench_rtt(int argc, char **argv);
void pe_bench_rtt_usage(FILE *f);
int pe_bench_sparse(int argc, char **argv);
void pe_bench_sparse_usage(FILE *f);
int pe_bench_attention(int argc, char **argv);
void pe_bench_attention_usage(FILE *f);

/* A subcommand's error: "pe-bench CMD: <message>" on stderr. The first one
 * is what the --json failure line says ({"bench":"CMD","ok":false,
 * "error":"...","code":"..."}, printed by main for a status other than 0);
 * code: a status code name (pe_code_name), USAGE or FAILED. */
void pe_bench_error(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
