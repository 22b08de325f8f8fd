/* pe-bench sparse: an embedding trained with a sparse gradient
 * (lookup_table_v2 is_sparse: only the rows a batch touched, merged across
 * places by the parallel executor's sparse_merge) against the same model
 * with a dense gradient (every row, all-reduced).
 *
 * Model: ids [batch, seq] (uniform over the vocabulary, a fixed xorshift
 * stream), emb = W[ids] with W [vocab, dim], loss = mean(square(emb @ F +
 * b)), F [dim, 16] and b [16] the small fc head; optimizer --opt (sgd, or
 * adam: lazy_mode with the sparse gradient).
 *
 * Runs: dense and sparse, each on cpu:1 and cpu:2 (strategy allreduce),
 * each in a child process of its own (fork), so that its peak resident
 * memory (getrusage's ru_maxrss) is its own. A run: startup, --warmup
 * untimed steps, then --steps timed steps. One JSON line per run on stdout:
 * samples_per_s = batch * steps / the steps' wall time; peak_rss_mib, the
 * run's peak resident memory (getrusage; setup included, where
 * pe_model_set's source of the table is a second copy of it);
 * steps_rss_mib, the largest resident memory after a step (what training
 * holds between steps: parameters, optimizer state, gradients, kept
 * temporaries); base_rss_mib, the resident memory when the run began,
 * before the model. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "compiler/pass.h"
#include "engine/parallel/executor.h"
#include "ir/program.h"
#include "json_out.h"

enum { HEAD = 16 };

typedef struct sparse_cfg {
  long vocab, dim, batch, seq, steps, warmup;
  const char *opt;
  bool help;
} sparse_cfg;

static sparse_cfg cfg;

typedef struct opt_row {
  const char *name;
  long *num;
  long min, max;
  const char *help;
} opt_row;

static const opt_row opts[] = {
    {"vocab", &cfg.vocab, 1, 100000000, "embedding rows (100000)"},
    {"dim", &cfg.dim, 1, 4096, "embedding width (128)"},
    {"batch", &cfg.batch, 2, 1000000, "samples per step (256)"},
    {"seq", &cfg.seq, 1, 4096, "ids per sample (8)"},
    {"steps", &cfg.steps, 1, 1000000, "timed steps (30)"},
    {"warmup", &cfg.warmup, 0, 1000000, "untimed steps first (3)"},
};

void pe_bench_sparse_usage(FILE *f) {
  fprintf(f, "usage: pe-bench sparse [options]\n\noptions:\n");
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    fprintf(f, "  --%-8s N     %s\n", opts[i].name, opts[i].help);
  fprintf(f,
          "  --opt      NAME  sgd | adam (sgd)\n"
          "  --json           (the lines are JSON either way)\n"
          "  --help           this text\n");
  fprintf(f,
          "\nRuns dense and sparse embedding gradients on cpu:1 and cpu:2, each in its\n"
          "own process; one JSON line per run.\n");
}

static int bad_args(const char *what, const char *arg) {
  pe_bench_error("USAGE", "%s '%s'", what, arg);
  fputc('\n', stderr);
  pe_bench_sparse_usage(stderr);
  return 2;
}

static int parse_args(int argc, char **argv) {
  cfg = (sparse_cfg){
      .vocab = 100000, .dim = 128, .batch = 256, .seq = 8, .steps = 30, .warmup = 3, .opt = "sgd"};
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "--json")) { /* the lines are JSON anyway */
      cfg.help |= !strcmp(arg, "--help");
      continue;
    }
    if (strncmp(arg, "--", 2) || i + 1 >= argc) return bad_args("unexpected argument", arg);
    const char *val = argv[++i];
    if (!strcmp(arg, "--opt")) {
      if (strcmp(val, "sgd") && strcmp(val, "adam")) return bad_args("--opt: not sgd or adam", val);
      cfg.opt = val;
      continue;
    }
    const opt_row *o = NULL;
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
      if (!strcmp(opts[k].name, arg + 2)) o = &opts[k];
    if (!o) return bad_args("unknown option", arg);
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < o->min || v > o->max)
      return bad_args("not a number in the option's range:", val);
    *o->num = v;
  }
  return 0;
}

/* --- model ------------------------------------------------------------------------ */

static pe_status *add_var(pe_block *b, const char *name, pe_dtype dt, const pe_shape *s, bool param,
                          bool feed) {
  pe_var_desc *v;
  PE_TRY(pe_block_add_var(b, name, dt, s, &v));
  v->persistable = param;
  v->is_feed = feed;
  v->stop_gradient = feed;
  return NULL;
}

/* op with one argument per slot: in[0..2n_in) and out[0..2n_out) are
 * slot, name pairs. */
static pe_status *add_op(pe_block *b, const char *type, const char *const *in, int n_in,
                         const char *const *out, int n_out, pe_op_desc **op) {
  PE_TRY(pe_block_append_op(b, type, op));
  for (int i = 0; i < n_in; i++) PE_TRY(pe_op_input1(*op, in[2 * i], in[2 * i + 1]));
  for (int i = 0; i < n_out; i++) PE_TRY(pe_op_output1(*op, out[2 * i], out[2 * i + 1]));
  return NULL;
}

static pe_status *build(bool sparse, pe_program **out) {
  pe_program *p = pe_program_new();
  *out = p;
  if (!p) return pe_error(PE_ENOMEM, "out of memory");
  pe_block *m;
  PE_TRY(pe_program_add_block(p, -1, &m));
  pe_shape ids = PE_SHAPE(-1, cfg.seq), w = PE_SHAPE(cfg.vocab, cfg.dim),
           f = PE_SHAPE(cfg.dim, HEAD), b = PE_SHAPE(HEAD);
  PE_TRY(add_var(m, "ids", PE_I64, &ids, false, true));
  PE_TRY(add_var(m, "emb.w", PE_F32, &w, true, false));
  PE_TRY(add_var(m, "fc.w", PE_F32, &f, true, false));
  PE_TRY(add_var(m, "fc.b", PE_F32, &b, true, false));
  const char *tmps[] = {"emb", "h", "hb", "sq", "loss"};
  for (int i = 0; i < 5; i++) PE_TRY(add_var(m, tmps[i], PE_F32, NULL, false, false));
  pe_op_desc *op;
  PE_TRY(add_op(m, "lookup_table_v2", (const char *[]){"W", "emb.w", "Ids", "ids"}, 2,
                (const char *[]){"Out", "emb"}, 1, &op));
  PE_TRY(pe_op_set_bool(op, "is_sparse", sparse));
  PE_TRY(add_op(m, "matmul_v2", (const char *[]){"X", "emb", "Y", "fc.w"}, 2,
                (const char *[]){"Out", "h"}, 1, &op));
  PE_TRY(add_op(m, "elementwise_add", (const char *[]){"X", "h", "Y", "fc.b"}, 2,
                (const char *[]){"Out", "hb"}, 1, &op));
  PE_TRY(
      add_op(m, "square", (const char *[]){"X", "hb"}, 1, (const char *[]){"Out", "sq"}, 1, &op));
  PE_TRY(
      add_op(m, "mean", (const char *[]){"X", "sq"}, 1, (const char *[]){"Out", "loss"}, 1, &op));
  p->loss = strdup("loss");
  p->opt.type = strdup(cfg.opt);
  p->opt.lr = 0.05f;
  return p->loss && p->opt.type ? NULL : pe_error(PE_ENOMEM, "out of memory");
}

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A parameter's starting values: uniform in [-0.05, 0.05). The source is
 * plain malloc'd memory viewed by the tensor, which free gives back to the
 * system (a tensor allocation would stay in the allocator's cache and count
 * as resident memory for the whole run). */
static pe_status *set_param(pe_model *m, const char *name, pe_shape s, uint64_t *rng) {
  int64_t n = pe_shape_numel(&s);
  float *v = malloc((size_t)n * sizeof(float));
  if (!v) return pe_error(PE_ENOMEM, "out of memory for the values of '%s'", name);
  for (int64_t i = 0; i < n; i++)
    v[i] = (float)((double)(xorshift(rng) >> 11) / 9007199254740992.0 * 0.1 - 0.05);
  pe_tensor t;
  pe_tensor_init(&t);
  pe_tensor_view(&t, PE_F32, &s, v);
  pe_status *st = pe_model_set(m, name, &t);
  free(v);
  return st;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double rss_mib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
    fclose(f);
  }
  return (double)res * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

/* One run (in the child); *sps and *loss its results, *steps_mib the
 * largest resident memory seen after a step. */
static pe_status *run_one(bool sparse, int places, double *sps, float *loss, double *steps_mib) {
  pe_program *p = NULL;
  pe_runtime *rt = NULL;
  pe_model *m = NULL;
  pe_par_exec *init = NULL, *step = NULL;
  int64_t *ids = NULL;
  pe_tensor out;
  pe_tensor_init(&out);
  pe_status *st = build(sparse, &p);
  pe_pass_opts o = {
      .place_kind = PE_PLACE_CPU, .n_places = places, .strategy = PE_STRATEGY_ALLREDUCE};
  pe_ir ir = {.prog = p, .opts = &o};
  if (!st) st = pe_graph_compile(&ir, false);
  pe_runtime_opts ro = {.cores = 2};
  if (!st) st = pe_runtime_new(&ro, &rt);
  if (!st) st = pe_model_new(rt, PE_PLACE_CPU, places, 1, &m);
  if (!st) st = pe_par_exec_new(m, ir.startup, &init);
  ir.startup = NULL;
  if (!st) st = pe_par_exec_new(m, ir.graph, &step);
  ir.graph = NULL;
  pe_ir_destroy(&ir);
  if (!st) st = pe_par_exec_run(init, NULL, 0, NULL, 0, NULL, NULL, NULL);
  uint64_t rng = 0x9e3779b97f4a7c15u;
  if (!st) st = set_param(m, "emb.w", PE_SHAPE(cfg.vocab, cfg.dim), &rng);
  if (!st) st = set_param(m, "fc.w", PE_SHAPE(cfg.dim, HEAD), &rng);
  if (!st) st = set_param(m, "fc.b", PE_SHAPE(HEAD), &rng);
  ids = malloc((size_t)(cfg.batch * cfg.seq) * sizeof(int64_t));
  if (!st && !ids) st = pe_error(PE_ENOMEM, "out of memory");
  double t0 = 0;
  for (long s = 0; !st && s < cfg.warmup + cfg.steps; s++) {
    if (s == cfg.warmup) t0 = now_s();
    for (long i = 0; i < cfg.batch * cfg.seq; i++) ids[i] = (int64_t)(xorshift(&rng) % cfg.vocab);
    pe_tensor it;
    pe_tensor_init(&it);
    pe_shape is = PE_SHAPE(cfg.batch, cfg.seq);
    pe_tensor_view(&it, PE_I64, &is, ids);
    pe_feed f = {"ids", &it};
    const char *fetch = "loss";
    st = pe_par_exec_run(step, &f, 1, &fetch, 1, &out, NULL, NULL);
    *steps_mib = fmax(*steps_mib, rss_mib());
  }
  if (!st) {
    *sps = (double)(cfg.batch * cfg.steps) / (now_s() - t0);
    *loss = pe_f32(&out)[0];
  }
  pe_tensor_release(&out);
  free(ids);
  pe_par_exec_free(step);
  pe_par_exec_free(init);
  pe_model_free(m);
  pe_runtime_free(rt);
  pe_program_free(p);
  return st;
}

/* The child: one run, its JSON line; exit status 0 or 1. */
static int child(bool sparse, int places) {
  double base = rss_mib(), sps = 0, steps = 0;
  float loss = 0;
  pe_status *st = run_one(sparse, places, &sps, &loss, &steps);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  if (st) {
    pe_bench_error(pe_code_name(pe_status_code(st)), "%s cpu:%d: %s", sparse ? "sparse" : "dense",
                   places, pe_status_msg(st));
    pe_status_free(st);
    return 1;
  }
  printf(
      "{\"bench\":\"sparse\",\"ok\":true,\"gradient\":\"%s\",\"places\":\"cpu:%d\","
      "\"opt\":\"%s\",\"vocab\":%ld,\"dim\":%ld,\"batch\":%ld,\"seq\":%ld,\"steps\":%ld,"
      "\"samples_per_s\":",
      sparse ? "sparse" : "dense", places, cfg.opt, cfg.vocab, cfg.dim, cfg.batch, cfg.seq,
      cfg.steps);
  cli_json_num(stdout, "%.1f", sps);
  printf(",\"loss\":");
  cli_json_num(stdout, "%.6g", loss);
  printf(",\"peak_rss_mib\":%.1f,\"steps_rss_mib\":%.1f,\"base_rss_mib\":%.1f}\n",
         (double)ru.ru_maxrss / 1024.0, steps, base);
  fflush(stdout);
  return 0;
}

int pe_bench_sparse(int argc, char **argv) {
  int rc = parse_args(argc, argv);
  if (rc) return rc;
  if (cfg.help) {
    pe_bench_sparse_usage(stdout);
    return 0;
  }
  fflush(stdout);
  int failed = 0;
  for (int places = 1; places <= 2; places++)
    for (int sparse = 0; sparse < 2; sparse++) {
      pid_t pid = fork();
      if (pid < 0) {
        pe_bench_error("FAILED", "fork: %s", strerror(errno));
        return 1;
      }
      if (pid == 0) _exit(child(sparse, places));
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) continue;
      failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
  if (failed) pe_bench_error("FAILED", "a run failed (its error is above)");
  return failed ? 1 : 0;
}
