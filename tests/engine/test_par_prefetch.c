/* Input prefetch feeding the parallel executor: pe_prefetch
 * splits batch k+1 onto the places on its own thread while step k runs, and
 * pe_par_exec_run_split binds the parts without copying. The losses and the
 * parameters must be bit-identical to whole-batch runs of the same batches
 * (same rows on the same places, same kernels), uneven splits included.
 * The same through pe_prefetch_run_steps (prefetch_steps.h: the pool's
 * workers fill the rows and chain the steps), stopped by `max` and resumed. */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "engine/prefetch.h"
#include "engine/prefetch_steps.h"
#include "par_test_util.h"

enum { STEPS = 6 };
/* Batch sizes per step: uneven on 3 places, one smaller than the places. */
static const int sizes[STEPS] = {16, 11, 2, 16, 7, 13};

typedef struct producer {
  int step;
  int filling; /* with fill: the batch being filled */
} producer;

/* Two-phase: produce_sizes sizes the inputs, fill_rows writes rows [lo, hi)
 * (on pool workers, concurrently for disjoint ranges). */
static pe_status *produce_sizes(void *ctx, pe_tensor *in, int n_in, bool *end) {
  producer *pr = ctx;
  (void)n_in;
  if (pr->step == STEPS) {
    *end = true;
    return NULL;
  }
  int n = sizes[pr->step];
  pe_shape xs = PE_SHAPE(n, DIM), ys = PE_SHAPE(n, 1);
  PE_TRY(pe_tensor_resize(&in[0], PE_F32, &xs, "x"));
  PE_TRY(pe_tensor_resize(&in[1], PE_I64, &ys, "y"));
  pr->filling = pr->step++;
  return NULL;
}

/* One-phase: produce_sizes, then the whole batch made by the producer. */
static pe_status *produce(void *ctx, pe_tensor *in, int n_in, bool *end) {
  producer *pr = ctx;
  int step = pr->step;
  PE_TRY(produce_sizes(ctx, in, n_in, end));
  if (pr->step != step) make_batch(step, sizes[step], pe_f32(&in[0]), pe_i64(&in[1]));
  return NULL;
}

static pe_status *fill_rows(void *ctx, pe_tensor *in, int n_in, int64_t lo, int64_t hi) {
  producer *pr = ctx;
  (void)n_in;
  float x[16 * DIM];
  int64_t y[16];
  int n = sizes[pr->filling];
  make_batch(pr->filling, n, x, y);
  memcpy(pe_f32(&in[0]) + lo * DIM, x + lo * DIM, sizeof(float) * (size_t)((hi - lo) * DIM));
  memcpy(pe_i64(&in[1]) + lo, y + lo, sizeof(int64_t) * (size_t)(hi - lo));
  return NULL;
}

/* Every persistable of a and b is the same, bit for bit, on every place. */
static void models_equal(const par *a, const par *b, int places) {
  const char *const *names;
  int n = 0;
  PE_CK_OK(pe_model_names(a->m, (const char ***)&names, &n));
  ck_assert_int_gt(n, 0);
  for (int i = 0; i < n; i++) {
    pe_tensor ta, tb;
    pe_tensor_init(&ta);
    pe_tensor_init(&tb);
    for (int q = 0; q < places; q++) {
      if (pe_model_get_place(a->m, names[i], q, &ta)) continue; /* not on this place */
      PE_CK_OK(pe_model_get_place(b->m, names[i], q, &tb));
      ck_assert_int_eq(pe_tensor_bytes(&ta), pe_tensor_bytes(&tb));
      ck_assert_msg(memcmp(ta.data, tb.data, pe_tensor_bytes(&ta)) == 0, "%s differs on place %d",
                    names[i], q);
    }
    pe_tensor_release(&ta);
    pe_tensor_release(&tb);
  }
  free((void *)names);
}

/* Two executors on the same places with the same parameters (copied from
 * the sequential reference): `whole` runs whole batches, `pf` prefetched
 * ones; dev holds the places' devices for the prefetcher. */
typedef struct twins {
  pe_runtime *rt;
  seqref s;
  par whole, pf;
  pe_device *dev[PE_MAX_PLACES];
} twins;

static void twins_new(twins *t, pe_place_kind kind, int places) {
  t->rt = rt_new(2);
  seq_new(&t->s, 5);
  par_new(&t->whole, t->rt, kind, places, PE_STRATEGY_ALLREDUCE, false, 5);
  par_new(&t->pf, t->rt, kind, places, PE_STRATEGY_ALLREDUCE, false, 5);
  copy_params(&t->s, &t->whole);
  copy_params(&t->s, &t->pf);
  for (int q = 0; q < places; q++)
    PE_CK_OK(pe_runtime_device(t->rt, (pe_place){kind, q}, places, &t->dev[q]));
}

static void twins_free(twins *t) {
  par_free(&t->whole);
  par_free(&t->pf);
  seq_free(&t->s);
  pe_runtime_free(t->rt);
}

static void prefetched_equals_whole(pe_place_kind kind, int places) {
  twins tw;
  twins_new(&tw, kind, places);
  producer pr = {0};
  /* The places' devices, as pe-bench passes them: cpu parts are views of
   * one staging buffer, sim parts are copies on each device. */
  pe_prefetch_opts po = {
      .n_places = places, .n_inputs = 2, .produce = produce, .ctx = &pr, .devices = tw.dev};
  pe_prefetch *p = NULL;
  PE_CK_OK(pe_prefetch_start(&po, &p));
  pe_tensor out;
  pe_tensor_init(&out);
  for (int step = 0; step < STEPS; step++) {
    float want = par_step(&tw.whole, step, sizes[step], NULL);
    pe_prefetch_batch *b = NULL;
    PE_CK_OK(pe_prefetch_next(p, &b));
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(b->total, sizes[step]);
    const pe_tensor *xs[PE_MAX_PLACES], *ys[PE_MAX_PLACES];
    for (int q = 0; q < places; q++) {
      xs[q] = pe_prefetch_part(b, q, 0);
      ys[q] = pe_prefetch_part(b, q, 1);
      bool view = xs[q]->alloc == NULL;
      ck_assert_msg(view == (kind == PE_PLACE_CPU), "step %d place %d: view %d", step, q, view);
      if (view && q > 0 && b->counts[q] && b->counts[q - 1])
        ck_assert_ptr_eq(xs[q]->data, pe_f32(xs[q - 1]) + b->counts[q - 1] * DIM);
    }
    pe_feed_split feeds[2] = {{"x", xs}, {"y", ys}};
    pe_run_stats st;
    PE_CK_OK(pe_par_exec_run_split(tw.pf.step, feeds, 2, &LOSS, 1, &out, NULL, &st));
    pe_prefetch_release(p, b);
    ck_assert_int_eq(st.batch, sizes[step]);
    float got = pe_f32(&out)[0];
    ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "step %d: split %.9g, whole %.9g", step,
                  got, want);
  }
  pe_prefetch_batch *b = NULL;
  PE_CK_OK(pe_prefetch_next(p, &b));
  ck_assert_ptr_null(b); /* end of data */
  pe_prefetch_stop(p);

  models_equal(&tw.whole, &tw.pf, places);

  /* A whole-batch run after split runs copies again (the views are gone). */
  float want = par_step(&tw.whole, 0, 5, NULL), got = par_step(&tw.pf, 0, 5, NULL);
  ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "whole after split: %.9g vs %.9g", got, want);

  pe_tensor_release(&out);
  twins_free(&tw);
}

/* pe_prefetch_run_steps: each step's loss and batch size reach done in
 * order; max stops a call (end false), the next call resumes at the next
 * batch, the prefetcher's end sets end. */
typedef struct steps_seen {
  int64_t first; /* the call's first step is step `first` of the data */
  float loss[STEPS];
  int64_t samples[STEPS];
  int n;
} steps_seen;

static pe_status *on_step(void *ctx, int64_t step, int64_t samples, const pe_tensor *fetched,
                          int n_fetch) {
  steps_seen *s = ctx;
  ck_assert_int_eq(n_fetch, 1);
  ck_assert_int_eq(step + s->first, s->n);
  s->loss[s->n] = pe_f32(&fetched[0])[0];
  s->samples[s->n++] = samples;
  return NULL;
}

static void run_steps_equal_whole(pe_place_kind kind, int places) {
  twins tw;
  twins_new(&tw, kind, places);
  producer pr = {0};
  /* As the daemon and pe-bench do: on cpu the pool's workers fill. */
  pe_prefetch_opts po = {.n_places = places,
                         .n_inputs = 2,
                         .depth = 3,
                         .produce = produce_sizes,
                         .fill = fill_rows,
                         .ctx = &pr,
                         .devices = tw.dev,
                         .pool = kind == PE_PLACE_CPU ? pe_runtime_pool(tw.rt) : NULL};
  pe_prefetch *p = NULL;
  PE_CK_OK(pe_prefetch_start(&po, &p));
  steps_seen seen = {0};
  const char *names[2] = {"x", "y"};
  pe_prefetch_steps ps = {.pf = p,
                          .n_places = places,
                          .n_inputs = 2,
                          .names = names,
                          .max = 4,
                          .done = on_step,
                          .ctx = &seen};
  pe_tensor out;
  pe_tensor_init(&out);
  int64_t steps = 0;
  PE_CK_OK(pe_prefetch_run_steps(tw.pf.step, &ps, &LOSS, 1, &out, NULL, &steps));
  ck_assert_int_eq(steps, 4);
  ck_assert(!ps.end);
  seen.first = 4;
  ps.max = 0;
  PE_CK_OK(pe_prefetch_run_steps(tw.pf.step, &ps, &LOSS, 1, &out, NULL, &steps));
  ck_assert_int_eq(steps, STEPS - 4);
  ck_assert(ps.end);
  pe_prefetch_stop(p);
  ck_assert_int_eq(seen.n, STEPS);
  for (int step = 0; step < STEPS; step++) {
    float want = par_step(&tw.whole, step, sizes[step], NULL);
    ck_assert_int_eq(seen.samples[step], sizes[step]);
    ck_assert_msg(memcmp(&seen.loss[step], &want, sizeof want) == 0,
                  "step %d: run_steps %.9g, whole %.9g", step, seen.loss[step], want);
  }
  models_equal(&tw.whole, &tw.pf, places);
  pe_tensor_release(&out);
  twins_free(&tw);
}

START_TEST(run_steps_cpu3) {
  run_steps_equal_whole(PE_PLACE_CPU, 3);
}
END_TEST
START_TEST(run_steps_sim2) {
  run_steps_equal_whole(PE_PLACE_SIM, 2);
}
END_TEST

START_TEST(prefetch_cpu3) {
  prefetched_equals_whole(PE_PLACE_CPU, 3);
}
END_TEST
START_TEST(prefetch_sim3) {
  prefetched_equals_whole(PE_PLACE_SIM, 3);
}
END_TEST

/* Parts that disagree on rows, or a missing part, are errors naming the feed
 * and the place; the executor keeps working afterwards. */
START_TEST(split_errors) {
  pe_runtime *rt = rt_new(2);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, 5);
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  float x[4 * DIM] = {0};
  int64_t y[4] = {0};
  pe_tensor x0, x1, y0, y1;
  pe_shape s2 = PE_SHAPE(2, DIM), s1 = PE_SHAPE(1, 1), s2y = PE_SHAPE(2, 1);
  pe_tensor_init(&x0);
  pe_tensor_init(&x1);
  pe_tensor_init(&y0);
  pe_tensor_init(&y1);
  pe_tensor_view(&x0, PE_F32, &s2, x);
  pe_tensor_view(&x1, PE_F32, &s2, x + 2 * DIM);
  pe_tensor_view(&y0, PE_I64, &s2y, y);
  pe_tensor_view(&y1, PE_I64, &s1, y + 2); /* 1 row where x has 2 */
  const pe_tensor *xs[2] = {&x0, &x1}, *ys[2] = {&y0, &y1};
  pe_feed_split feeds[2] = {{"x", xs}, {"y", ys}};
  pe_tensor out;
  pe_tensor_init(&out);
  pe_status *st = pe_par_exec_run_split(q.step, feeds, 2, &LOSS, 1, &out, NULL, NULL);
  expect_error(st, PE_ESHAPE, "place 1");
  pe_feed_split only_x[1] = {{"x", xs}};
  st = pe_par_exec_run_split(q.step, only_x, 1, &LOSS, 1, &out, NULL, NULL);
  expect_error(st, PE_EMISSING_FEED, "'y'");
  ys[1] = &y0;
  PE_CK_OK(pe_par_exec_run_split(q.step, feeds, 2, &LOSS, 1, &out, NULL, NULL));
  pe_tensor_release(&out);
  par_free(&q);
  pe_runtime_free(rt);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_prefetch");
  TCase *tc = tcase_create("par_prefetch");
  tcase_add_test(tc, prefetch_cpu3);
  tcase_add_test(tc, prefetch_sim3);
  tcase_add_test(tc, split_errors);
  tcase_add_test(tc, run_steps_cpu3);
  tcase_add_test(tc, run_steps_sim2);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
