/* The pool serves the places a model asks for: a runtime whose pool started
 * with one worker grows, for a model on cpu:2, to a worker per place
 * (pe_runtime_serve_places), and the two places' ops then run at the same
 * time. Checked without clocks: the first op of each place waits inside
 * the node hook until the other place's first op is inside it too. On a
 * pool where the places take turns they never meet: the wait gives up after
 * HANG_GUARD_S and the test fails (the guard only bounds a broken pool; it is
 * no margin). Also: the pool never shrinks, sim places take no workers, and
 * more cpu places than online cores are refused with the reason. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "par_test_util.h"

enum { HANG_GUARD_S = 20 };

/* The places' first ops meet here. */
typedef struct meeting {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const pe_graph *g;
  bool seen[PE_MAX_PLACES]; /* the place's first op arrived */
  int arrived, met;
} meeting;

static void meet_hook(void *arg, int node, bool done) {
  meeting *m = arg;
  int p = m->g->nodes[node].place;
  if (done || p < 0 || m->g->nodes[node].kind != PE_NODE_OP) return;
  pthread_mutex_lock(&m->mu);
  if (!m->seen[p]) {
    m->seen[p] = true;
    m->arrived++;
    pthread_cond_broadcast(&m->cv);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += HANG_GUARD_S;
    while (m->arrived < 2 && pthread_cond_timedwait(&m->cv, &m->mu, &dl) != ETIMEDOUT) continue;
    if (m->arrived >= 2) m->met++;
  }
  pthread_mutex_unlock(&m->mu);
}

START_TEST(cpu_places_run_at_once_on_a_grown_pool) {
  if (pe_cpu_cores() < 2) return; /* one core: one worker (see the refusal test) */
  pe_runtime *rt = rt_new(1);
  ck_assert_int_eq(pe_pool_threads(pe_runtime_pool(rt)), 1);
  PE_CK_OK(pe_runtime_serve_places(rt, PE_PLACE_CPU, 2));
  ck_assert_int_eq(pe_pool_threads(pe_runtime_pool(rt)), 2);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, 41);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  static meeting m;
  memset(&m, 0, sizeof m);
  pthread_mutex_init(&m.mu, NULL);
  pthread_cond_init(&m.cv, NULL);
  m.g = pe_par_exec_graph(q.step);
  pe_run_opts ro = {.node_hook = meet_hook, .hook_arg = &m};
  par_step(&q, 0, 8, &ro);
  ck_assert_msg(m.met == 2, "the places' first ops did not run at once (%d of 2 met)", m.met);
  /* Never shrinks. */
  PE_CK_OK(pe_runtime_serve_places(rt, PE_PLACE_CPU, 1));
  ck_assert_int_eq(pe_pool_threads(pe_runtime_pool(rt)), 2);
  pthread_mutex_destroy(&m.mu);
  pthread_cond_destroy(&m.cv);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

START_TEST(sim_places_take_no_workers) {
  pe_runtime *rt = rt_new(1);
  PE_CK_OK(pe_runtime_serve_places(rt, PE_PLACE_SIM, 4));
  ck_assert_int_eq(pe_pool_threads(pe_runtime_pool(rt)), 1);
  pe_runtime_free(rt);
}
END_TEST

START_TEST(more_cpu_places_than_cores_says_why) {
  pe_runtime *rt = rt_new(1);
  int cores = pe_cpu_cores();
  pe_status *st = pe_runtime_serve_places(rt, PE_PLACE_CPU, cores + 1);
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(pe_status_code(st), PE_EEXHAUSTED);
  ck_assert_msg(strstr(pe_status_msg(st), "online cores"), "%s", pe_status_msg(st));
  char want[64];
  snprintf(want, sizeof want, "cpu:%d", cores + 1);
  ck_assert_msg(strstr(pe_status_msg(st), want), "%s", pe_status_msg(st));
  pe_status_free(st);
  ck_assert_int_eq(pe_pool_threads(pe_runtime_pool(rt)), cores);
  pe_runtime_free(rt);
}
END_TEST

static Suite *pool_grow_suite(void) {
  Suite *s = suite_create("par_pool_grow");
  TCase *tc = tcase_create("pool_grow");
  tcase_add_test(tc, cpu_places_run_at_once_on_a_grown_pool);
  tcase_add_test(tc, sim_places_take_no_workers);
  tcase_add_test(tc, more_cpu_places_than_cores_says_why);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(pool_grow_suite)
