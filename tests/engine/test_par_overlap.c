/* Runs of disjoint models overlap; runs of one model are ordered. Checked
 * without clocks (wall times of sleeping nodes are not reliable on a loaded
 * machine): the node hook of pe_run_opts logs every
 * node's begin and end under one sequence number, and can hold a node.
 *
 * Overlap: the first engine node of each model's run waits inside its op
 * until the other model's run is inside an engine node too. Runs that the
 * engine serialised never meet: the wait gives up after HANG_GUARD_S and
 * the test fails (the guard only bounds a broken engine; it is no margin).
 *
 * Order: a run is held inside its update of fc_0.w while a second run of
 * the same model is started (same executor, or a second executor bound to
 * the model); the hold lasts until that run begins a node that conflicts
 * with the held one (a broken engine) or WINDOW_MS passed. Both threads
 * then run more steps freely. Afterwards no two nodes of the two threads
 * that share a persistable, one of them writing it, may overlap in the
 * log. Load can only shorten what a broken engine shows in the window,
 * never fail a correct one. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "par_test_util.h"

enum { MAX_EVENTS = 8192, HANG_GUARD_S = 20, WINDOW_MS = 300, STEPS = 3 };

typedef struct node_event {
  int run, node;
  long begin, end; /* sequence numbers; end -1 while the node runs */
} node_event;

/* Shared by the two threads' runs. */
typedef struct node_log {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long seq;
  int n;
  node_event ev[MAX_EVENTS];
  int arrived;         /* runs inside their meeting node */
  bool held, released; /* the hold of the ordering check */
  const pe_graph *held_g;
  int held_run, held_node;
  bool conflict_begun; /* the other run began a node conflicting with it */
} node_log;

/* One thread's view (the hook's argument). */
typedef struct tap {
  node_log *log;
  int run;
  const pe_graph *g;
  bool meet;     /* wait at the first engine node for the other run */
  bool met;      /* ... and it came */
  int hold_node; /* node to hold once; -1 none */
} tap;

static void log_init(node_log *l) {
  memset(l, 0, sizeof *l);
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  l->held_node = -1;
}

static void log_destroy(node_log *l) {
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
}

static struct timespec deadline_in(long ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Wait on l->cv (l->mu held) until *flag or the deadline. */
static bool wait_flag(node_log *l, const bool *flag, long ms) {
  struct timespec dl = deadline_in(ms);
  while (!*flag)
    if (pthread_cond_timedwait(&l->cv, &l->mu, &dl) == ETIMEDOUT) break;
  return *flag;
}

static bool is_engine_node(const pe_graph *g, int node) {
  return g->nodes[node].reads_persistable || g->nodes[node].writes_persistable;
}

/* Do node u of gu and node v of gv share a persistable (same name and
 * place), one of them writing it? Both graphs belong to one model. */
static bool conflict(const pe_graph *gu, int u, const pe_graph *gv, int v) {
  const pe_graph_node *a = &gu->nodes[u], *b = &gv->nodes[v];
  for (int i = 0; i < a->n_in_lv + a->n_out_lv; i++) {
    bool aw = i >= a->n_in_lv;
    const pe_graph_lvar *x = &gu->lvars[aw ? a->out_lv[i - a->n_in_lv] : a->in_lv[i]];
    if (!x->persistable) continue;
    for (int j = 0; j < b->n_in_lv + b->n_out_lv; j++) {
      bool bw = j >= b->n_in_lv;
      const pe_graph_lvar *y = &gv->lvars[bw ? b->out_lv[j - b->n_in_lv] : b->in_lv[j]];
      if (y->persistable && (aw || bw) && y->place == x->place && strcmp(x->name, y->name) == 0)
        return true;
    }
  }
  return false;
}

static void log_hook(void *arg, int node, bool done) {
  tap *t = arg;
  node_log *l = t->log;
  pthread_mutex_lock(&l->mu);
  long s = l->seq++;
  if (done) {
    int i = l->n - 1;
    while (i >= 0 && !(l->ev[i].run == t->run && l->ev[i].node == node && l->ev[i].end < 0)) i--;
    ck_assert_msg(i >= 0, "node %d of run %d ended without a begin", node, t->run);
    l->ev[i].end = s;
  } else {
    ck_assert_int_lt(l->n, MAX_EVENTS);
    l->ev[l->n++] = (node_event){t->run, node, s, -1};
    if (l->held && !l->released && t->run != l->held_run &&
        conflict(l->held_g, l->held_node, t->g, node))
      l->conflict_begun = true;
  }
  pthread_cond_broadcast(&l->cv);
  if (!done && t->meet && is_engine_node(t->g, node)) {
    t->meet = false;
    l->arrived++;
    pthread_cond_broadcast(&l->cv);
    struct timespec dl = deadline_in(HANG_GUARD_S * 1000L);
    while (l->arrived < 2 && pthread_cond_timedwait(&l->cv, &l->mu, &dl) != ETIMEDOUT) continue;
    t->met = l->arrived >= 2;
  }
  if (!done && node == t->hold_node) {
    t->hold_node = -1;
    l->held = true;
    l->held_g = t->g;
    l->held_run = t->run;
    l->held_node = node;
    pthread_cond_broadcast(&l->cv);
    wait_flag(l, &l->released, HANG_GUARD_S * 1000L);
  }
  pthread_mutex_unlock(&l->mu);
}

typedef struct stepper {
  par q; /* q.step: the executor this thread runs */
  tap t;
  int first, steps;
} stepper;

static void *run_logged(void *arg) {
  stepper *s = arg;
  pe_run_opts ro = {.node_hook = log_hook, .hook_arg = &s->t};
  for (int k = s->first; k < s->first + s->steps; k++) par_step(&s->q, k, 8, &ro);
  return NULL;
}

static void stepper_init(stepper *s, const par *q, pe_par_exec *e, node_log *l, int run) {
  s->q = *q;
  s->q.step = e;
  s->t = (tap){.log = l, .run = run, .g = pe_par_exec_graph(e), .hold_node = -1};
  s->first = 0;
  s->steps = STEPS;
}

/* The first node that writes persistable `name`. */
static int writer_of(const pe_graph *g, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_out_lv; k++) {
      const pe_graph_lvar *v = &g->lvars[g->nodes[i].out_lv[k]];
      if (v->persistable && strcmp(v->name, name) == 0) return i;
    }
  ck_abort_msg("no node writes %s", name);
  return -1;
}

START_TEST(disjoint_models_overlap) {
  pe_runtime *rt = rt_new(4);
  par qa, qb;
  par_new(&qa, rt, PE_PLACE_CPU, 1, PE_STRATEGY_ALLREDUCE, false, 31);
  par_new(&qb, rt, PE_PLACE_CPU, 1, PE_STRATEGY_ALLREDUCE, false, 32);
  PE_CK_OK(pe_par_exec_run(qa.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  PE_CK_OK(pe_par_exec_run(qb.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  static node_log l;
  log_init(&l);
  stepper s[2];
  stepper_init(&s[0], &qa, qa.step, &l, 0);
  stepper_init(&s[1], &qb, qb.step, &l, 1);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    s[i].t.meet = true;
    ck_assert_int_eq(pthread_create(&th[i], NULL, run_logged, &s[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++)
    ck_assert_msg(s[i].t.met,
                  "model %c's run waited %d s inside an engine node for the other model's run: "
                  "runs on disjoint models did not overlap",
                  'a' + i, HANG_GUARD_S);
  log_destroy(&l);
  par_free(&qa);
  par_free(&qb);
  pe_runtime_free(rt);
}
END_TEST

/* Thread 0 runs e0 and is held in its first update of fc_0.w; thread 1
 * then runs e1 (the same model); see the top of the file. */
static void same_model_ordered(par *q, pe_par_exec *e0, pe_par_exec *e1) {
  static node_log l;
  log_init(&l);
  stepper s[2];
  stepper_init(&s[0], q, e0, &l, 0);
  stepper_init(&s[1], q, e1, &l, 1);
  s[0].t.hold_node = writer_of(s[0].t.g, "fc_0.w");
  s[1].first = STEPS;
  pthread_t th[2];
  ck_assert_int_eq(pthread_create(&th[0], NULL, run_logged, &s[0]), 0);
  pthread_mutex_lock(&l.mu);
  ck_assert_msg(wait_flag(&l, &l.held, HANG_GUARD_S * 1000L), "the held node never began");
  pthread_mutex_unlock(&l.mu);
  ck_assert_int_eq(pthread_create(&th[1], NULL, run_logged, &s[1]), 0);
  pthread_mutex_lock(&l.mu);
  wait_flag(&l, &l.conflict_begun, WINDOW_MS);
  l.released = true;
  pthread_cond_broadcast(&l.cv);
  pthread_mutex_unlock(&l.mu);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);

  int pairs = 0;
  for (int i = 0; i < l.n; i++) {
    const node_event *a = &l.ev[i];
    ck_assert_msg(a->end >= 0, "node %d of run %d never ended", a->node, a->run);
    if (a->run != 0) continue;
    for (int j = 0; j < l.n; j++) {
      const node_event *b = &l.ev[j];
      if (b->run != 1 || !conflict(s[0].t.g, a->node, s[1].t.g, b->node)) continue;
      pairs++;
      ck_assert_msg(a->end < b->begin || b->end < a->begin,
                    "one model, two threads: %s (thread 0, events %ld..%ld) and %s (thread 1, "
                    "%ld..%ld) share a persistable, one writes it, and they overlapped",
                    s[0].t.g->nodes[a->node].name, a->begin, a->end, s[1].t.g->nodes[b->node].name,
                    b->begin, b->end);
    }
  }
  ck_assert_int_gt(pairs, 0);
  log_destroy(&l);
}

/* Two threads run one executor: its runs take turns. */
START_TEST(same_executor_ordered) {
  pe_runtime *rt = rt_new(4);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 1, PE_STRATEGY_ALLREDUCE, false, 31);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  same_model_ordered(&q, q.step, q.step);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

/* Two executors of one model, from two threads: the engine orders their
 * accesses to the model's variables. */
START_TEST(same_model_two_executors_ordered) {
  pe_runtime *rt = rt_new(4);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 1, PE_STRATEGY_ALLREDUCE, false, 31);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  /* A second step graph of the same program, bound to q's model. */
  pe_program *prog = mlp_program();
  pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 1, .fuse_bucket_bytes = 256};
  pe_ir ir = {prog, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, false));
  pe_par_exec *e1;
  PE_CK_OK(pe_par_exec_new(q.m, ir.graph, &e1));
  ir.graph = NULL;
  pe_ir_destroy(&ir);
  same_model_ordered(&q, q.step, e1);
  pe_par_exec_free(e1);
  pe_program_free(prog);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

static Suite *overlap_suite(void) {
  Suite *s = suite_create("par_overlap");
  TCase *tc = tcase_create("overlap");
  tcase_add_test(tc, disjoint_models_overlap);
  tcase_add_test(tc, same_executor_ordered);
  tcase_add_test(tc, same_model_two_executors_ordered);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(overlap_suite)
