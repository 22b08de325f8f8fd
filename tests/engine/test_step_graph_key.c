/* Captured steps' bookkeeping (engine/step_graph_key.h): which steps share a
 * key, the warm-up / capture / replay order, fallbacks with their reason,
 * invalidation and eviction, and the option's decision. Device-independent:
 * the graphs here are tokens whose frees are counted. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "engine/step_graph_key.h"
#include "ops/registry.h"

/* A key for program p on kind:n, one feed "x" of dims {rows, 8}, fetches. */
static void make_key(pe_step_key *k, uint64_t p, pe_place_kind kind, int n, int64_t rows,
                     const char *const *fetch, int n_fetch) {
  int64_t dims[2] = {rows, 8};
  pe_step_key_init(k, p, kind, n);
  pe_step_key_feed(k, "x", 1, dims, 2);
  pe_step_key_fetches(k, fetch, n_fetch);
  ck_assert_ptr_null(pe_step_key_done(k));
}

static const char *const loss[] = {"loss"};
static const char *const loss_acc[] = {"loss", "acc"};
static const char *const acc_loss[] = {"acc", "loss"};

START_TEST(keys_differ_in_every_part) {
  pe_step_key base, k;
  make_key(&base, 7, PE_PLACE_CUDA, 1, 64, loss, 1);
  make_key(&k, 7, PE_PLACE_CUDA, 1, 64, loss, 1);
  ck_assert(pe_step_key_equal(&base, &k));
  pe_step_key_release(&k);
  struct {
    uint64_t p;
    pe_place_kind kind;
    int n;
    int64_t rows;
    const char *const *f;
    int nf;
  } other[] = {
      {8, PE_PLACE_CUDA, 1, 64, loss, 1},     /* program */
      {7, PE_PLACE_SIM, 1, 64, loss, 1},      /* place kind */
      {7, PE_PLACE_CUDA, 2, 64, loss, 1},     /* place count */
      {7, PE_PLACE_CUDA, 1, 32, loss, 1},     /* batch shape */
      {7, PE_PLACE_CUDA, 1, 64, loss_acc, 2}, /* fetch set */
  };
  for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
    make_key(&k, other[i].p, other[i].kind, other[i].n, other[i].rows, other[i].f, other[i].nf);
    ck_assert_msg(!pe_step_key_equal(&base, &k), "case %zu", i);
    pe_step_key_release(&k);
  }
  /* The fetch order is part of the key: fetched[i] is fetch[i]. */
  pe_step_key a, b;
  make_key(&a, 7, PE_PLACE_CUDA, 1, 64, loss_acc, 2);
  make_key(&b, 7, PE_PLACE_CUDA, 1, 64, acc_loss, 2);
  ck_assert(!pe_step_key_equal(&a, &b));
  pe_step_key_release(&a);
  pe_step_key_release(&b);
  pe_step_key_release(&base);
}
END_TEST

START_TEST(names_do_not_run_together) {
  /* Feed "ab" with fetch "c" against feed "a" with fetch "bc", and a feed
   * name against the same text as a fetch. */
  int64_t d[1] = {4};
  pe_step_key a, b;
  pe_step_key_init(&a, 1, PE_PLACE_CUDA, 1);
  pe_step_key_feed(&a, "ab", 1, d, 1);
  const char *const c[] = {"c"}, *const bc[] = {"bc"};
  pe_step_key_fetches(&a, c, 1);
  pe_step_key_init(&b, 1, PE_PLACE_CUDA, 1);
  pe_step_key_feed(&b, "a", 1, d, 1);
  pe_step_key_fetches(&b, bc, 1);
  ck_assert_ptr_null(pe_step_key_done(&a));
  ck_assert_ptr_null(pe_step_key_done(&b));
  ck_assert(!pe_step_key_equal(&a, &b));
  pe_step_key_release(&a);
  pe_step_key_release(&b);
}
END_TEST

static int freed;
static void free_token(void *g) {
  ck_assert_ptr_nonnull(g);
  freed++;
}

static pe_step_action step(pe_step_graphs *c, const pe_step_key *k, void **g, const char **why) {
  pe_step_action a;
  ck_assert_ptr_null(pe_step_graphs_lookup(c, k, &a, g, why));
  return a;
}

START_TEST(warmup_capture_replay) {
  freed = 0;
  pe_step_graphs *c;
  ck_assert_ptr_null(pe_step_graphs_new(4, free_token, &c));
  pe_step_key k;
  make_key(&k, 1, PE_PLACE_CUDA, 1, 64, loss, 1);
  void *g;
  const char *why;
  int token;
  ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_WARMUP);
  ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_CAPTURE);
  pe_step_graphs_store(c, &k, &token);
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_REPLAY);
    ck_assert_ptr_eq(g, &token);
  }
  pe_step_graph_stats st;
  pe_step_graphs_stats(c, &st);
  ck_assert_int_eq(st.captures, 1);
  ck_assert_int_eq(st.replays, 3);
  ck_assert_int_eq(st.keys, 1);
  pe_step_key_release(&k);
  pe_step_graphs_free(c);
  ck_assert_int_eq(freed, 1);
}
END_TEST

START_TEST(shape_change_captures_its_own_graph) {
  freed = 0;
  pe_step_graphs *c;
  ck_assert_ptr_null(pe_step_graphs_new(4, free_token, &c));
  pe_step_key k64, k32;
  make_key(&k64, 1, PE_PLACE_CUDA, 1, 64, loss, 1);
  make_key(&k32, 1, PE_PLACE_CUDA, 1, 32, loss, 1);
  void *g;
  const char *why;
  int t64, t32;
  step(c, &k64, &g, &why);
  ck_assert_int_eq(step(c, &k64, &g, &why), PE_STEP_CAPTURE);
  pe_step_graphs_store(c, &k64, &t64);
  /* The last batch of an epoch is smaller: it warms up and captures anew. */
  ck_assert_int_eq(step(c, &k32, &g, &why), PE_STEP_WARMUP);
  ck_assert_int_eq(step(c, &k32, &g, &why), PE_STEP_CAPTURE);
  pe_step_graphs_store(c, &k32, &t32);
  ck_assert_int_eq(step(c, &k64, &g, &why), PE_STEP_REPLAY);
  ck_assert_ptr_eq(g, &t64);
  ck_assert_int_eq(step(c, &k32, &g, &why), PE_STEP_REPLAY);
  ck_assert_ptr_eq(g, &t32);
  pe_step_key_release(&k64);
  pe_step_key_release(&k32);
  pe_step_graphs_free(c);
  ck_assert_int_eq(freed, 2);
}
END_TEST

START_TEST(invalidation_recaptures) {
  static const pe_step_invalidation kinds[] = {PE_STEP_INVALID_PROGRAM, PE_STEP_INVALID_PLACES,
                                               PE_STEP_INVALID_PARAMS};
  for (int i = 0; i < 3; i++) {
    freed = 0;
    pe_step_graphs *c;
    ck_assert_ptr_null(pe_step_graphs_new(4, free_token, &c));
    pe_step_key k;
    make_key(&k, 1, PE_PLACE_CUDA, 1, 64, loss, 1);
    void *g;
    const char *why;
    int t1, t2;
    step(c, &k, &g, &why);
    step(c, &k, &g, &why);
    pe_step_graphs_store(c, &k, &t1);
    ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_REPLAY);
    pe_step_graphs_invalidate(c, kinds[i]);
    ck_assert_int_eq(freed, 1); /* the stale graph is freed at once */
    ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_WARMUP);
    ck_assert_ptr_null(g);
    ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_CAPTURE);
    pe_step_graphs_store(c, &k, &t2);
    ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_REPLAY);
    ck_assert_ptr_eq(g, &t2);
    pe_step_graph_stats st;
    pe_step_graphs_stats(c, &st);
    ck_assert_int_eq(st.invalidations, 1);
    ck_assert_int_eq(st.captures, 2);
    pe_step_key_release(&k);
    pe_step_graphs_free(c);
    ck_assert_int_eq(freed, 2);
  }
}
END_TEST

START_TEST(refused_key_falls_back_with_reason_until_invalidated) {
  freed = 0;
  pe_step_graphs *c;
  ck_assert_ptr_null(pe_step_graphs_new(4, free_token, &c));
  pe_step_key k;
  make_key(&k, 1, PE_PLACE_CUDA, 1, 64, loss, 1);
  void *g;
  const char *why;
  step(c, &k, &g, &why);
  ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_CAPTURE);
  char msg[64];
  strcpy(msg, "op 3 (top_k) cannot be captured: it syncs the host");
  pe_step_graphs_refuse(c, &k, msg);
  memset(msg, 0, sizeof msg); /* the cache keeps its own copy */
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_FALLBACK);
    ck_assert_str_eq(why, "op 3 (top_k) cannot be captured: it syncs the host");
  }
  pe_step_graph_stats st;
  pe_step_graphs_stats(c, &st);
  ck_assert_int_eq(st.fallbacks, 2);
  ck_assert_str_eq(st.last_reason, "op 3 (top_k) cannot be captured: it syncs the host");
  pe_step_graphs_invalidate(c, PE_STEP_INVALID_PROGRAM);
  ck_assert_int_eq(step(c, &k, &g, &why), PE_STEP_WARMUP);
  pe_step_key_release(&k);
  pe_step_graphs_free(c);
  ck_assert_int_eq(freed, 0);
}
END_TEST

START_TEST(least_recently_used_key_is_evicted) {
  freed = 0;
  pe_step_graphs *c;
  ck_assert_ptr_null(pe_step_graphs_new(2, free_token, &c));
  pe_step_key k[3];
  int t[3];
  void *g;
  const char *why;
  for (int i = 0; i < 2; i++) {
    make_key(&k[i], 1, PE_PLACE_CUDA, 1, 10 + i, loss, 1);
    step(c, &k[i], &g, &why);
    step(c, &k[i], &g, &why);
    pe_step_graphs_store(c, &k[i], &t[i]);
  }
  ck_assert_int_eq(step(c, &k[0], &g, &why), PE_STEP_REPLAY); /* k[1] is now the oldest */
  make_key(&k[2], 1, PE_PLACE_CUDA, 1, 12, loss, 1);
  ck_assert_int_eq(step(c, &k[2], &g, &why), PE_STEP_WARMUP);
  ck_assert_int_eq(freed, 1);
  ck_assert_int_eq(step(c, &k[0], &g, &why), PE_STEP_REPLAY);
  ck_assert_ptr_eq(g, &t[0]);
  ck_assert_int_eq(step(c, &k[1], &g, &why), PE_STEP_WARMUP);
  pe_step_graph_stats st;
  pe_step_graphs_stats(c, &st);
  ck_assert_int_eq(st.keys, 2);
  ck_assert_int_eq(st.evictions, 2);
  for (int i = 0; i < 3; i++) pe_step_key_release(&k[i]);
  pe_step_graphs_free(c);
  ck_assert_int_eq(freed, 2);
}
END_TEST

START_TEST(option_decides_with_reason) {
  pe_cuda_graph_mode m;
  ck_assert(pe_cuda_graph_mode_parse("on", &m) && m == PE_CUDA_GRAPH_ON);
  ck_assert(pe_cuda_graph_mode_parse("off", &m) && m == PE_CUDA_GRAPH_OFF);
  ck_assert(pe_cuda_graph_mode_parse("auto", &m) && m == PE_CUDA_GRAPH_AUTO);
  ck_assert(!pe_cuda_graph_mode_parse("yes", &m));
  ck_assert(!pe_cuda_graph_mode_parse(NULL, &m));
  const char *why;
  ck_assert(!pe_cuda_graph_decide(PE_CUDA_GRAPH_OFF, PE_PLACE_CUDA, 1, true, &why));
  ck_assert_str_eq(why, "off by option");
  ck_assert(!pe_cuda_graph_decide(PE_CUDA_GRAPH_ON, PE_PLACE_CPU, 1, true, &why));
  ck_assert_str_eq(why, "no cuda place");
  ck_assert(!pe_cuda_graph_decide(PE_CUDA_GRAPH_ON, PE_PLACE_CUDA, 1, false, &why));
  ck_assert_ptr_nonnull(strstr(why, "no cuda backend"));
  ck_assert(pe_cuda_graph_decide(PE_CUDA_GRAPH_ON, PE_PLACE_CUDA, 2, true, &why));
  ck_assert_ptr_null(why);
  ck_assert(!pe_cuda_graph_decide(PE_CUDA_GRAPH_ON, PE_PLACE_SIM, 1, true, &why));
  ck_assert_str_eq(why, "no cuda place");
  /* auto: one cuda place captures, several do not (NCCL in a capture has
   * not run on two GPUs), and neither does a cpu place. */
  ck_assert(pe_cuda_graph_decide(PE_CUDA_GRAPH_AUTO, PE_PLACE_CUDA, 1, true, &why));
  ck_assert_ptr_null(why);
  ck_assert(!pe_cuda_graph_decide(PE_CUDA_GRAPH_AUTO, PE_PLACE_CUDA, 2, true, &why));
  ck_assert_ptr_nonnull(strstr(why, "two GPUs"));
  ck_assert(!pe_cuda_graph_decide(PE_CUDA_GRAPH_AUTO, PE_PLACE_CPU, 1, true, &why));
  ck_assert_str_eq(why, "no cuda place");
  ck_assert(!pe_cuda_graph_decide(PE_CUDA_GRAPH_AUTO, PE_PLACE_CUDA, 1, false, &why));
  ck_assert_ptr_nonnull(strstr(why, "no cuda backend"));
}
END_TEST

/* Each host-side demand of a run names itself; a plain run passes. */
START_TEST(run_demands_refuse_with_reason) {
  const char *why = "unset";
  pe_step_graph_run plain = {0};
  ck_assert(pe_step_graph_run_capturable(&plain, &why));
  ck_assert_ptr_null(why);
  struct {
    pe_step_graph_run r;
    const char *names;
  } cases[] = {
      {{.check_nan_inf = true}, "check_nan_inf"},    {{.timeline = true}, "timeline"},
      {{.test_hooks = true}, "node hooks"},          {{.cross_nodes = true}, "across nodes"},
      {{.producer_sync = true}, "producer streams"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ck_assert(!pe_step_graph_run_capturable(&cases[i].r, &why));
    ck_assert_ptr_nonnull(why);
    ck_assert_msg(strstr(why, cases[i].names), "case %zu: %s", i, why);
  }
}
END_TEST

/* Random ops with a device-read counter are capturable; another random op
 * is refused (its offset argument would repeat); plain ops pass. */
START_TEST(random_ops_capturable_only_with_device_counter) {
  const char *why = "unset";
  ck_assert(pe_step_graph_op_capturable("dropout", PE_OP_RANDOM, &why));
  ck_assert_ptr_null(why);
  ck_assert(pe_step_graph_op_capturable("uniform_random", PE_OP_RANDOM, &why));
  ck_assert(pe_step_graph_op_capturable("gaussian_random", PE_OP_RANDOM, &why));
  ck_assert(pe_step_graph_op_capturable("matmul", 0, &why));
  ck_assert(!pe_step_graph_op_capturable("randint", PE_OP_RANDOM, &why));
  ck_assert_ptr_nonnull(strstr(why, "counter offset as a kernel argument"));
  ck_assert(!pe_step_graph_rng_op_counted("randint"));
  ck_assert(pe_step_graph_rng_op_counted("dropout"));
}
END_TEST

/* Every op the registry marks random has a cuda kernel that reads the
 * device counter: none is captured with a frozen offset, and none is
 * refused for it. */
START_TEST(registry_random_ops_are_counted) {
  int random = 0;
  for (int i = 0; i < pe_op_count(); i++) {
    const pe_op_def *d = pe_op_at(i);
    if (!(d->flags & PE_OP_RANDOM)) continue;
    random++;
    const char *why;
    ck_assert_msg(pe_step_graph_op_capturable(d->type, d->flags, &why), "%s: %s", d->type, why);
  }
  ck_assert_int_ge(random, 3);
}
END_TEST

/* gaussian_random needs every replay at the capture's parity. */
START_TEST(gaussian_needs_even_counters_per_step) {
  const char *why = "unset";
  ck_assert(pe_step_graph_rng_capturable(true, 64, &why));
  ck_assert_ptr_null(why);
  ck_assert(!pe_step_graph_rng_capturable(true, 65, &why));
  ck_assert_ptr_nonnull(strstr(why, "parity"));
  ck_assert(pe_step_graph_rng_capturable(false, 65, &why));
}
END_TEST

/* A replaced parameter buffer is seen; equal addresses are not. */
START_TEST(moved_buffers_detected) {
  int a, b, c;
  const void *then[] = {&a, &b};
  const void *same[] = {&a, &b};
  const void *moved[] = {&a, &c};
  ck_assert(!pe_step_graph_buffers_moved(then, same, 2));
  ck_assert(pe_step_graph_buffers_moved(then, moved, 2));
  ck_assert(!pe_step_graph_buffers_moved(then, moved, 1));
}
END_TEST

static Suite *step_graph_key_suite(void) {
  Suite *s = suite_create("step_graph_key");
#define ADD(fn)                    \
  do {                             \
    TCase *tc = tcase_create(#fn); \
    tcase_add_test(tc, fn);        \
    suite_add_tcase(s, tc);        \
  } while (0)
  ADD(keys_differ_in_every_part);
  ADD(names_do_not_run_together);
  ADD(warmup_capture_replay);
  ADD(shape_change_captures_its_own_graph);
  ADD(invalidation_recaptures);
  ADD(refused_key_falls_back_with_reason_until_invalidated);
  ADD(least_recently_used_key_is_evicted);
  ADD(option_decides_with_reason);
  ADD(run_demands_refuse_with_reason);
  ADD(random_ops_capturable_only_with_device_counter);
  ADD(registry_random_ops_are_counted);
  ADD(gaussian_needs_even_counters_per_step);
  ADD(moved_buffers_detected);
#undef ADD
  return s;
}

PE_CHECK_MAIN(step_graph_key_suite)
