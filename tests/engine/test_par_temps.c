/* What a parallel executor keeps of its temporaries between runs
 * (engine/parallel/temps.c), on cpu:2 and on sim:2 (asynchronous: a run leaves
 * device work in flight). A run with a batch half the one before, or
 * less, gives back the excess; pe_par_exec_release gives back all of it,
 * waiting for the work in flight first; the runs after either train as the
 * sequential reference does. Capacity does not only grow: the temporaries
 * of the largest batch do not stay until the executor is freed. */
#include "check_main.h"
#include "engine/device.h"
#include "par_test_util.h"

/* Bytes the model's places have handed out (for cpu places, the host
 * allocator: counted once), once the device work in flight is done (sim
 * kernels size their outputs when they run). */
static size_t in_use(par *q) {
  PE_CK_OK(pe_par_exec_sync(q->step));
  size_t n = 0;
  pe_allocator *seen = NULL;
  for (int p = 0; p < q->m->n_places; p++) {
    pe_allocator *a = pe_device_allocator(q->m->dev[p]);
    if (a == seen) continue;
    seen = a;
    n += pe_allocator_stats(a).bytes_in_use;
  }
  return n;
}

/* The schedule of (step, rows) both sides run. The sequential reference
 * runs it first: on cpu places it shares the host allocator, and its
 * tensors keep their capacity too. */
static const int sched[][2] = {{0, 1}, {1, MAXB}, {2, MAXB}, {3, 2}, {4, MAXB}, {5, 2}};
enum { N_SCHED = sizeof sched / sizeof sched[0] };

static void same_step(par *q, const float *want, int k) {
  float got = par_step(q, sched[k][0], sched[k][1], NULL);
  ck_assert_msg(fabs(want[k] - got) <= RTOL * fabs(want[k]), "step %d (%d rows): %.9g vs %.9g",
                sched[k][0], sched[k][1], want[k], got);
}

static void temporaries_on(pe_place_kind kind) {
  const char *on = pe_place_kind_name(kind);
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 5);
  par q;
  par_new(&q, rt, kind, 2, PE_STRATEGY_ALLREDUCE, false, 5);
  copy_params(&s, &q);
  float want[N_SCHED];
  for (int k = 0; k < N_SCHED; k++) want[k] = seq_step(&s, sched[k][0], sched[k][1]);
  /* The first run also replicates the parameters onto place 1. */
  same_step(&q, want, 0);
  pe_par_exec_release(q.step);
  size_t params = in_use(&q);
  same_step(&q, want, 1);
  size_t big = in_use(&q);
  ck_assert_uint_gt(big, params);
  same_step(&q, want, 2);
  ck_assert_uint_eq(in_use(&q), big); /* steady: nothing given back or taken */
  same_step(&q, want, 3);
  size_t small = in_use(&q);
  ck_assert_msg(small < big, "%s: %zu bytes in use after a batch of 16, %zu after one of 2", on,
                big, small);
  pe_par_exec_release(q.step);
  ck_assert_msg(in_use(&q) == params, "%s: %zu bytes in use after the release, %zu after the first",
                on, in_use(&q), params);
  same_step(&q, want, 4);
  same_step(&q, want, 5);
  par_free(&q);
  seq_free(&s);
  pe_runtime_free(rt);
}

START_TEST(temporaries_cpu) {
  temporaries_on(PE_PLACE_CPU);
}
END_TEST

START_TEST(temporaries_sim) {
  temporaries_on(PE_PLACE_SIM);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_temps");
  TCase *tc = tcase_create("engine");
  tcase_add_test(tc, temporaries_cpu);
  tcase_add_test(tc, temporaries_sim);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
