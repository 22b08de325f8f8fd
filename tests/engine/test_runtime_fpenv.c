/* Denormal policy of the threads that run kernels (core/fpenv.h): pool
 * workers and sim stream threads of a runtime, and the sequential
 * executor's run on the caller's thread.
 *
 * Each case first puts the test thread in the opposite state, so that a
 * pass shows the runtime set the state itself rather than the workers
 * inheriting it from the thread that created them. */
#include <check.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../compiler/prog_util.h"
#include "compiler/validate.h"
#include "core/fpenv.h"
#include "engine/parallel/executor.h"
#include "engine/seq_executor.h"

/* --- pool workers ----------------------------------------------------------- */

typedef struct probe {
  pe_task task;
  _Atomic int done;
  bool flushed;
} probe;

static void probe_fn(void *arg) {
  probe *p = arg;
  p->flushed = pe_fpenv_denormals_flushed();
  atomic_store_explicit(&p->done, 1, memory_order_release);
}

/* Whether the pool worker that takes one probe task flushes denormals
 * (the pool picks the worker; the callers probe several times). */
static bool worker_flushes(pe_runtime *rt) {
  probe p = {.task = {probe_fn, NULL, NULL}};
  p.task.arg = &p;
  atomic_init(&p.done, 0);
  pe_pool_submit(pe_runtime_pool(rt), &p.task);
  while (!atomic_load_explicit(&p.done, memory_order_acquire)) sched_yield();
  return p.flushed;
}

static pe_runtime *new_runtime(int keep_denormals) {
  pe_runtime_opts o = {.threads = 2, .cores = 2, .keep_denormals = keep_denormals};
  pe_runtime *rt = NULL;
  pe_status *st = pe_runtime_new(&o, &rt);
  ck_assert_msg(!st, "runtime: %s", pe_status_msg(st));
  return rt;
}

START_TEST(pool_workers_flush_by_default) {
  pe_fpenv_flush_denormals(false);
  pe_runtime *rt = new_runtime(0);
  /* Several probes: with two workers, both are likely to answer. */
  for (int i = 0; i < 8; i++) ck_assert(worker_flushes(rt));
  pe_runtime_free(rt);
  ck_assert(!pe_fpenv_denormals_flushed()); /* the caller's state is its own */
}
END_TEST

START_TEST(pool_workers_keep_denormals_when_asked) {
  pe_fpenv_flush_denormals(true);
  pe_runtime *rt = new_runtime(1);
  for (int i = 0; i < 8; i++) ck_assert(!worker_flushes(rt));
  pe_runtime_free(rt);
  ck_assert(pe_fpenv_denormals_flushed());
}
END_TEST

/* --- sim stream threads -------------------------------------------------------- */

static pe_status *stream_probe(void *arg) {
  *(int *)arg = pe_fpenv_denormals_flushed() ? 1 : 0;
  return NULL;
}

static int sim_stream_flushes(int keep_denormals, pe_stream_kind kind) {
  pe_runtime *rt = new_runtime(keep_denormals);
  pe_device *dev = NULL;
  pe_status *st = pe_runtime_device(rt, (pe_place){PE_PLACE_SIM, 0}, 1, &dev);
  ck_assert_msg(!st, "sim:0: %s", pe_status_msg(st));
  int seen = -1;
  pe_stream *s = pe_device_stream(dev, kind);
  st = pe_stream_launch(s, stream_probe, &seen);
  if (!st) st = pe_stream_sync(s);
  ck_assert_msg(!st, "%s: %s", s->name, pe_status_msg(st));
  pe_runtime_free(rt);
  return seen;
}

START_TEST(sim_streams_follow_the_runtime) {
  pe_fpenv_flush_denormals(false);
  ck_assert_int_eq(sim_stream_flushes(0, PE_STREAM_COMPUTE), 1);
  ck_assert_int_eq(sim_stream_flushes(0, PE_STREAM_COMM), 1);
  pe_fpenv_flush_denormals(true);
  ck_assert_int_eq(sim_stream_flushes(1, PE_STREAM_COMPUTE), 0);
  ck_assert_int_eq(sim_stream_flushes(1, PE_STREAM_COMM), 0);
}
END_TEST

/* --- the sequential executor ---------------------------------------------------- */

/* out = scale(x) with scale 1, bias 0: a denormal x comes out unchanged
 * unless denormal inputs read as zero. */
static pe_program *identity_program(void) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(2));
  pu_var(m, "out", PE_F32, NULL);
  pu_op(m, "scale", "X", "x", NULL, "Out", "out", NULL);
  PU_OK(pe_program_validate(p));
  return p;
}

/* Runs identity_program on {1e-40, 1} and returns out[0]. */
static float seq_run_denormal(int keep_denormals) {
  pe_program *p = identity_program();
  pe_exec_opts o = {.threads = 1, .keep_denormals = keep_denormals};
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, NULL, &o, &e));
  pe_tensor x;
  pe_tensor_init(&x);
  pe_shape shape = PE_SHAPE(2);
  PU_OK(pe_tensor_resize(&x, PE_F32, &shape, "x"));
  pe_f32(&x)[0] = 1e-40f;
  pe_f32(&x)[1] = 1.0f;
  pe_feed feed = {"x", &x};
  const char *fetch[] = {"out"};
  const pe_tensor *got;
  PU_OK(pe_seq_exec_run(e, &feed, 1, fetch, 1, &got));
  float out0 = pe_f32(got)[0];
  ck_assert(pe_f32(got)[1] == 1.0f);
  pe_tensor_release(&x);
  pe_seq_exec_free(e);
  pe_program_free(p);
  return out0;
}

START_TEST(seq_run_flushes_and_restores_the_caller) {
  pe_fpenv_flush_denormals(false);
  ck_assert(seq_run_denormal(0) == 0.0f);
  ck_assert(!pe_fpenv_denormals_flushed()); /* restored after the run */

  float kept = seq_run_denormal(1);
  ck_assert(kept > 0.0f && kept < 1e-39f);
  ck_assert(!pe_fpenv_denormals_flushed());

  /* A caller that flushes already keeps flushing after a default run. */
  pe_fpenv_flush_denormals(true);
  ck_assert(seq_run_denormal(0) == 0.0f);
  ck_assert(pe_fpenv_denormals_flushed());
}
END_TEST

static Suite *runtime_fpenv_suite(void) {
  Suite *s = suite_create("runtime_fpenv");
  TCase *tc = tcase_create("runtime_fpenv");
  tcase_add_test(tc, pool_workers_flush_by_default);
  tcase_add_test(tc, pool_workers_keep_denormals_when_asked);
  tcase_add_test(tc, sim_streams_follow_the_runtime);
  tcase_add_test(tc, seq_run_flushes_and_restores_the_caller);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (!pe_fpenv_supported()) {
    printf("runtime_fpenv: denormal flushing is not supported here; skipped\n");
    return 77;
  }
  SRunner *sr = srunner_create(runtime_fpenv_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
