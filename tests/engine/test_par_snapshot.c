/* pe_model_get_many / pe_model_set_many while another thread trains the
 * model: a snapshot holds every persistable at one step boundary, and no
 * run sees part of a set. The reference: the same steps run alone, with a
 * snapshot after each (the parallel executor is deterministic), so a
 * snapshot taken during training must equal one of them bit for bit.
 * Also pe_model_changes and the calls' errors. cpu:2 and sim:2. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "par_test_util.h"

/* Every step trains on the same batch, so the state after j steps from
 * any state is a function of that state and j alone (a set in the middle
 * of training restarts the sequence). */
enum { STEPS = 40, ROWS = 8, BATCH = 1 };

/* Every persistable of a model, at one point. */
typedef struct snap {
  pe_tensor t[64];
} snap;

typedef struct fixture {
  pe_runtime *rt;
  pe_place_kind kind;
  const char **names; /* the reference model's, sorted */
  int n;
  snap ref[STEPS + 1]; /* ref[k]: after the startup graph and k steps */
} fixture;

static void snap_take(pe_model *m, const fixture *f, snap *s) {
  PE_CK_OK(pe_model_get_many(m, f->names, f->n, s->t, NULL, NULL));
}

static void snap_release(const fixture *f, snap *s) {
  for (int i = 0; i < f->n; i++) pe_tensor_release(&s->t[i]);
}

static bool snap_equal(const fixture *f, const snap *a, const snap *b) {
  for (int i = 0; i < f->n; i++) {
    const pe_tensor *x = &a->t[i], *y = &b->t[i];
    if (x->dtype != y->dtype || !pe_shape_equal(&x->shape, &y->shape) ||
        memcmp(x->data, y->data, pe_tensor_bytes(x)) != 0)
      return false;
  }
  return true;
}

/* The reference step s is equal to, or -1. */
static int snap_find(const fixture *f, const snap *s) {
  for (int k = 0; k <= STEPS; k++)
    if (snap_equal(f, s, &f->ref[k])) return k;
  return -1;
}

/* A model on 2 places of `kind`, after its startup graph. */
static void model_on(pe_runtime *rt, pe_place_kind kind, par *q) {
  par_new(q, rt, kind, 2, PE_STRATEGY_ALLREDUCE, false, 7);
  PE_CK_OK(pe_par_exec_run(q->init, NULL, 0, NULL, 0, NULL, NULL, NULL));
}

static void model_start(fixture *f, par *q) {
  model_on(f->rt, f->kind, q);
}

static void fixture_new(fixture *f, pe_place_kind kind) {
  memset(f, 0, sizeof *f);
  f->rt = rt_new(2);
  f->kind = kind;
  par q;
  model_start(f, &q);
  const char **names;
  PE_CK_OK(pe_model_names(q.m, &names, &f->n));
  ck_assert_int_le(f->n, 64);
  f->names = malloc(sizeof *f->names * (size_t)f->n);
  for (int i = 0; i < f->n; i++) f->names[i] = strdup(names[i]);
  free(names);
  snap_take(q.m, f, &f->ref[0]);
  for (int k = 1; k <= STEPS; k++) {
    par_step(&q, BATCH, ROWS, NULL);
    snap_take(q.m, f, &f->ref[k]);
  }
  par_free(&q);
  for (int k = 1; k <= STEPS; k++)
    ck_assert_msg(!snap_equal(f, &f->ref[k], &f->ref[k - 1]), "step %d changed nothing", k);
}

static void fixture_free(fixture *f) {
  for (int k = 0; k <= STEPS; k++) snap_release(f, &f->ref[k]);
  for (int i = 0; i < f->n; i++) free((char *)f->names[i]);
  free(f->names);
  pe_runtime_free(f->rt);
}

/* The trainer thread: steps 1..STEPS, counted in `done`. */
typedef struct trainer {
  par *q;
  atomic_int done;
  pthread_t th;
} trainer;

static void *train_fn(void *arg) {
  trainer *t = arg;
  for (int k = 1; k <= STEPS; k++) {
    par_step(t->q, BATCH, ROWS, NULL);
    atomic_store(&t->done, k);
  }
  return NULL;
}

static void trainer_start(trainer *t, par *q) {
  t->q = q;
  atomic_store(&t->done, 0);
  ck_assert_int_eq(pthread_create(&t->th, NULL, train_fn, t), 0);
}

/* Snapshots taken while the trainer runs each equal the reference after
 * some step, and those steps never go backwards. */
static void snapshots_during_training(pe_place_kind kind) {
  fixture f;
  fixture_new(&f, kind);
  par q;
  model_start(&f, &q);
  trainer t;
  trainer_start(&t, &q);
  int last = 0, taken = 0, inside = 0;
  while (atomic_load(&t.done) < STEPS) {
    snap s;
    snap_take(q.m, &f, &s);
    int k = snap_find(&f, &s);
    ck_assert_msg(k >= 0, "snapshot %d (trainer at step %d) is no step boundary: torn", taken,
                  atomic_load(&t.done));
    ck_assert_msg(k >= last, "snapshot %d is step %d after step %d", taken, k, last);
    last = k;
    taken++;
    inside += k > 0 && k < STEPS;
    snap_release(&f, &s);
  }
  pthread_join(t.th, NULL);
  snap s;
  snap_take(q.m, &f, &s);
  ck_assert_int_eq(snap_find(&f, &s), STEPS);
  snap_release(&f, &s);
  printf("%s: %d snapshots during training, %d between its first and last step\n",
         pe_place_kind_name(kind), taken, inside);
  par_free(&q);
  fixture_free(&f);
}

START_TEST(snapshots_during_training_cpu) {
  snapshots_during_training(PE_PLACE_CPU);
}
END_TEST

START_TEST(snapshots_during_training_sim) {
  snapshots_during_training(PE_PLACE_SIM);
}
END_TEST

/* Setting every persistable back to the start in the middle of training:
 * the steps after the set start from it, so the end state is the
 * reference after (steps after the set), never a mix. */
static void set_during_training(pe_place_kind kind) {
  fixture f;
  fixture_new(&f, kind);
  par q;
  model_start(&f, &q);
  trainer t;
  trainer_start(&t, &q);
  while (atomic_load(&t.done) < 5) sched_yield();
  uint64_t before = pe_model_changes(q.m);
  PE_CK_OK(pe_model_set_many(q.m, f.names, f.ref[0].t, f.n, NULL));
  uint64_t after = pe_model_changes(q.m);
  pthread_join(t.th, NULL);
  /* The set is one change; the runs pushed before it are `before` minus the
   * startup run, the rest came after it. */
  /* The set is one change, pushed when the count was between before + 1
   * and after; the runs pushed before it are that count minus the startup
   * run and the set, the rest started from the set's values. */
  ck_assert_uint_ge(after, before + 1);
  ck_assert_uint_ge(before, 6);
  int lo = STEPS - (int)after + 2, hi = STEPS - (int)before + 1;
  snap s;
  snap_take(q.m, &f, &s);
  int k = snap_find(&f, &s);
  ck_assert_msg(k >= 0, "after a set in the middle of training the state is no step boundary");
  ck_assert_msg(k >= lo && k <= hi, "end state is step %d; %d to %d steps ran after the set", k, lo,
                hi);
  printf("%s: changes %llu -> %llu around the set; end state = reference step %d\n",
         pe_place_kind_name(kind), (unsigned long long)before, (unsigned long long)after, k);
  snap_release(&f, &s);
  assert_places_identical(&q);
  par_free(&q);
  fixture_free(&f);
}

START_TEST(set_during_training_cpu) {
  set_during_training(PE_PLACE_CPU);
}
END_TEST

START_TEST(set_during_training_sim) {
  set_during_training(PE_PLACE_SIM);
}
END_TEST

/* One run of an eval graph (registered for_test) of q's program on cpu:2. */
static void eval_run(par *q) {
  pe_program *eval = mlp_program();
  pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 2};
  pe_ir ir = {eval, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, true));
  pe_par_exec *ev;
  PE_CK_OK(pe_par_exec_new(q->m, ir.graph, &ev));
  ir.graph = NULL;
  pe_ir_destroy(&ir);
  float x[ROWS * DIM];
  int64_t y[ROWS];
  make_batch(1, ROWS, x, y);
  pe_tensor xt, yt, out;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_init(&out);
  pe_shape xs = PE_SHAPE(ROWS, DIM), ys = PE_SHAPE(ROWS, 1);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_tensor_view(&yt, PE_I64, &ys, y);
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  PE_CK_OK(pe_par_exec_run(ev, feeds, 2, &LOSS, 1, &out, NULL, NULL));
  pe_tensor_release(&out);
  pe_par_exec_free(ev);
  pe_program_free(eval);
}

/* pe_model_changes counts runs that write persistables and sets; reads and
 * runs that only read (an eval graph) are not changes. */
START_TEST(changes_counted) {
  pe_runtime *rt = rt_new(2);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, 7);
  ck_assert_uint_eq(pe_model_changes(q.m), 0);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  ck_assert_uint_eq(pe_model_changes(q.m), 1);
  for (int k = 1; k <= 3; k++) par_step(&q, k, ROWS, NULL);
  ck_assert_uint_eq(pe_model_changes(q.m), 4);
  pe_tensor w;
  pe_tensor_init(&w);
  pe_model_mark mk;
  const char *name = "fc_0.w";
  PE_CK_OK(pe_model_get_many(q.m, &name, 1, &w, NULL, &mk));
  ck_assert_uint_eq(mk.version, 4);
  pe_model_mark_release(&mk);
  ck_assert_uint_eq(pe_model_changes(q.m), 4);
  /* An eval graph of the same program reads the parameters only. */
  eval_run(&q);
  ck_assert_uint_eq(pe_model_changes(q.m), 4);
  PE_CK_OK(pe_model_set_many(q.m, &name, &w, 1, NULL));
  ck_assert_uint_eq(pe_model_changes(q.m), 5);
  pe_tensor_release(&w);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

/* The model's value of `name` (f32), malloc'd. */
static float *value_of(par *q, const char *name, int64_t *n) {
  pe_tensor t;
  pe_tensor_init(&t);
  PE_CK_OK(pe_model_get(q->m, name, &t));
  *n = pe_tensor_numel(&t);
  float *v = malloc(sizeof(float) * (size_t)(*n ? *n : 1));
  ck_assert_ptr_nonnull(v);
  memcpy(v, pe_f32(&t), sizeof(float) * (size_t)*n);
  pe_tensor_release(&t);
  return v;
}

/* An eval with batch norm is no change either: its test-mode batch_norm
 * lists the running statistics among its outputs but stores them onto
 * themselves, as they were (pe_graph_node_updates_persistable). Counted,
 * such a run would set off an autosave and move Status' changes since the
 * checkpoint. A training step moves them and counts. */
START_TEST(eval_with_batch_norm_is_no_change) {
  mlp_with_batch_norm = true;
  pe_runtime *rt = rt_new(2);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, 7);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  par_step(&q, 1, ROWS, NULL);
  ck_assert_uint_eq(pe_model_changes(q.m), 2);
  int64_t n, n2;
  float *before = value_of(&q, "bn.mean", &n);
  eval_run(&q);
  ck_assert_uint_eq(pe_model_changes(q.m), 2);
  float *after = value_of(&q, "bn.mean", &n2);
  ck_assert_int_eq(n, 16);
  ck_assert_int_eq(n2, n);
  ck_assert_msg(memcmp(before, after, sizeof(float) * (size_t)n) == 0, "the eval moved bn.mean");
  free(after);
  par_step(&q, 2, ROWS, NULL);
  ck_assert_uint_eq(pe_model_changes(q.m), 3);
  after = value_of(&q, "bn.mean", &n2);
  ck_assert_msg(memcmp(before, after, sizeof(float) * (size_t)n) != 0,
                "a training step left bn.mean");
  free(before);
  free(after);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

static void step_from(par *q, uint64_t client, uint64_t request) {
  pe_run_opts ro = {.origin = {.client = client, .request = request}};
  par_step(q, BATCH, ROWS, &ro);
}

static void expect_origin(pe_model *m, uint64_t client, uint64_t request, uint32_t steps) {
  pe_run_origin o;
  ck_assert_msg(pe_model_origin(m, client, &o), "no record of client %llu",
                (unsigned long long)client);
  ck_assert_msg(o.client == client && o.request == request && o.steps == steps,
                "client %llu: request %llu, %u steps; want %llu, %u", (unsigned long long)client,
                (unsigned long long)o.request, o.steps, (unsigned long long)request, steps);
}

/* Runs that write persistables record their origin (per client: newest
 * request, its steps); a snapshot's mark carries the record, a set with a
 * restore mark replaces it; the oldest clients are evicted past
 * PE_MODEL_ORIGINS. */
START_TEST(origins_recorded) {
  pe_runtime *rt = rt_new(2);
  par q;
  model_on(rt, PE_PLACE_CPU, &q);
  pe_run_origin o;
  ck_assert(!pe_model_origin(q.m, 7, &o));
  step_from(&q, 7, 3);
  step_from(&q, 7, 3); /* the same request's second step */
  expect_origin(q.m, 7, 3, 2);
  step_from(&q, 9, 1);
  step_from(&q, 7, 5);
  step_from(&q, 7, 4); /* older than the record: not recorded */
  expect_origin(q.m, 7, 5, 1);
  expect_origin(q.m, 9, 1, 1);
  step_from(&q, 0, 8); /* client 0: no origin */
  ck_assert(!pe_model_origin(q.m, 0, &o));
  /* The snapshot's mark: oldest first (9 ran before 7's last run). */
  const char *name = "fc_0.w";
  pe_tensor w;
  pe_tensor_init(&w);
  pe_model_mark mk;
  PE_CK_OK(pe_model_get_many(q.m, &name, 1, &w, NULL, &mk));
  ck_assert_int_eq(mk.n_origins, 2);
  ck_assert(mk.origins[0].client == 9 && mk.origins[1].client == 7);
  ck_assert(mk.origins[1].request == 5 && mk.origins[1].steps == 1);
  /* Restore an older point: its record replaces the model's. */
  pe_run_origin old = {.client = 7, .request = 2, .steps = 1};
  pe_model_mark restore = {.origins = &old, .n_origins = 1};
  PE_CK_OK(pe_model_set_many(q.m, &name, &w, 1, &restore));
  expect_origin(q.m, 7, 2, 1);
  ck_assert(!pe_model_origin(q.m, 9, &o));
  pe_model_mark_release(&mk);
  ck_assert_ptr_null(mk.origins);
  pe_tensor_release(&w);
  /* Bounded: past PE_MODEL_ORIGINS clients the oldest goes. */
  for (uint64_t c = 100; c < 100 + PE_MODEL_ORIGINS; c++) step_from(&q, c, 1);
  ck_assert(!pe_model_origin(q.m, 7, &o));
  expect_origin(q.m, 100, 1, 1);
  expect_origin(q.m, 99 + PE_MODEL_ORIGINS, 1, 1);
  step_from(&q, 100, 2); /* becomes the newest: 101 is now the oldest */
  step_from(&q, 5, 1);
  expect_origin(q.m, 100, 2, 1);
  ck_assert(!pe_model_origin(q.m, 101, &o));
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

/* Errors name the variable; a failed set changes nothing, a failed get
 * hands back no tensor. */
START_TEST(many_errors) {
  pe_runtime *rt = rt_new(2);
  par q;
  model_on(rt, PE_PLACE_CPU, &q);
  const char *names[3] = {"fc_0.w", "nope", "fc_1.w"};
  pe_tensor t[3];
  memset(t, 0, sizeof t);
  pe_status *st = pe_model_get_many(q.m, names, 3, t, NULL, NULL);
  ck_assert_int_eq(pe_status_code(st), PE_EUNKNOWN_VAR);
  ck_assert_msg(strstr(pe_status_msg(st), "'nope'"), "%s", pe_status_msg(st));
  pe_status_free(st);
  for (int i = 0; i < 3; i++) ck_assert_ptr_null(t[i].data);
  /* A name without a value: an error, or has_value false. */
  par_entry *en;
  PE_CK_OK(par_model_entry(q.m, "declared_only", &en));
  const char *two[2] = {"fc_0.w", "declared_only"};
  st = pe_model_get_many(q.m, two, 2, t, NULL, NULL);
  ck_assert_int_eq(pe_status_code(st), PE_EUSE_BEFORE_DEF);
  ck_assert_msg(strstr(pe_status_msg(st), "'declared_only'"), "%s", pe_status_msg(st));
  pe_status_free(st);
  ck_assert_ptr_null(t[0].data);
  bool has[2];
  PE_CK_OK(pe_model_get_many(q.m, two, 2, t, has, NULL));
  ck_assert(has[0] && !has[1]);
  ck_assert_ptr_nonnull(t[0].data);
  ck_assert_ptr_null(t[1].data);
  /* Set: the second value has the wrong shape, so the first is not set
   * either. */
  pe_tensor good, bad, now;
  pe_tensor_init(&good);
  pe_tensor_init(&bad);
  pe_tensor_init(&now);
  PE_CK_OK(pe_tensor_resize(&good, t[0].dtype, &t[0].shape, "good"));
  memset(good.data, 0, pe_tensor_bytes(&good));
  pe_shape bs = PE_SHAPE(3, 3);
  PE_CK_OK(pe_tensor_resize(&bad, PE_F32, &bs, "bad"));
  memset(bad.data, 0, pe_tensor_bytes(&bad));
  const char *set_names[2] = {"fc_0.w", "fc_1.w"};
  pe_tensor vals[2] = {good, bad};
  st = pe_model_set_many(q.m, set_names, vals, 2, NULL);
  ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
  ck_assert_msg(strstr(pe_status_msg(st), "'fc_1.w'") && strstr(pe_status_msg(st), "[3,3]"), "%s",
                pe_status_msg(st));
  pe_status_free(st);
  PE_CK_OK(pe_model_get(q.m, "fc_0.w", &now));
  ck_assert_msg(memcmp(now.data, t[0].data, pe_tensor_bytes(&now)) == 0,
                "fc_0.w changed by a set that failed");
  /* The same name twice. */
  const char *twice[2] = {"fc_0.w", "fc_0.w"};
  pe_tensor vals2[2] = {good, good};
  st = pe_model_set_many(q.m, twice, vals2, 2, NULL);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  ck_assert_msg(strstr(pe_status_msg(st), "'fc_0.w' is repeated"), "%s", pe_status_msg(st));
  pe_status_free(st);
  pe_tensor_release(&now);
  pe_tensor_release(&good);
  pe_tensor_release(&bad);
  pe_tensor_release(&t[0]);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

static Suite *snapshot_suite(void) {
  Suite *s = suite_create("par_snapshot");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, snapshots_during_training_cpu);
  tcase_add_test(tc, snapshots_during_training_sim);
  tcase_add_test(tc, set_during_training_cpu);
  tcase_add_test(tc, set_during_training_sim);
  tcase_add_test(tc, changes_counted);
  tcase_add_test(tc, eval_with_batch_norm_is_no_change);
  tcase_add_test(tc, many_errors);
  tcase_add_test(tc, origins_recorded);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(snapshot_suite)
