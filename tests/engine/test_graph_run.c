/* Static graph runner: on chain, fan-out, diamond and random graphs (with
 * one or many roots), 1..8 workers, many re-runs, every node runs exactly
 * once per run and after all its predecessors; a failing node skips its
 * descendants only and the next run is clean; cycles and bad edges are
 * rejected; runs from inside the pool and overlapping runs. */
#define _GNU_SOURCE
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "graph_run.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SCALE 4
#else
#define SCALE 1
#endif

#define OK(expr)                                                         \
  do {                                                                   \
    pe_status *st_ = (expr);                                             \
    ck_assert_msg(!st_, "%s: %s", #expr, st_ ? pe_status_msg(st_) : ""); \
  } while (0)

typedef struct edges {
  int *src, *dst, n, cap;
} edges;

static void add(edges *e, int s, int d) {
  if (e->n == e->cap) {
    e->cap = e->cap ? 2 * e->cap : 256;
    e->src = realloc(e->src, sizeof(int) * (size_t)e->cap);
    e->dst = realloc(e->dst, sizeof(int) * (size_t)e->cap);
  }
  e->src[e->n] = s;
  e->dst[e->n++] = d;
}

static uint32_t rnd(uint32_t *s) {
  uint32_t x = *s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

enum { CHAIN, FANOUT, DIAMOND, RANDOM, FOREST, KINDS };
static const char *kind_name[KINDS] = {"chain", "fanout", "diamond", "random", "forest"};

static edges make(int kind, int n, uint32_t seed) {
  edges e = {0};
  uint32_t r = seed * 2654435761u + 7;
  switch (kind) {
    case CHAIN:
      for (int i = 1; i < n; i++) add(&e, i - 1, i);
      break;
    case FANOUT: /* and a fan-in at the end */
      for (int i = 1; i < n - 1; i++) add(&e, 0, i), add(&e, i, n - 1);
      break;
    case DIAMOND:
      for (int s = 0, i = 1; i + 2 < n; s = i + 2, i += 3)
        add(&e, s, i), add(&e, s, i + 1), add(&e, i, i + 2), add(&e, i + 1, i + 2);
      break;
    case RANDOM: /* 1..3 predecessors among the previous 16 */
      for (int i = 1; i < n; i++) {
        int lo = i > 16 ? i - 16 : 0, k = 1 + (int)(rnd(&r) % 3);
        for (int t = 0; t < k; t++) add(&e, lo + (int)(rnd(&r) % (uint32_t)(i - lo)), i);
      }
      break;
    case FOREST: /* sparse: many roots, many sinks, duplicate edges */
      for (int i = 1; i < n; i++)
        if (rnd(&r) % 3 == 0) {
          int p = (int)(rnd(&r) % (uint32_t)i);
          add(&e, p, i);
          if (rnd(&r) % 8 == 0) add(&e, p, i);
        }
      break;
  }
  return e;
}

/* Predecessor lists (CSR) for checking. */
typedef struct check_ctx {
  int n, round, fail_node;
  int *off, *pred;
  atomic_int *runs, *done_round;
  atomic_int violations;
} check_ctx;

static pe_status *check_node(void *ctx, int v) {
  check_ctx *c = ctx;
  atomic_fetch_add(&c->runs[v], 1);
  for (int j = c->off[v]; j < c->off[v + 1]; j++)
    if (atomic_load_explicit(&c->done_round[c->pred[j]], memory_order_acquire) != c->round)
      atomic_fetch_add(&c->violations, 1);
  if (atomic_load(&c->done_round[v]) == c->round) atomic_fetch_add(&c->violations, 1);
  atomic_store_explicit(&c->done_round[v], c->round, memory_order_release);
  if (v == c->fail_node) return pe_error(PE_EBACKEND, "node %d failed", v);
  return NULL;
}

static check_ctx *ctx_new(int n, const edges *e) {
  check_ctx *c = calloc(1, sizeof *c);
  c->n = n;
  c->fail_node = -1;
  c->off = calloc((size_t)n + 1, sizeof(int));
  c->pred = malloc(sizeof(int) * ((size_t)e->n + 1));
  int *fill = calloc((size_t)n, sizeof(int));
  for (int i = 0; i < e->n; i++) c->off[e->dst[i] + 1]++;
  for (int v = 0; v < n; v++) c->off[v + 1] += c->off[v];
  for (int i = 0; i < e->n; i++) c->pred[c->off[e->dst[i]] + fill[e->dst[i]]++] = e->src[i];
  free(fill);
  c->runs = calloc((size_t)n, sizeof(atomic_int));
  c->done_round = malloc(sizeof(atomic_int) * (size_t)n);
  for (int v = 0; v < n; v++) atomic_init(&c->done_round[v], -1);
  return c;
}

static void ctx_free(check_ctx *c) {
  free(c->off);
  free(c->pred);
  free(c->runs);
  free(c->done_round);
  free(c);
}

START_TEST(every_node_once_after_its_predecessors) {
  const int threads_list[] = {1, 2, 3, 4, 8};
  const int rounds = 40 / SCALE, n = 600;
  for (int kind = 0; kind < KINDS; kind++) {
    for (size_t ti = 0; ti < sizeof threads_list / sizeof *threads_list; ti++) {
      pe_pool *pool;
      OK(pe_pool_new(threads_list[ti], NULL, &pool));
      edges e = make(kind, n, (uint32_t)(kind * 10 + ti));
      pe_dag *g;
      OK(pe_dag_new(n, e.src, e.dst, e.n, &g));
      ck_assert_int_eq(pe_dag_nodes(g), n);
      check_ctx *c = ctx_new(n, &e);
      for (int r = 0; r < rounds; r++) {
        c->round = r;
        OK(pe_dag_run(g, pool, check_node, c));
        ck_assert_msg(atomic_load(&c->violations) == 0, "%s, %d threads, run %d: order violated",
                      kind_name[kind], threads_list[ti], r);
        for (int v = 0; v < n; v++)
          ck_assert_msg(atomic_load(&c->runs[v]) == r + 1, "%s, %d threads, run %d: node %d ran %d",
                        kind_name[kind], threads_list[ti], r, v, atomic_load(&c->runs[v]));
      }
      ctx_free(c);
      pe_dag_free(g);
      pe_pool_free(pool);
      free(e.src);
      free(e.dst);
    }
  }
}
END_TEST

/* Descendants of v (including v) by a forward walk over the edge list. */
static void descendants(int n, const edges *e, int v, bool *mark) {
  memset(mark, 0, (size_t)n);
  mark[v] = true;
  for (bool grew = true; grew;) {
    grew = false;
    for (int i = 0; i < e->n; i++)
      if (mark[e->src[i]] && !mark[e->dst[i]]) mark[e->dst[i]] = grew = true;
  }
}

START_TEST(failure_skips_descendants_only) {
  const int n = 300;
  for (int threads = 1; threads <= 4; threads++) {
    for (int kind = 0; kind < KINDS; kind++) {
      pe_pool *pool;
      OK(pe_pool_new(threads, NULL, &pool));
      edges e = make(kind, n, 99);
      pe_dag *g;
      OK(pe_dag_new(n, e.src, e.dst, e.n, &g));
      check_ctx *c = ctx_new(n, &e);
      bool *desc = malloc((size_t)n);
      c->fail_node = n / 3;
      descendants(n, &e, c->fail_node, desc);
      c->round = 0;
      pe_status *st = pe_dag_run(g, pool, check_node, c);
      ck_assert_int_eq(pe_status_code(st), PE_EBACKEND);
      pe_status_free(st);
      for (int v = 0; v < n; v++)
        ck_assert_msg(atomic_load(&c->runs[v]) == ((v == c->fail_node || !desc[v]) ? 1 : 0),
                      "%s: node %d ran %d times", kind_name[kind], v, atomic_load(&c->runs[v]));
      /* the next run re-arms everything: all run, no error */
      c->fail_node = -1;
      for (int v = 0; v < n; v++) atomic_store(&c->runs[v], 0);
      c->round = 1;
      OK(pe_dag_run(g, pool, check_node, c));
      for (int v = 0; v < n; v++) ck_assert_int_eq(atomic_load(&c->runs[v]), 1);
      ck_assert_int_eq(atomic_load(&c->violations), 0);
      free(desc);
      ctx_free(c);
      pe_dag_free(g);
      pe_pool_free(pool);
      free(e.src);
      free(e.dst);
    }
  }
}
END_TEST

START_TEST(cycles_and_bad_edges_are_rejected) {
  pe_dag *g = (pe_dag *)1;
  int s1[] = {0, 1, 2}, d1[] = {1, 2, 0};
  pe_status *st = pe_dag_new(4, s1, d1, 3, &g);
  ck_assert_int_eq(pe_status_code(st), PE_ECYCLE);
  ck_assert_ptr_null(g);
  pe_status_free(st);
  int s2[] = {0}, d2[] = {0}; /* self loop */
  st = pe_dag_new(1, s2, d2, 1, &g);
  ck_assert_int_eq(pe_status_code(st), PE_ECYCLE);
  pe_status_free(st);
  int s3[] = {0}, d3[] = {5};
  st = pe_dag_new(3, s3, d3, 1, &g);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  st = pe_dag_new(-1, NULL, NULL, 0, &g);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  /* empty graph: runs, does nothing */
  pe_pool *pool;
  OK(pe_pool_new(1, NULL, &pool));
  OK(pe_dag_new(0, NULL, NULL, 0, &g));
  OK(pe_dag_run(g, pool, NULL, NULL));
  pe_dag_free(g);
  pe_pool_free(pool);
  pe_dag_free(NULL);
}
END_TEST

/* A node that tries to start a second run of its own graph, and a pool
 * task that runs a graph on the same pool (it helps while it waits). */
typedef struct nested {
  pe_dag *g, *inner;
  pe_pool *pool;
  atomic_int second_code, inner_code, inner_nodes, done;
  pe_task t;
} nested;

static pe_status *count_node(void *ctx, int v) {
  atomic_fetch_add(&((nested *)ctx)->inner_nodes, 1);
  return NULL;
}

static pe_status *reentrant_node(void *ctx, int v) {
  nested *x = ctx;
  if (v == 0) {
    pe_status *st = pe_dag_run(x->g, x->pool, reentrant_node, x);
    atomic_store(&x->second_code, pe_status_code(st));
    pe_status_free(st);
  }
  return NULL;
}

static void run_inner(void *arg) {
  nested *x = arg;
  pe_status *st = pe_dag_run(x->inner, x->pool, count_node, x);
  atomic_store(&x->inner_code, pe_status_code(st));
  pe_status_free(st);
  atomic_store(&x->done, 1);
}

START_TEST(overlapping_and_nested_runs) {
  for (int threads = 1; threads <= 2; threads++) {
    nested x = {0};
    OK(pe_pool_new(threads, NULL, &x.pool));
    int s[] = {0, 0}, d[] = {1, 2};
    OK(pe_dag_new(3, s, d, 2, &x.g));
    OK(pe_dag_run(x.g, x.pool, reentrant_node, &x));
    ck_assert_int_eq(atomic_load(&x.second_code), PE_EINVAL);
    edges e = make(DIAMOND, 100, 1);
    OK(pe_dag_new(100, e.src, e.dst, e.n, &x.inner));
    x.t = (pe_task){.fn = run_inner, .arg = &x};
    pe_pool_submit(x.pool, &x.t);
    pe_pool_free(x.pool); /* drains: the task and the graph it runs */
    ck_assert_int_eq(atomic_load(&x.done), 1);
    ck_assert_int_eq(atomic_load(&x.inner_code), PE_OK);
    ck_assert_int_eq(atomic_load(&x.inner_nodes), 100);
    pe_dag_free(x.g);
    pe_dag_free(x.inner);
    free(e.src);
    free(e.dst);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_run");
  TCase *tc = tcase_create("graph");
  tcase_add_test(tc, every_node_once_after_its_predecessors);
  tcase_add_test(tc, failure_skips_descendants_only);
  tcase_add_test(tc, cycles_and_bad_edges_are_rejected);
  tcase_add_test(tc, overlapping_and_nested_runs);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
