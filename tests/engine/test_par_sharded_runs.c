/* The Sharded strategy's update as it runs (parallel/sharded.c): a failing
 * kernel, many quick runs on any thread count, and where the updates fall
 * in a step's schedule; results still bit for bit AllReduce's
 * (sharded_test_util.h). Tests:
 *   kernel_error  adam with Beta1Pow = 1.5 on one parameter: the run fails
 *                 naming the node and Beta1Pow, and after a restore the same
 *                 executor trains bit-identically to AllReduce again
 *   many_runs     200 quick cpu:2 runs with 1, 2 and 4 pool threads (2, 4
 *                 and 7 chunks; some runs with random delays): bit-identical
 *                 losses and parameters
 *   place_backward_before_collectives  on one worker, no update or
 *                 all-reduce runs inside a place's backward chain */
#include "check_main.h"
#include "engine/timeline.h"
#include "sharded_test_util.h"

/* --- a failing kernel inside a sharded update ----------------------------------------------- */

static const setting ERR_SETTINGS[] = {
    {PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, "cpu:2"},
    {PE_PLACE_SIM, 3, PE_SYNC_WAIT_PRODUCER, "sim:3 wait-producer"},
};

/* Save every persistable of s (place 0) / set them all back. The names are
 * copied: the model's own die with it. */
typedef struct saved {
  int n;
  char **names;
  pe_tensor *t;
} saved;

static void save_all(side *s, saved *sv) {
  const char **names;
  PE_CK_OK(pe_model_names(s->m, &names, &sv->n));
  sv->names = calloc((size_t)sv->n, sizeof(*sv->names));
  sv->t = calloc((size_t)sv->n, sizeof(*sv->t));
  ck_assert(sv->names && sv->t);
  for (int i = 0; i < sv->n; i++) {
    sv->names[i] = strdup(names[i]);
    ck_assert_ptr_nonnull(sv->names[i]);
    pe_tensor_init(&sv->t[i]);
    PE_CK_OK(pe_model_get(s->m, sv->names[i], &sv->t[i]));
  }
  free(names);
}

static void restore_all(side *s, saved *sv) {
  for (int i = 0; i < sv->n; i++) PE_CK_OK(pe_model_set(s->m, sv->names[i], &sv->t[i]));
}

static void saved_free(saved *sv) {
  for (int i = 0; i < sv->n; i++) {
    pe_tensor_release(&sv->t[i]);
    free(sv->names[i]);
  }
  free(sv->t);
  free(sv->names);
}

START_TEST(kernel_error) {
  const setting *st = &ERR_SETTINGS[_i];
  pe_runtime *rt = rt_new(2);
  side ar, sh;
  side_new(&ar, rt, "adam", BIG, st->kind, st->n, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, "adam", BIG, st->kind, st->n, PE_STRATEGY_SHARDED);
  pe_run_opts ro = {.sync = st->sync};
  for (int s = 0; s < 2; s++) {
    float la = side_step(&ar, s, ROWS[s], &ro), lb = side_step(&sh, s, ROWS[s], &ro);
    ck_assert(memcmp(&la, &lb, sizeof la) == 0);
  }
  saved sv;
  save_all(&sh, &sv);
  /* The big (multi-chunk) weight's Beta1Pow, on every place: every chunk's
   * kernel call fails. The other parameters still update. */
  float bad = 1.5f;
  pe_tensor bt;
  pe_tensor_init(&bt);
  pe_shape one = PE_SHAPE(1);
  pe_tensor_view(&bt, PE_F32, &one, &bad);
  PE_CK_OK(pe_model_set(sh.m, "fc_0.w@BETA1POW", &bt));
  for (int attempt = 0; attempt < 2; attempt++) { /* fails the same way twice */
    float loss = NAN;
    pe_status *e = side_run(&sh, 2, ROWS[2], &ro, &loss);
    ck_assert_msg(e != NULL, "%s: Beta1Pow = 1.5: the run succeeded", st->label);
    const char *msg = pe_status_msg(e);
    if (attempt == 0) fprintf(stderr, "par_sharded %s error: %s\n", st->label, msg);
    ck_assert_msg(strstr(msg, "sharded_update(adam#") && strstr(msg, "fc_0.w)") &&
                      strstr(msg, "Beta1Pow") && strstr(msg, "1.5"),
                  "%s: message does not name the node, Beta1Pow and its value: %s", st->label, msg);
    pe_status_free(e);
    /* The failed node wrote nothing: Beta1Pow is still the bad value. */
    ck_assert_float_eq(get1(&sh, "fc_0.w@BETA1POW"), 1.5f);
  }
  /* Restore the state before the failed steps: the same executor then
   * follows AllReduce bit for bit again. */
  restore_all(&sh, &sv);
  saved_free(&sv);
  expect_models_equal(&ar, &sh, "after restore", false);
  for (int s = 2; s < 5; s++) {
    float la = side_step(&ar, s, ROWS[s], &ro), lb = side_step(&sh, s, ROWS[s], &ro);
    ck_assert_msg(isfinite(lb) && memcmp(&la, &lb, sizeof la) == 0,
                  "%s after the error, step %d: AllReduce %.9g, Sharded %.9g", st->label, s, la,
                  lb);
    expect_models_equal(&ar, &sh, "after the error", true);
  }
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

/* --- many quick runs: the asynchronous completion ------------------------------------------- */

enum { MANY = 200 };

/* MANY momentum steps of 1..8 rows on cpu:2 with `threads` pool workers;
 * the losses into loss[], the final persistables into *sv. With `delays`,
 * every 8th run sleeps each node a random 0..200 us before it runs, which
 * reorders the nodes around the updates. The first run is recorded on a
 * timeline: fc_0.w's update must have run as min(7, 4 x threads) chunks
 * (127250 elements, >= 16384 per chunk), one span each. */
static void many_runs(int threads, bool delays, float *loss, saved *sv) {
  pe_runtime *rt = rt_new(threads);
  side sh;
  side_new(&sh, rt, "momentum", BIG, PE_PLACE_CPU, 2, PE_STRATEGY_SHARDED);
  pe_timeline *tl;
  PE_CK_OK(pe_timeline_new(16, 1024, &tl));
  for (int s = 0; s < MANY; s++) {
    pe_run_opts ro = {.delay_us = delays && s % 8 == 5 ? 200 : 0, .delay_seed = (uint64_t)s + 1};
    ro.timeline = s == 0 ? tl : NULL;
    loss[s] = side_step(&sh, s, 1 + s % 8, &ro);
  }
  char *json;
  PE_CK_OK(pe_timeline_json(tl, &json, NULL));
  int spans = 0;
  for (const char *q = json; (q = strstr(q, " fc_0.w)\"")); q++) spans++;
  int want = 4 * threads < 7 ? 4 * threads : 7;
  ck_assert_msg(spans == want, "%d threads: fc_0.w's update ran as %d chunk spans, want %d",
                threads, spans, want);
  free(json);
  pe_timeline_free(tl);
  save_all(&sh, sv);
  side_free(&sh);
  pe_runtime_free(rt);
}

START_TEST(many_runs_any_thread_count) {
  static float ref[MANY], got[MANY];
  saved r, g;
  many_runs(1, false, ref, &r);
  ck_assert(isfinite(ref[MANY - 1]));
  for (int threads = 2; threads <= 4; threads += 2) {
    many_runs(threads, true, got, &g);
    for (int s = 0; s < MANY; s++)
      ck_assert_msg(memcmp(&ref[s], &got[s], sizeof(float)) == 0,
                    "%d threads, run %d: loss %.9g, 1 thread %.9g", threads, s, got[s], ref[s]);
    ck_assert_int_eq(g.n, r.n);
    for (int i = 0; i < r.n; i++) {
      ck_assert_str_eq(g.names[i], r.names[i]);
      ck_assert_int_eq(pe_tensor_bytes(&g.t[i]), pe_tensor_bytes(&r.t[i]));
      ck_assert_msg(memcmp(g.t[i].data, r.t[i].data, pe_tensor_bytes(&r.t[i])) == 0,
                    "%d threads: '%s' differs from the 1-thread run after %d runs", threads,
                    r.names[i], MANY);
    }
    saved_free(&g);
  }
  saved_free(&r);
}
END_TEST

/* --- schedule: a place's backward before the collectives -------------------------------------- */

/* One timeline span: its name and start. */
typedef struct span {
  char name[64];
  double ts;
} span;

static int span_cmp(const void *a, const void *b) {
  double x = ((const span *)a)->ts, y = ((const span *)b)->ts;
  return x < y ? -1 : x > y;
}

/* The op spans of a timeline's JSON ("run start" left out), by start. */
static int spans_of(const char *json, span *out, int max) {
  int n = 0;
  for (const char *q = json; (q = strstr(q, "{\"name\":\"")) && n < max; q++) {
    const char *name = q + 9, *end = strchr(name, '"');
    const char *ts = strstr(q, "\"ts\":");
    if (!end || !ts || !strstr(q, "\"ph\":\"X\"")) continue;
    if (strstr(q, "\"ph\":\"X\"") > strchr(q, '}')) continue; /* metadata record */
    int len = (int)(end - name) < 63 ? (int)(end - name) : 63;
    if (len == 9 && !strncmp(name, "run start", 9)) continue;
    memcpy(out[n].name, name, (size_t)len);
    out[n].name[len] = 0;
    out[n].ts = strtod(ts + 5, NULL);
    n++;
  }
  qsort(out, (size_t)n, sizeof *out, span_cmp);
  return n;
}

/* On one pool worker the schedule is deterministic. With matmuls fused (a
 * backward matmul reads its weight, so it is an engine op like the
 * updates), the second place to reach its fc_1 gradient made the fc_1
 * update (Sharded) or all-reduce (AllReduce) ready together with its next
 * backward op, and the worker ran the collective first: the place's
 * backward chain, the step's critical path, waited for work that any idle
 * worker could do later (par_node_done). Now no collective runs between a
 * place's first and last backward op. Loop index: Sharded, AllReduce. */
START_TEST(place_backward_before_collectives) {
  pe_graph_strategy strategy = _i ? PE_STRATEGY_ALLREDUCE : PE_STRATEGY_SHARDED;
  pe_runtime *rt = rt_new(1);
  side sd;
  side_new_fused(&sd, rt, "momentum", BIG, PE_PLACE_CPU, 2, strategy, true);
  pe_timeline *tl;
  PE_CK_OK(pe_timeline_new(8, 1024, &tl));
  pe_run_opts ro = {.timeline = tl};
  float loss;
  PE_CK_OK(side_run(&sd, 0, 24, &ro, &loss));
  char *json;
  PE_CK_OK(pe_timeline_json(tl, &json, NULL));
  enum { MAX_SPANS = 256 };
  span *sp = calloc(MAX_SPANS, sizeof *sp);
  ck_assert_ptr_nonnull(sp);
  int n = spans_of(json, sp, MAX_SPANS);
  int n_coll = 0;
  for (int i = 0; i < n; i++)
    n_coll += strstr(sp[i].name, "sharded_update") || strstr(sp[i].name, "all_reduce");
  ck_assert_msg(n_coll >= 4, "%s: %d collective spans in %d", pe_strategy_name(strategy), n_coll,
                n);
  for (int p = 0; p < 2; p++) {
    char at[8];
    snprintf(at, sizeof at, "@p%d", p);
    int first = -1, last = -1;
    for (int i = 0; i < n; i++)
      if (strstr(sp[i].name, "_grad#") && strstr(sp[i].name, at)) {
        if (first < 0) first = i;
        last = i;
      }
    ck_assert_int_ge(first, 0);
    for (int i = first; i < last; i++)
      ck_assert_msg(!strstr(sp[i].name, "sharded_update") && !strstr(sp[i].name, "all_reduce"),
                    "%s: '%s' ran inside place %d's backward ('%s' .. '%s')",
                    pe_strategy_name(strategy), sp[i].name, p, sp[first].name, sp[last].name);
  }
  free(sp);
  free(json);
  pe_timeline_free(tl);
  side_free(&sd);
  pe_runtime_free(rt);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_sharded_runs");
  TCase *tc = tcase_create("sharded");
  tcase_add_loop_test(tc, kernel_error, 0, 2);
  tcase_add_test(tc, many_runs_any_thread_count);
  tcase_add_loop_test(tc, place_backward_before_collectives, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
