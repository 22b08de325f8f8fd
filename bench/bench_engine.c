/* pe-bench engine: what scheduling costs per op, with empty ops.
 *
 * Graphs (N = --ops nodes, built once, deterministic):
 *   chain    0 -> 1 -> ... -> N-1
 *   fanout   0 -> i for every i in 1..N-1
 *   diamond  repeated diamonds s -> {a, b} -> t, each t the next s
 *   random   node i >= 1 has 1..3 distinct predecessors among the 32 nodes
 *            before it (xorshift, fixed seed)
 * Modes:
 *   static   pe_dag_run over the precomputed graph (counters re-armed
 *            per run, the finishing worker runs one successor inline)
 *   dynamic  the same graph pushed op by op through the dependency engine
 *            from this thread: one engine variable per node output; node i
 *            reads its predecessors' variables and mutates its own; then
 *            pe_engine_wait_all
 * Timed: one whole run (static) or all pushes plus the wait (dynamic); one
 * untimed warm-up run first. ns_per_op is the median over --repeat runs of
 * run time / N; min and mean are reported too. The pool has --threads
 * workers; in dynamic mode the pushing thread comes on top. */
#include "bench_engine.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "engine/dep_engine.h"
#include "graph_run.h"
#include "engine/threadpool.h"

typedef struct engine_cfg {
  const char *graph, *mode;
  long ops, threads, repeat, spin_us;
  bool json, help;
} engine_cfg;

typedef struct opt_row {
  const char *name;
  bool flag;
  long *num;        /* numeric option */
  const char **str; /* string option */
  long min, max;
  const char *help;
} opt_row;

static engine_cfg cfg;
static const opt_row opts[] = {
    {"graph", false, NULL, &cfg.graph, 0, 0, "chain | fanout | diamond | random (chain)"},
    {"mode", false, NULL, &cfg.mode, 0, 0, "static | dynamic (static)"},
    {"ops", false, &cfg.ops, NULL, 1, 50000000, "nodes in the graph (100000)"},
    {"threads", false, &cfg.threads, NULL, 1, 256, "pool workers (2)"},
    {"repeat", false, &cfg.repeat, NULL, 1, 100000, "timed runs (10)"},
    {"spin-us", false, &cfg.spin_us, NULL, -1, 1000000,
     "idle worker polling, us (0: pool default)"},
    {"json", true, NULL, NULL, 0, 0, "print one JSON line on stdout"},
    {"help", true, NULL, NULL, 0, 0, "this text"},
};

void pe_bench_engine_usage(FILE *f) {
  fprintf(f, "usage: pe-bench engine [options]\n\noptions:\n");
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    fprintf(f, "  --%-8s %-5s %s\n", opts[i].name, opts[i].flag ? "" : (opts[i].num ? "N" : "NAME"),
            opts[i].help);
  fprintf(f,
          "\nns_per_op: median over the timed runs of (run time / ops); a dynamic run\n"
          "includes pushing every op and waiting for all of them.\n");
}

/* fmt takes the argument (one %s). */
static int bad_args(const char *fmt, const char *arg) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, arg);
  pe_bench_error("USAGE", "%s", msg);
  fputc('\n', stderr);
  pe_bench_engine_usage(stderr);
  return 2;
}

static int parse_args(int argc, char **argv) {
  cfg = (engine_cfg){.graph = "chain", .mode = "static", .ops = 100000, .threads = 2, .repeat = 10};
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2)) return bad_args("unexpected argument '%s'", arg);
    const char *eq = strchr(arg + 2, '=');
    size_t nlen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    const opt_row *o = NULL;
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
      if (strlen(opts[k].name) == nlen && !strncmp(opts[k].name, arg + 2, nlen)) o = &opts[k];
    if (!o) return bad_args("unknown option '%s'", arg);
    if (o->flag) {
      if (eq) return bad_args("option '%s' takes no value", arg);
      if (!strcmp(o->name, "json")) cfg.json = true;
      if (!strcmp(o->name, "help")) cfg.help = true;
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!val) return bad_args("option '%s' needs a value", arg);
    if (o->str) {
      *o->str = val;
      continue;
    }
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < o->min || v > o->max) {
      char fmt[128]; /* as pe-client says it */
      snprintf(fmt, sizeof fmt, "option '--%s': '%%s' is not a number in [%ld, %ld]", o->name,
               o->min, o->max);
      return bad_args(fmt, val);
    }
    *o->num = v;
  }
  return 0;
}

/* --- graphs ---------------------------------------------------------------------- */

typedef struct edges {
  int *src, *dst;
  int n, cap;
} edges;

static bool edge_add(edges *e, int s, int d) {
  if (e->n == e->cap) {
    int cap = e->cap ? e->cap * 2 : 1024;
    int *a = realloc(e->src, sizeof(int) * (size_t)cap), *b;
    if (!a) return false;
    e->src = a;
    if (!(b = realloc(e->dst, sizeof(int) * (size_t)cap))) return false;
    e->dst = b;
    e->cap = cap;
  }
  e->src[e->n] = s;
  e->dst[e->n++] = d;
  return true;
}

static bool build_edges(const char *kind, int n, edges *e) {
  bool ok = true;
  if (!strcmp(kind, "chain")) {
    for (int i = 1; i < n && ok; i++) ok = edge_add(e, i - 1, i);
  } else if (!strcmp(kind, "fanout")) {
    for (int i = 1; i < n && ok; i++) ok = edge_add(e, 0, i);
  } else if (!strcmp(kind, "diamond")) {
    int s = 0, i = 1;
    for (; i + 2 < n && ok; i += 3, s = i - 1)
      ok = edge_add(e, s, i) && edge_add(e, s, i + 1) && edge_add(e, i, i + 2) &&
           edge_add(e, i + 1, i + 2);
    for (; i < n && ok; s = i, i++) ok = edge_add(e, s, i); /* leftover: a short chain */
  } else if (!strcmp(kind, "random")) {
    uint32_t x = 0x2545f491u;
    for (int i = 1; i < n && ok; i++) {
      int lo = i > 32 ? i - 32 : 0, k = 1, picked[3];
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      k += (int)(x % 3);
      int got = 0;
      for (int t = 0; t < k && ok; t++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        int p = lo + (int)(x % (uint32_t)(i - lo)), dup = 0;
        for (int q = 0; q < got; q++) dup |= picked[q] == p;
        if (dup) continue;
        picked[got++] = p;
        ok = edge_add(e, p, i);
      }
    }
  } else {
    return false;
  }
  return ok;
}

/* --- timing ------------------------------------------------------------------------ */

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static pe_status *empty_node(void *ctx, int node) {
  return NULL;
}
static pe_status *empty_op(void *arg) {
  return NULL;
}

/* Static: one run = pe_dag_run. */
static pe_status *run_static(pe_pool *pool, const edges *e, int n, double *ns, int repeat) {
  pe_dag *g;
  PE_TRY(pe_dag_new(n, e->src, e->dst, e->n, &g));
  pe_status *st = pe_dag_run(g, pool, empty_node, NULL);
  for (int r = 0; r < repeat && !st; r++) {
    double t0 = now_ns();
    st = pe_dag_run(g, pool, empty_node, NULL);
    ns[r] = now_ns() - t0;
  }
  pe_dag_free(g);
  return st;
}

/* Dynamic: one run = push every node as an op, then wait for all. */
static pe_status *run_dynamic(pe_pool *pool, const edges *e, int n, double *ns, int repeat) {
  pe_engine *eng = NULL;
  pe_engine_var **vars = calloc((size_t)n, sizeof *vars);
  pe_engine_var **preds = malloc(sizeof *preds * ((size_t)e->n + 1));
  int *off = calloc((size_t)n + 1, sizeof(int)), *fill = calloc((size_t)n, sizeof(int));
  pe_status *st = NULL;
  if (!vars || !preds || !off || !fill) st = pe_error(PE_ENOMEM, "bench: %d nodes", n);
  if (!st) st = pe_engine_new(pool, &eng);
  for (int i = 0; i < n && !st; i++) st = pe_engine_new_var(eng, &vars[i]);
  if (!st) {
    for (int i = 0; i < e->n; i++) off[e->dst[i] + 1]++;
    for (int i = 0; i < n; i++) off[i + 1] += off[i];
    for (int i = 0; i < e->n; i++) preds[off[e->dst[i]] + fill[e->dst[i]]++] = vars[e->src[i]];
  }
  for (int r = -1; r < repeat && !st; r++) { /* r == -1: warm-up */
    double t0 = now_ns();
    for (int i = 0; i < n && !st; i++)
      st = pe_engine_push(eng, empty_op, NULL, preds + off[i], off[i + 1] - off[i], &vars[i], 1, 0);
    pe_status *w = pe_engine_wait_all(eng);
    if (!st)
      st = w;
    else
      pe_status_free(w);
    if (r >= 0) ns[r] = now_ns() - t0;
  }
  pe_engine_free(eng);
  free(vars);
  free(preds);
  free(off);
  free(fill);
  return st;
}

int pe_bench_engine_main(int argc, char **argv) {
  int rc = parse_args(argc, argv);
  if (rc) return rc;
  if (cfg.help) {
    pe_bench_engine_usage(stdout);
    return 0;
  }
  bool is_static = !strcmp(cfg.mode, "static");
  if (!is_static && strcmp(cfg.mode, "dynamic"))
    return bad_args("unknown mode '%s' (static, dynamic)", cfg.mode);
  int n = (int)cfg.ops, repeat = (int)cfg.repeat;
  edges e = {0};
  if (!build_edges(cfg.graph, n, &e)) {
    free(e.src);
    free(e.dst);
    if (strcmp(cfg.graph, "chain") && strcmp(cfg.graph, "fanout") && strcmp(cfg.graph, "diamond") &&
        strcmp(cfg.graph, "random"))
      return bad_args("unknown graph '%s' (chain, fanout, diamond, random)", cfg.graph);
    pe_bench_error(pe_code_name(PE_ENOMEM), "out of memory building the graph");
    return 1;
  }
  double *ns = calloc((size_t)repeat, sizeof(double));
  pe_pool *pool = NULL;
  pe_pool_opts po = {.spin_us = (int)cfg.spin_us};
  pe_status *st = ns ? pe_pool_new((int)cfg.threads, &po, &pool)
                     : pe_error(PE_ENOMEM, "bench: %d repeats", repeat);
  if (!st)
    st = is_static ? run_static(pool, &e, n, ns, repeat) : run_dynamic(pool, &e, n, ns, repeat);
  pe_pool_free(pool);
  free(e.src);
  free(e.dst);
  if (st) {
    pe_bench_error(pe_code_name(pe_status_code(st)), "%s (%s)", pe_status_msg(st),
                   pe_code_name(pe_status_code(st)));
    pe_status_free(st);
    free(ns);
    return 1;
  }
  double sum = 0;
  for (int r = 0; r < repeat; r++) sum += ns[r];
  qsort(ns, (size_t)repeat, sizeof(double), cmp_double);
  double med = repeat % 2 ? ns[repeat / 2] : (ns[repeat / 2 - 1] + ns[repeat / 2]) / 2;
  double per_med = med / n, per_min = ns[0] / n, per_mean = sum / repeat / n;
  if (cfg.json)
    printf(
        "{\"bench\":\"engine\",\"ok\":true,\"graph\":\"%s\",\"mode\":\"%s\",\"ops\":%d,"
        "\"edges\":%d,\"threads\":%ld,\"repeat\":%d,\"ns_per_op\":%.1f,\"ns_per_op_min\":%.1f,"
        "\"ns_per_op_mean\":%.1f}\n",
        cfg.graph, cfg.mode, n, e.n, cfg.threads, repeat, per_med, per_min, per_mean);
  else
    printf("engine %s/%s: %d ops, %ld threads: %.1f ns/op (min %.1f, mean %.1f, %d runs)\n",
           cfg.graph, cfg.mode, n, cfg.threads, per_med, per_min, per_mean, repeat);
  free(ns);
  return 0;
}
