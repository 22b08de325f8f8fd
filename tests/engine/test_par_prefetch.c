/* Input prefetch feeding the parallel executor (seed 002): pe_prefetch
 * splits batch k+1 onto the places on its own thread while step k runs, and
 * pe_par_exec_run_split binds the parts without copying. The losses and the
 * parameters must be bit-identical to whole-batch runs of the same batches
 * (same rows on the same places, same kernels), uneven splits included. */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "engine/prefetch.h"
#include "par_test_util.h"

enum { STEPS = 6 };
/* Batch sizes per step: uneven on 3 places, one smaller than the places. */
static const int sizes[STEPS] = {16, 11, 2, 16, 7, 13};

typedef struct producer {
  int step;
} producer;

static pe_status *produce(void *ctx, pe_tensor *in, int n_in, bool *end) {
  producer *pr = ctx;
  if (pr->step == STEPS) {
    *end = true;
    return NULL;
  }
  int n = sizes[pr->step];
  pe_shape xs = PE_SHAPE(n, DIM), ys = PE_SHAPE(n, 1);
  PE_TRY(pe_tensor_resize(&in[0], PE_F32, &xs, "x"));
  PE_TRY(pe_tensor_resize(&in[1], PE_I64, &ys, "y"));
  make_batch(pr->step, n, pe_f32(&in[0]), pe_i64(&in[1]));
  pr->step++;
  return NULL;
}

static void prefetched_equals_whole(pe_place_kind kind, int places) {
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 5);
  par whole, pf;
  par_new(&whole, rt, kind, places, PE_STRATEGY_ALLREDUCE, false, 5);
  par_new(&pf, rt, kind, places, PE_STRATEGY_ALLREDUCE, false, 5);
  copy_params(&s, &whole);
  copy_params(&s, &pf);

  producer pr = {0};
  /* The places' devices, as pe-bench passes them: cpu parts are views of
   * one staging buffer, sim parts are copies on each device. */
  pe_device *dev[PE_MAX_PLACES];
  for (int q = 0; q < places; q++)
    PE_CK_OK(pe_runtime_device(rt, (pe_place){kind, q}, places, &dev[q]));
  pe_prefetch_opts po = {
      .n_places = places, .n_inputs = 2, .produce = produce, .ctx = &pr, .devices = dev};
  pe_prefetch *p = NULL;
  PE_CK_OK(pe_prefetch_start(&po, &p));
  pe_tensor out;
  pe_tensor_init(&out);
  for (int step = 0; step < STEPS; step++) {
    float want = par_step(&whole, step, sizes[step], NULL);
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
    PE_CK_OK(pe_par_exec_run_split(pf.step, feeds, 2, &LOSS, 1, &out, NULL, &st));
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

  /* Same parameters, bit for bit, on every place. */
  const char *const *names;
  int n = 0;
  PE_CK_OK(pe_model_names(whole.m, (const char ***)&names, &n));
  ck_assert_int_gt(n, 0);
  for (int i = 0; i < n; i++) {
    pe_tensor a, c;
    pe_tensor_init(&a);
    pe_tensor_init(&c);
    for (int q = 0; q < places; q++) {
      if (pe_model_get_place(whole.m, names[i], q, &a)) continue; /* not on this place */
      PE_CK_OK(pe_model_get_place(pf.m, names[i], q, &c));
      ck_assert_int_eq(pe_tensor_bytes(&a), pe_tensor_bytes(&c));
      ck_assert_msg(memcmp(a.data, c.data, pe_tensor_bytes(&a)) == 0, "%s differs on place %d",
                    names[i], q);
    }
    pe_tensor_release(&a);
    pe_tensor_release(&c);
  }
  free((void *)names);

  /* A whole-batch run after split runs copies again (the views are gone). */
  float want = par_step(&whole, 0, 5, NULL), got = par_step(&pf, 0, 5, NULL);
  ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "whole after split: %.9g vs %.9g", got, want);

  pe_tensor_release(&out);
  par_free(&whole);
  par_free(&pf);
  seq_free(&s);
  pe_runtime_free(rt);
}

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
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, prefetch_cpu3);
  tcase_add_test(tc, prefetch_sim3);
  tcase_add_test(tc, split_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
