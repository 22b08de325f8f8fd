/* pe_batch_prefetch: the batches come out in the batcher's order with its
 * contents, the pair the consumer holds is never refilled under it, the
 * max_batches cap, stopping mid-epoch, and bad arguments. Runs under
 * ThreadSanitizer in ./pe test. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "pe_batch_prefetch.h"

#define N_EX 103 /* examples: the last batch of 8 is short */
#define DIM 5
#define BATCH 8

/* Example i's pixels are i*DIM + j and its label i: every batch names the
 * examples it holds. */
static pe_dataset *make_ds(void) {
  pe_dataset *ds = calloc(1, sizeof *ds);
  ck_assert_ptr_nonnull(ds);
  ds->n = N_EX;
  ds->rows = 1;
  ds->cols = DIM;
  ds->dim = DIM;
  ds->images = malloc(sizeof(float) * N_EX * DIM);
  ds->labels = malloc(sizeof(int64_t) * N_EX);
  ck_assert(ds->images && ds->labels);
  for (int i = 0; i < N_EX; i++) {
    ds->labels[i] = i;
    for (int j = 0; j < DIM; j++) ds->images[i * DIM + j] = (float)(i * DIM + j);
  }
  return ds;
}

static void sleep_ms(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

typedef struct bufs {
  float x0[BATCH * DIM], x1[BATCH * DIM];
  int64_t y0[BATCH], y1[BATCH];
  float *x[2];
  int64_t *y[2];
} bufs;

/* A data set, the batcher under test, a reference batcher with the same
 * order, and the two buffer pairs. */
typedef struct fixture {
  pe_dataset *ds;
  pe_batcher *bt, *ref;
  bufs b;
} fixture;

static void fx_open(fixture *f, bool shuffle, uint64_t seed) {
  f->ds = make_ds();
  f->bt = pe_batcher_new(f->ds, BATCH, shuffle, seed);
  f->ref = pe_batcher_new(f->ds, BATCH, shuffle, seed);
  ck_assert(f->bt && f->ref);
  f->b.x[0] = f->b.x0, f->b.x[1] = f->b.x1;
  f->b.y[0] = f->b.y0, f->b.y[1] = f->b.y1;
}

static void fx_close(fixture *f) {
  pe_batcher_free(f->bt);
  pe_batcher_free(f->ref);
  pe_dataset_free(f->ds);
}

/* One epoch through a prefetch (cap max) against a synchronous batcher with
 * the same seed; the consumer sleeps on some batches so that the thread
 * runs ahead and waits for the held pair. Returns the batches seen. */
static int epoch_matches(pe_batcher *bt, pe_batcher *ref, long max, bufs *b) {
  pe_batch_prefetch *pf;
  ck_assert_int_eq(pe_batch_prefetch_start(bt, b->x, b->y, max, &pf), 0);
  float rx[BATCH * DIM];
  int64_t ry[BATCH];
  int seen = 0, n, k;
  while ((k = pe_batch_prefetch_next(pf, &n)) >= 0) {
    ck_assert_int_eq(k, seen % 2);  /* the pairs alternate */
    if (seen % 3 == 0) sleep_ms(5); /* the thread fills the other pair and waits */
    int rn;
    ck_assert(pe_batcher_next(ref, rx, ry, &rn));
    ck_assert_int_eq(n, rn);
    ck_assert_mem_eq(b->x[k], rx, sizeof(float) * (size_t)n * DIM);
    ck_assert_mem_eq(b->y[k], ry, sizeof(int64_t) * (size_t)n);
    seen++;
  }
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(pe_batch_prefetch_next(pf, &n), -1); /* stays at the end */
  pe_batch_prefetch_stop(pf);
  return seen;
}

START_TEST(same_batches_as_the_batcher) {
  fixture f;
  fx_open(&f, true, 42);
  for (int ep = 0; ep < 2; ep++) {
    ck_assert_int_eq(epoch_matches(f.bt, f.ref, 0, &f.b), (N_EX + BATCH - 1) / BATCH);
    int n;
    float rx[BATCH * DIM];
    int64_t ry[BATCH];
    ck_assert(!pe_batcher_next(f.ref, rx, ry, &n)); /* both batchers at the epoch's end */
  }
  ck_assert_int_eq(pe_batcher_epoch(f.bt), 2);
  fx_close(&f);
}
END_TEST

START_TEST(max_batches_caps_an_epoch) {
  fixture f;
  fx_open(&f, true, 7);
  ck_assert_int_eq(epoch_matches(f.bt, f.ref, 3, &f.b), 3);
  /* The batcher is left mid-epoch for the caller to reset. */
  pe_batcher_reset(f.bt);
  pe_batcher_reset(f.ref);
  ck_assert_int_eq(epoch_matches(f.bt, f.ref, 0, &f.b), (N_EX + BATCH - 1) / BATCH);
  fx_close(&f);
}
END_TEST

START_TEST(stop_mid_epoch) {
  fixture f;
  fx_open(&f, false, 0);
  pe_batch_prefetch *pf;
  /* Stopped at once, and after one batch with the thread waiting for the
   * held pair: both return, and the batcher is the caller's again. */
  ck_assert_int_eq(pe_batch_prefetch_start(f.bt, f.b.x, f.b.y, 0, &pf), 0);
  pe_batch_prefetch_stop(pf);
  pe_batcher_reset(f.bt);
  ck_assert_int_eq(pe_batch_prefetch_start(f.bt, f.b.x, f.b.y, 0, &pf), 0);
  int n;
  ck_assert_int_eq(pe_batch_prefetch_next(pf, &n), 0);
  ck_assert_int_eq(n, BATCH);
  ck_assert(f.b.y0[0] == 0 && f.b.y0[BATCH - 1] == BATCH - 1); /* no shuffle: examples 0..7 */
  sleep_ms(5);
  pe_batch_prefetch_stop(pf);
  pe_batcher_reset(f.bt);
  int64_t y[BATCH];
  ck_assert(pe_batcher_next(f.bt, NULL, y, &n));
  ck_assert_int_eq(y[0], 0);
  pe_batch_prefetch_stop(NULL);
  fx_close(&f);
}
END_TEST

START_TEST(bad_arguments) {
  fixture f;
  fx_open(&f, false, 0);
  pe_batch_prefetch *pf = (pe_batch_prefetch *)&f; /* must be cleared */
  errno = 0;
  ck_assert_int_eq(pe_batch_prefetch_start(NULL, f.b.x, f.b.y, 0, &pf), -1);
  ck_assert_int_eq(errno, EINVAL);
  ck_assert_ptr_null(pf);
  float *x_missing[2] = {f.b.x0, NULL};
  ck_assert_int_eq(pe_batch_prefetch_start(f.bt, x_missing, f.b.y, 0, &pf), -1);
  ck_assert_int_eq(pe_batch_prefetch_start(f.bt, f.b.x, f.b.y, -1, &pf), -1);
  ck_assert_int_eq(pe_batch_prefetch_start(f.bt, f.b.x, f.b.y, 0, NULL), -1);
  fx_close(&f);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("batch_prefetch");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, same_batches_as_the_batcher);
  tcase_add_test(tc, max_batches_caps_an_epoch);
  tcase_add_test(tc, stop_mid_epoch);
  tcase_add_test(tc, bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
