/* The executor's sums across the nodes of a job (parallel/cross.c), with a
 * communicator table of the test's own (engine/node_comm.h), no network:
 *  - "two identical nodes": the table doubles every buffer (the peer's
 *    gradient is this node's). The loss seed is halved (2 nodes), so the
 *    model trains bit for bit as without a job; the all-reduces come in the
 *    same order every step, one call per all-reduce node;
 *  - a failing exchange fails the step naming it, and the step updates no
 *    parameter (the all-reduce nodes complete together);
 *  - with one pool worker, the backward pass runs on while an exchange
 *    waits on the peers (the exchange thread sums, not the worker).
 * cpu:1 and cpu:2, with and without fused buckets.
 *  - the device path (pe_model_set_node_dcomm, cuda's NCCL in the daemon)
 *    on sim:1: the gradients go to the device table after the place's comm
 *    stream, the step's rows to the host table; the model trains bit for
 *    bit as without a job, and a failing device exchange updates nothing;
 *  - which path a model's places take (pe_node_comm_path_of). */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "engine/node_comm.h"
#include "par_test_util.h"

#define MAXCALLS 64

/* The test's communicator: doubles, records the calls, fails call fail_at. */
typedef struct fake {
  int calls;               /* this step's */
  int64_t sizes[MAXCALLS]; /* elements of each of this step's calls */
  int64_t first[MAXCALLS]; /* the first step's */
  int n_first;
  int fail_at; /* 1-based call of a step to fail; 0: never */
  int failed_steps;
} fake;

static pe_status *fake_all_reduce(void *ctx, float *const *bufs, const size_t *counts, int nbuf) {
  fake *f = ctx;
  int64_t total = 0;
  for (int i = 0; i < nbuf; i++) total += (int64_t)counts[i];
  if (f->calls < MAXCALLS) f->sizes[f->calls] = total;
  f->calls++;
  if (f->fail_at && f->calls == f->fail_at)
    return pe_error(PE_EIO, "fake: lost peer rank 1 (connection closed)");
  for (int i = 0; i < nbuf; i++)
    for (size_t k = 0; k < counts[i]; k++) bufs[i][k] *= 2.0f;
  return NULL;
}

static void fake_fail(void *ctx, const char *why) {
  (void)why;
  ((fake *)ctx)->failed_steps++;
}

static void par_new_cross(par *q, pe_runtime *rt, int n, bool fuse, uint64_t seed) {
  pe_pass_opts o = {.place_kind = PE_PLACE_CPU,
                    .n_places = n,
                    .strategy = PE_STRATEGY_ALLREDUCE,
                    .fuse = fuse,
                    .fuse_bucket_bytes = 256,
                    .cross_nodes = true};
  par_new_opts(q, rt, &o, seed);
}

/* The graph's all-reduce nodes (what the executor sums across nodes). */
static int all_reduces(par *q) {
  const pe_graph *g = pe_par_exec_graph(q->step);
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++)
    k += g->nodes[i].kind == PE_NODE_ALL_REDUCE || g->nodes[i].kind == PE_NODE_FUSED_ALL_REDUCE;
  return k;
}

/* Every persistable of a equals b's, bit for bit. */
static void assert_same_values(par *a, par *b) {
  const char **names;
  int n;
  PE_CK_OK(pe_model_names(a->m, &names, &n));
  ck_assert_int_gt(n, 4);
  for (int i = 0; i < n; i++) {
    pe_tensor ta, tb;
    pe_tensor_init(&ta);
    pe_tensor_init(&tb);
    PE_CK_OK(pe_model_get(a->m, names[i], &ta));
    PE_CK_OK(pe_model_get(b->m, names[i], &tb));
    ck_assert_uint_eq(pe_tensor_bytes(&ta), pe_tensor_bytes(&tb));
    ck_assert_msg(!memcmp(ta.data, tb.data, pe_tensor_bytes(&ta)), "'%s' differs", names[i]);
    pe_tensor_release(&ta);
    pe_tensor_release(&tb);
  }
  free(names);
}

static void trains_as_without_a_job(int places, bool fuse) {
  pe_runtime *rt = rt_new(2);
  par job, plain;
  par_new_cross(&job, rt, places, fuse, 7);
  par_new(&plain, rt, PE_PLACE_CPU, places, PE_STRATEGY_ALLREDUCE, fuse, 7);
  fake f = {0};
  pe_node_comm c = {&f, 0, 2, fake_all_reduce, fake_fail};
  pe_model_set_node_comm(job.m, &c);
  PE_CK_OK(pe_par_exec_run(job.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  PE_CK_OK(pe_par_exec_run(plain.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  int nodes = all_reduces(&job);
  ck_assert_int_gt(nodes, 0);
  for (int step = 0; step < 3; step++) {
    f.calls = 0;
    par_step(&job, step, 12, NULL);
    par_step(&plain, step, 12, NULL);
    /* The step's row count (one element), then one per all-reduce node. */
    ck_assert_int_eq(f.calls, nodes + 1);
    ck_assert_int_eq(f.sizes[0], 1);
    if (step == 0) {
      memcpy(f.first, f.sizes, sizeof f.sizes);
      f.n_first = f.calls;
    } else {
      ck_assert_msg(!memcmp(f.first, f.sizes, (size_t)f.n_first * sizeof(int64_t)),
                    "step %d: the all-reduces came in another order", step);
    }
    assert_same_values(&job, &plain);
  }
  ck_assert_int_eq(f.failed_steps, 0);
  par_free(&job);
  par_free(&plain);
  pe_runtime_free(rt);
}

START_TEST(cpu1_trains_as_without_a_job) {
  trains_as_without_a_job(1, false);
}
END_TEST
START_TEST(cpu2_trains_as_without_a_job) {
  trains_as_without_a_job(2, false);
}
END_TEST
START_TEST(cpu2_fused_trains_as_without_a_job) {
  trains_as_without_a_job(2, true);
}
END_TEST

/* A model on cpu:places (no fused buckets, seed 7) in a job of 2 over the
 * fake f (c: its table), initialised; returns its runtime. */
static pe_runtime *join_fake(par *q, int places, fake *f, pe_node_comm *c) {
  pe_runtime *rt = rt_new(2);
  *c = (pe_node_comm){f, 0, 2, fake_all_reduce, fake_fail};
  par_new_cross(q, rt, places, false, 7);
  pe_model_set_node_comm(q->m, c);
  PE_CK_OK(pe_par_exec_run(q->init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  return rt;
}

/* A step of 12 rows that must fail: its error. */
static pe_status *failing_step(par *q, int step) {
  float x[MAXB * DIM];
  int64_t y[MAXB];
  make_batch(step, 12, x, y);
  pe_tensor xt, yt, out;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_init(&out);
  pe_shape xs = PE_SHAPE(12, DIM), ys = PE_SHAPE(12, 1);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_tensor_view(&yt, PE_I64, &ys, y);
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  pe_status *st = pe_par_exec_run(q->step, feeds, 2, &LOSS, 1, &out, NULL, NULL);
  pe_tensor_release(&out);
  ck_assert_ptr_nonnull(st);
  return st;
}

/* A step's timeline has one "across nodes" span per all-reduce node: the
 * exchange's time, apart from the sums over the node's places. */
START_TEST(timeline_names_the_exchange) {
  par job;
  fake f = {0};
  pe_node_comm c;
  pe_runtime *rt = join_fake(&job, 2, &f, &c);
  pe_timeline *tl;
  PE_CK_OK(pe_timeline_new(16, 4096, &tl));
  pe_run_opts ro = {.timeline = tl};
  par_step(&job, 0, 12, &ro);
  char *json;
  PE_CK_OK(pe_timeline_json(tl, &json, NULL));
  int spans = 0;
  for (const char *p = json; (p = strstr(p, "\"across nodes all_reduce(")); p++) spans++;
  ck_assert_int_eq(spans, all_reduces(&job));
  free(json);
  pe_timeline_free(tl);
  par_free(&job);
  pe_runtime_free(rt);
}
END_TEST

/* The second exchange of step 1 fails: the run's error names it, and no
 * parameter moved in that step. */
START_TEST(failed_exchange_updates_nothing) {
  par job;
  fake f = {0};
  pe_node_comm c;
  pe_runtime *rt = join_fake(&job, 1, &f, &c);
  par_step(&job, 0, 12, NULL);
  par before;
  before.m = NULL;
  pe_runtime *rt2 = rt_new(1);
  par_new(&before, rt2, PE_PLACE_CPU, 1, PE_STRATEGY_ALLREDUCE, false, 7);
  const char **names;
  int n;
  PE_CK_OK(pe_model_names(job.m, &names, &n));
  for (int i = 0; i < n; i++) { /* a copy of the values after step 0 */
    pe_tensor t;
    pe_tensor_init(&t);
    PE_CK_OK(pe_model_get(job.m, names[i], &t));
    PE_CK_OK(pe_model_set(before.m, names[i], &t));
    pe_tensor_release(&t);
  }
  free(names);
  f.calls = 0;
  f.fail_at = 2;
  pe_status *st = failing_step(&job, 1);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(strstr(pe_status_msg(st), "summing the gradients across the job's 2 nodes") &&
                    strstr(pe_status_msg(st), "lost peer rank 1"),
                "%s", pe_status_msg(st));
  pe_status_free(st);
  /* The row count, the failed one, and none after it. */
  ck_assert_int_eq(f.calls, 2);
  assert_same_values(&job, &before);
  par_free(&job);
  par_free(&before);
  pe_runtime_free(rt);
  pe_runtime_free(rt2);
}
END_TEST

/* The overlap test. The step's nodes that need no sum across nodes (the
 * forward and backward passes: no all-reduce is among their inputs,
 * directly or not) are counted as they end. The first gradient exchange of
 * a step (call 2, after the row count) blocks until all of them ended, or
 * the guard runs out. Both checks are free of timing:
 *  - the first all-reduce began (posted its gradient) while some of them
 *    had not ended: the scheduler runs an all-reduce as soon as it is ready;
 *  - they all ended while the exchange was blocked: the exchange does not
 *    hold the one pool worker (with the sums on the worker, the backward
 *    pass would wait for the guard). */
enum { OVERLAP_GUARD_S = 20 };
typedef struct blocking {
  fake f;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const bool *compute; /* [node]: needs no sum across nodes */
  int n_compute;
  int first_ar;         /* the first all-reduce node (node order) */
  int ended;            /* compute nodes ended this step */
  int ended_at_post;    /* when first_ar began; -1: not yet */
  bool waited_them_out; /* the blocked exchange saw them all end */
} blocking;

static pe_status *blocking_all_reduce(void *ctx, float *const *bufs, const size_t *counts,
                                      int nbuf) {
  blocking *b = ctx;
  if (b->f.calls == 1) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += OVERLAP_GUARD_S;
    pthread_mutex_lock(&b->mu);
    while (b->ended < b->n_compute && pthread_cond_timedwait(&b->cv, &b->mu, &until) == 0) {
    }
    b->waited_them_out = b->ended == b->n_compute;
    pthread_mutex_unlock(&b->mu);
  }
  return fake_all_reduce(&b->f, bufs, counts, nbuf);
}

static void blocking_fail(void *ctx, const char *why) {
  fake_fail(&((blocking *)ctx)->f, why);
}

static void overlap_hook(void *arg, int node, bool done) {
  blocking *b = arg;
  pthread_mutex_lock(&b->mu);
  if (!done && node == b->first_ar) b->ended_at_post = b->ended;
  if (done && b->compute[node]) {
    b->ended++;
    pthread_cond_broadcast(&b->cv);
  }
  pthread_mutex_unlock(&b->mu);
}

/* compute[i]: node i of g is no all-reduce and has none upstream; their
 * number. *first: the first all-reduce. */
static int compute_nodes(const pe_graph *g, bool *compute, int *first) {
  bool *after = calloc((size_t)g->n_nodes, sizeof *after); /* an all-reduce or downstream */
  *first = -1;
  for (int i = 0; i < g->n_nodes; i++) { /* node order is a topological order */
    const pe_graph_node *n = &g->nodes[i];
    bool ar = n->kind == PE_NODE_ALL_REDUCE || n->kind == PE_NODE_FUSED_ALL_REDUCE;
    if (ar && *first < 0) *first = i;
    if (ar) after[i] = true;
    for (int k = 0; after[i] && k < n->n_succ; k++) after[n->succ[k]] = true;
  }
  int count = 0;
  for (int i = 0; i < g->n_nodes; i++) count += compute[i] = !after[i];
  free(after);
  return count;
}

/* One pool worker: the first all-reduce posts its gradient before the
 * backward pass is done, the backward pass ends while that exchange waits
 * on the peers (it runs on the executor's exchange thread), and the steps
 * train as without a job. */
START_TEST(one_worker_overlaps_the_exchange) {
  pe_runtime *rt = rt_new(1);
  par job, plain;
  par_new_cross(&job, rt, 1, false, 7);
  par_new(&plain, rt, PE_PLACE_CPU, 1, PE_STRATEGY_ALLREDUCE, false, 7);
  const pe_graph *g = pe_par_exec_graph(job.step);
  bool *compute = calloc((size_t)g->n_nodes, sizeof *compute);
  blocking b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  b.compute = compute;
  b.n_compute = compute_nodes(g, compute, &b.first_ar);
  ck_assert_int_ge(b.first_ar, 0);
  pe_node_comm c = {&b, 0, 2, blocking_all_reduce, blocking_fail};
  pe_model_set_node_comm(job.m, &c);
  PE_CK_OK(pe_par_exec_run(job.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  PE_CK_OK(pe_par_exec_run(plain.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  ck_assert_int_gt(all_reduces(&job), 1);
  pe_run_opts ro = {.node_hook = overlap_hook, .hook_arg = &b};
  for (int step = 0; step < 3; step++) {
    b.f.calls = 0;
    b.ended = 0;
    b.ended_at_post = -1;
    b.waited_them_out = false;
    par_step(&job, step, 12, &ro);
    par_step(&plain, step, 12, NULL);
    ck_assert_msg(b.ended_at_post >= 0 && b.ended_at_post < b.n_compute,
                  "step %d: the first all-reduce began after %d of the %d compute nodes ended",
                  step, b.ended_at_post, b.n_compute);
    ck_assert_msg(b.waited_them_out,
                  "step %d: the backward pass did not end while the exchange waited (%d of %d)",
                  step, b.ended, b.n_compute);
    assert_same_values(&job, &plain);
  }
  ck_assert_int_eq(b.f.failed_steps, 0);
  free(compute);
  par_free(&job);
  par_free(&plain);
  pe_runtime_free(rt);
}
END_TEST

/* The test's device communicator on sim places: NCCL's across nodes runs
 * on place 0's comm stream after the sum over the places; here the table
 * waits for that stream, then doubles like the fake. */
typedef struct dfake {
  fake f;
  pe_model *m;
} dfake;

static pe_status *dfake_all_reduce(void *ctx, float *const *bufs, const size_t *counts, int nbuf) {
  dfake *d = ctx;
  PE_TRY(pe_stream_sync(pe_device_stream(pe_model_devices(d->m)[0], PE_STREAM_COMM)));
  return fake_all_reduce(&d->f, bufs, counts, nbuf);
}

static void dfake_fail(void *ctx, const char *why) {
  fake_fail(&((dfake *)ctx)->f, why);
}

/* A sim:1 model in a job of 2 (rows over host, gradients over dev) and
 * the same model without a job (plain), both initialised. */
typedef struct sim1 {
  pe_runtime *rt;
  par job, plain;
  fake host;
  dfake dev;
  pe_node_comm hc, dc;
} sim1;

static void sim1_new(sim1 *t) {
  memset(t, 0, sizeof *t);
  t->rt = rt_new(2);
  pe_pass_opts o = {.place_kind = PE_PLACE_SIM,
                    .n_places = 1,
                    .strategy = PE_STRATEGY_ALLREDUCE,
                    .cross_nodes = true};
  par_new_opts(&t->job, t->rt, &o, 7);
  t->dev.m = t->job.m;
  t->hc = (pe_node_comm){&t->host, 0, 2, fake_all_reduce, fake_fail};
  t->dc = (pe_node_comm){&t->dev, 0, 2, dfake_all_reduce, dfake_fail};
  pe_model_set_node_comm(t->job.m, &t->hc);
  pe_model_set_node_dcomm(t->job.m, &t->dc);
  PE_CK_OK(pe_par_exec_run(t->job.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  par_new(&t->plain, t->rt, PE_PLACE_SIM, 1, PE_STRATEGY_ALLREDUCE, false, 7);
  PE_CK_OK(pe_par_exec_run(t->plain.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
}

static void sim1_free(sim1 *t) {
  par_free(&t->job);
  par_free(&t->plain);
  pe_runtime_free(t->rt);
}

START_TEST(sim1_device_path_trains_as_without_a_job) {
  sim1 t;
  sim1_new(&t);
  int nodes = all_reduces(&t.job);
  ck_assert_int_gt(nodes, 0);
  for (int step = 0; step < 3; step++) {
    t.host.calls = t.dev.f.calls = 0;
    par_step(&t.job, step, 12, NULL);
    par_step(&t.plain, step, 12, NULL);
    /* The row count on the host table, every gradient on the device's. */
    ck_assert_int_eq(t.host.calls, 1);
    ck_assert_int_eq(t.host.sizes[0], 1);
    ck_assert_int_eq(t.dev.f.calls, nodes);
    assert_same_values(&t.job, &t.plain);
  }
  ck_assert_int_eq(t.host.failed_steps + t.dev.f.failed_steps, 0);
  sim1_free(&t);
}
END_TEST

/* The device exchange fails in step 1: the error names it, and the model
 * holds its values after step 0 (those of a model without a job). */
START_TEST(sim1_failed_device_exchange_updates_nothing) {
  sim1 t;
  sim1_new(&t);
  par_step(&t.job, 0, 12, NULL);
  par_step(&t.plain, 0, 12, NULL);
  t.dev.f.calls = 0;
  t.dev.f.fail_at = 2;
  pe_status *st = failing_step(&t.job, 1);
  ck_assert_msg(strstr(pe_status_msg(st), "summing the gradients across the job's 2 nodes") &&
                    strstr(pe_status_msg(st), "lost peer rank 1"),
                "%s", pe_status_msg(st));
  pe_status_free(st);
  ck_assert_int_eq(t.dev.f.calls, 2); /* the failed one, and none after it */
  assert_same_values(&t.job, &t.plain);
  sim1_free(&t);
}
END_TEST

/* A run of a sim model in a job without a device table is refused, naming
 * the places. */
START_TEST(sim_without_device_comm_is_refused) {
  pe_runtime *rt = rt_new(2);
  par job;
  fake host = {0};
  pe_node_comm hc = {&host, 0, 2, fake_all_reduce, fake_fail};
  pe_pass_opts o = {.place_kind = PE_PLACE_SIM,
                    .n_places = 1,
                    .strategy = PE_STRATEGY_ALLREDUCE,
                    .cross_nodes = true};
  par_new_opts(&job, rt, &o, 7);
  pe_model_set_node_comm(job.m, &hc);
  PE_CK_OK(pe_par_exec_run(job.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  pe_status *st = failing_step(&job, 0);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(strstr(pe_status_msg(st), "sim:1"), "%s", pe_status_msg(st));
  pe_status_free(st);
  ck_assert_int_eq(host.calls, 0);
  par_free(&job);
  pe_runtime_free(rt);
}
END_TEST

/* Which path: cpu sums on the host; a kind on streams with a device table
 * on the devices; anything else is refused naming the places. */
START_TEST(path_of_places) {
  pe_node_comm_path p = PE_NODE_COMM_DEVICE;
  PE_CK_OK(pe_node_comm_path_of(PE_PLACE_CPU, 2, false, false, &p));
  ck_assert_int_eq(p, PE_NODE_COMM_HOST);
  PE_CK_OK(pe_node_comm_path_of(PE_PLACE_CPU, 1, false, true, &p));
  ck_assert_int_eq(p, PE_NODE_COMM_HOST);
  PE_CK_OK(pe_node_comm_path_of(PE_PLACE_CUDA, 2, true, true, &p));
  ck_assert_int_eq(p, PE_NODE_COMM_DEVICE);
  PE_CK_OK(pe_node_comm_path_of(PE_PLACE_SIM, 1, true, true, &p));
  ck_assert_int_eq(p, PE_NODE_COMM_DEVICE);
  struct {
    pe_place_kind kind;
    int n;
    bool streams, dev;
    const char *names;
  } bad[] = {{PE_PLACE_CUDA, 2, true, false, "cuda:2"},
             {PE_PLACE_SIM, 3, true, false, "sim:3"},
             {PE_PLACE_CPU, 2, true, false, "cpu:2"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pe_status *st = pe_node_comm_path_of(bad[i].kind, bad[i].n, bad[i].streams, bad[i].dev, &p);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(pe_status_msg(st), bad[i].names), "%s", pe_status_msg(st));
    pe_status_free(st);
  }
}
END_TEST

static Suite *cross_suite(void) {
  Suite *s = suite_create("par_cross");
  TCase *tc = tcase_create("par_cross");
  tcase_add_test(tc, cpu1_trains_as_without_a_job);
  tcase_add_test(tc, cpu2_trains_as_without_a_job);
  tcase_add_test(tc, cpu2_fused_trains_as_without_a_job);
  tcase_add_test(tc, failed_exchange_updates_nothing);
  tcase_add_test(tc, one_worker_overlaps_the_exchange);
  tcase_add_test(tc, timeline_names_the_exchange);
  tcase_add_test(tc, sim1_device_path_trains_as_without_a_job);
  tcase_add_test(tc, sim1_failed_device_exchange_updates_nothing);
  tcase_add_test(tc, sim_without_device_comm_is_refused);
  tcase_add_test(tc, path_of_places);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(cross_suite)
