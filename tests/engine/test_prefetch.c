/* Prefetch: every batch in order with the right splits, overlap with the
 * consumer, producer errors on next, clean stop, sim devices, two-phase
 * batches filled per place on a pool (and their errors), without a thread,
 * and try_next. */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "engine/prefetch.h"

/* A producer of batches of given sizes. Sample s has image row
 * {s, s+0.25, s+0.5} (f32 [B,3]) and label s (i64 [B]). With two_phase,
 * produce only sizes the inputs and fill writes the rows (opts.fill). */
typedef struct source {
  const int64_t *sizes;
  int n_batches;
  int fail_at; /* batch index that fails; -1: none */
  int next;    /* the producer's (one call at a time) */
  int64_t sample;
  _Atomic int calls; /* producer calls started (read by the consumer) */
  /* two_phase */
  bool two_phase;
  int np;                  /* places, to check each fill's rows */
  int fill_fail_batch;     /* fill of this batch fails (-1: none)... */
  int fill_fail_place;     /* ...for this place's rows */
  const pe_pool *pool;     /* fills are expected on its workers when set */
  int64_t base;            /* the batch's first sample (set by produce) */
  int64_t total;           /* the batch's rows */
  _Atomic int fills;       /* fill calls */
  _Atomic int fills_wrong; /* calls on the wrong thread or rows */
} source;

static void write_rows(pe_tensor *in, int64_t lo, int64_t hi, int64_t base) {
  for (int64_t i = lo; i < hi; i++) {
    int64_t id = base + i;
    for (int j = 0; j < 3; j++) pe_f32(&in[0])[i * 3 + j] = (float)id + 0.25f * (float)j;
    pe_i64(&in[1])[i] = id;
  }
}

static pe_status *produce(void *ctx, pe_tensor *in, int n_inputs, bool *end) {
  source *s = ctx;
  atomic_fetch_add_explicit(&s->calls, 1, memory_order_release);
  if (s->next == s->fail_at) return pe_error(PE_EIO, "reading record %d failed", s->next);
  if (s->next == s->n_batches) {
    *end = true;
    return NULL;
  }
  int64_t b = s->sizes[s->next++];
  pe_shape img = PE_SHAPE(b, 3), lab = PE_SHAPE(b);
  PE_TRY(pe_tensor_resize(&in[0], PE_F32, &img, "image"));
  PE_TRY(pe_tensor_resize(&in[1], PE_I64, &lab, "label"));
  s->base = s->sample;
  s->total = b;
  s->sample += b;
  if (!s->two_phase) write_rows(in, 0, b, s->base);
  return NULL;
}

/* opts.fill: rows [lo, hi) must be one piece of one place's rows (with a
 * pool, on one of its workers: pe_prefetch_fill_pieces pieces of near-equal
 * size) or, without a pool, the whole batch on the thread. */
static pe_status *fill(void *ctx, pe_tensor *in, int n_inputs, int64_t lo, int64_t hi) {
  source *s = ctx;
  (void)n_inputs;
  atomic_fetch_add(&s->fills, 1);
  int place = -1;
  if (s->pool) {
    for (int64_t p = 0, off = 0; p < s->np; off += pe_split_count(s->total, s->np, (int)p), p++) {
      int64_t cnt = pe_split_count(s->total, s->np, (int)p);
      int k = pe_prefetch_fill_pieces(cnt);
      for (int i = 0; i < k; i++)
        if (lo == off + cnt * i / k && hi == off + cnt * (i + 1) / k) place = (int)p;
    }
    if (place < 0 || !pe_pool_is_worker(s->pool)) atomic_fetch_add(&s->fills_wrong, 1);
  } else if (lo != 0 || hi != s->total || pe_pool_current_worker() >= 0) {
    atomic_fetch_add(&s->fills_wrong, 1);
  }
  if (s->next - 1 == s->fill_fail_batch && place == s->fill_fail_place)
    return pe_error(PE_EIO, "rows %lld..%lld unreadable", (long long)lo, (long long)hi);
  write_rows(in, lo, hi, s->base);
  return NULL;
}

/* Check batch b: place p gets the next counts[p] samples starting at *id. */
static void check_batch(const pe_prefetch_batch *b, int np, int64_t size, int64_t *id,
                        pe_place_kind kind) {
  ck_assert_int_eq(b->total, size);
  ck_assert_int_eq(b->n_places, np);
  ck_assert_int_eq(b->n_inputs, 2);
  for (int p = 0; p < np; p++) {
    int64_t cnt = b->counts[p];
    ck_assert_int_eq(cnt, pe_split_count(size, np, p));
    const pe_tensor *img = pe_prefetch_part(b, p, 0), *lab = pe_prefetch_part(b, p, 1);
    ck_assert_int_eq(img->shape.ndim, 2);
    ck_assert_int_eq(img->shape.d[0], cnt);
    ck_assert_int_eq(img->shape.d[1], 3);
    ck_assert_int_eq(lab->shape.d[0], cnt);
    ck_assert_int_eq(img->place.kind, kind);
    ck_assert_int_eq(img->place.id, p);
    bool ok = true;
    for (int64_t i = 0; i < cnt; i++, (*id)++) {
      ok &= pe_i64(lab)[i] == *id;
      for (int j = 0; j < 3; j++) ok &= pe_f32(img)[i * 3 + j] == (float)*id + 0.25f * (float)j;
    }
    ck_assert_msg(ok, "batch %llu place %d: wrong samples", (unsigned long long)b->index, p);
  }
}

START_TEST(split_rule) {
  /* 3 samples on 4 places: 1,1,1,0 */
  int64_t want[] = {1, 1, 1, 0};
  for (int p = 0; p < 4; p++) ck_assert_int_eq(pe_split_count(3, 4, p), want[p]);
  int64_t sum = 0;
  for (int p = 0; p < 7; p++) sum += pe_split_count(100, 7, p);
  ck_assert_int_eq(sum, 100);
  ck_assert_int_eq(pe_split_count(100, 7, 0), 15);
  ck_assert_int_eq(pe_split_count(100, 7, 6), 14);
}
END_TEST

START_TEST(delivers_every_batch_in_order) {
  static const int64_t sizes[] = {3, 8, 0, 5, 64, 1, 7, 4, 13, 2};
  const int nb = (int)(sizeof sizes / sizeof sizes[0]);
  for (int np = 1; np <= 5; np++) {
    source src = {.sizes = sizes, .n_batches = nb, .fail_at = -1};
    pe_prefetch *pf;
    pe_prefetch_opts o = {.n_places = np, .n_inputs = 2, .produce = produce, .ctx = &src};
    ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
    int64_t id = 0;
    for (int k = 0; k < nb; k++) {
      pe_prefetch_batch *b;
      pe_status *st = pe_prefetch_next(pf, &b);
      ck_assert_msg(!st, "%s", pe_status_msg(st));
      ck_assert_ptr_nonnull(b);
      ck_assert_uint_eq(b->index, (uint64_t)k);
      check_batch(b, np, sizes[k], &id, PE_PLACE_CPU);
      if (np == 4 && k == 0) {
        ck_assert_int_eq(b->counts[0], 1);
        ck_assert_int_eq(b->counts[3], 0);
      }
      pe_prefetch_release(pf, b);
    }
    pe_prefetch_batch *b;
    ck_assert_ptr_null(pe_prefetch_next(pf, &b));
    ck_assert_ptr_null(b); /* end of data */
    ck_assert_ptr_null(pe_prefetch_next(pf, &b));
    ck_assert_ptr_null(b);
    pe_prefetch_stop(pf);
  }
}
END_TEST

static bool wait_calls(source *s, int n) {
  for (int i = 0; i < 5000; i++) {
    if (atomic_load_explicit(&s->calls, memory_order_acquire) >= n) return true;
    usleep(1000);
  }
  return false;
}

START_TEST(next_batch_is_prepared_during_the_step) {
  /* While the consumer holds batch k, the thread must already be working
   * on batch k+1 (double buffering): the consumer waits, batch in hand,
   * until the producer has been called for k+1. */
  static const int64_t sizes[] = {4, 4, 4, 4, 4, 4};
  source src = {.sizes = sizes, .n_batches = 6, .fail_at = -1};
  pe_prefetch *pf;
  pe_prefetch_opts o = {.n_places = 2, .n_inputs = 2, .depth = 2, .produce = produce, .ctx = &src};
  ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
  int64_t id = 0;
  for (int k = 0; k < 6; k++) {
    pe_prefetch_batch *b;
    ck_assert_ptr_null(pe_prefetch_next(pf, &b));
    ck_assert_msg(wait_calls(&src, k + 2), "batch %d+1 not started during step %d", k, k);
    check_batch(b, 2, 4, &id, PE_PLACE_CPU);
    pe_prefetch_release(pf, b);
  }
  pe_prefetch_stop(pf);
}
END_TEST

/* n_good batches of `size` samples on np places arrive, then next returns
 * PE_EIO naming `what` and `why`, and again on the call after it. */
static void expect_batches_then_error(pe_prefetch *pf, int n_good, int np, int64_t size,
                                      const char *what, const char *why) {
  int64_t id = 0;
  for (int k = 0; k < n_good; k++) {
    pe_prefetch_batch *b;
    ck_assert_ptr_null(pe_prefetch_next(pf, &b));
    ck_assert_ptr_nonnull(b);
    check_batch(b, np, size, &id, PE_PLACE_CPU);
    pe_prefetch_release(pf, b);
  }
  for (int again = 0; again < 2; again++) {
    pe_prefetch_batch *b;
    pe_status *st = pe_prefetch_next(pf, &b);
    ck_assert_ptr_null(b);
    ck_assert_int_eq(pe_status_code(st), PE_EIO);
    ck_assert_ptr_nonnull(strstr(pe_status_msg(st), what));
    ck_assert_ptr_nonnull(strstr(pe_status_msg(st), why));
    pe_status_free(st);
  }
}

START_TEST(producer_error_surfaces_on_next) {
  static const int64_t sizes[] = {2, 2, 2, 2, 2};
  source src = {.sizes = sizes, .n_batches = 5, .fail_at = 3};
  pe_prefetch *pf;
  pe_prefetch_opts o = {.n_places = 2, .n_inputs = 2, .produce = produce, .ctx = &src};
  ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
  expect_batches_then_error(pf, 3, 2, 2, "prefetch batch 3", "reading record 3 failed");
  pe_prefetch_stop(pf);
}
END_TEST

/* Inputs whose batch sizes differ. */
static pe_status *produce_bad(void *ctx, pe_tensor *in, int n_inputs, bool *end) {
  pe_shape a = PE_SHAPE(4, 2), b = PE_SHAPE(3);
  PE_TRY(pe_tensor_resize(&in[0], PE_F32, &a, "x"));
  PE_TRY(pe_tensor_resize(&in[1], PE_I64, &b, "y"));
  memset(in[0].data, 0, pe_tensor_bytes(&in[0]));
  memset(in[1].data, 0, pe_tensor_bytes(&in[1]));
  return NULL;
}

START_TEST(mismatched_batch_sizes_fail) {
  pe_prefetch *pf;
  pe_prefetch_opts o = {.n_places = 3, .n_inputs = 2, .produce = produce_bad};
  ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
  pe_prefetch_batch *b;
  pe_status *st = pe_prefetch_next(pf, &b);
  ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
  ck_assert_ptr_nonnull(strstr(pe_status_msg(st), "[3]"));
  pe_status_free(st);
  pe_prefetch_stop(pf);
  o.n_places = 0;
  st = pe_prefetch_start(&o, &pf);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
}
END_TEST

START_TEST(stop_with_batches_outstanding) {
  /* An endless source; the consumer holds batches and stops without
   * releasing them; the thread is blocked on a full ring. */
  static const int64_t sizes[] = {5, 5, 5, 5, 5, 5, 5, 5};
  for (int held = 0; held <= 2; held++) {
    source src = {.sizes = sizes, .n_batches = 8, .fail_at = -1};
    pe_prefetch *pf;
    pe_prefetch_opts o = {.n_places = 3, .n_inputs = 2, .produce = produce, .ctx = &src};
    ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
    for (int k = 0; k < held; k++) {
      pe_prefetch_batch *b;
      ck_assert_ptr_null(pe_prefetch_next(pf, &b));
      ck_assert_ptr_nonnull(b);
    }
    usleep(10000);
    pe_prefetch_stop(pf);
  }
  pe_prefetch_stop(NULL);
}
END_TEST

START_TEST(sim_devices_receive_parts) {
  enum { NP = 3 };
  static const int64_t sizes[] = {7, 2, 9, 3};
  pe_device *dev[NP];
  for (int p = 0; p < NP; p++)
    ck_assert_ptr_null(pe_device_open((pe_place){PE_PLACE_SIM, p}, NULL, &dev[p]));
  source src = {.sizes = sizes, .n_batches = 4, .fail_at = -1};
  pe_prefetch *pf;
  pe_prefetch_opts o = {
      .n_places = NP, .n_inputs = 2, .produce = produce, .ctx = &src, .devices = dev};
  ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
  int64_t id = 0;
  for (int k = 0; k < 4; k++) {
    pe_prefetch_batch *b;
    ck_assert_ptr_null(pe_prefetch_next(pf, &b));
    check_batch(b, NP, sizes[k], &id, PE_PLACE_SIM);
    for (int p = 0; p < NP; p++)
      if (b->counts[p])
        ck_assert_ptr_eq(pe_prefetch_part(b, p, 0)->alloc, pe_device_allocator(dev[p]));
    pe_prefetch_release(pf, b);
  }
  pe_prefetch_batch *b;
  ck_assert_ptr_null(pe_prefetch_next(pf, &b));
  ck_assert_ptr_null(b);
  pe_prefetch_stop(pf); /* before the devices: parts hold their memory */
  for (int p = 0; p < NP; p++) {
    ck_assert_uint_eq(pe_allocator_stats(pe_device_allocator(dev[p])).bytes_in_use, 0);
    pe_device_close(dev[p]);
  }
}
END_TEST

/* Fill calls of a batch of `size` rows on np places with a pool. */
static int pieces_of(int64_t size, int np) {
  int n = 0;
  for (int p = 0; p < np; p++) n += pe_prefetch_fill_pieces(pe_split_count(size, np, p));
  return n;
}

START_TEST(fill_rows_on_the_pool) {
  /* Two-phase batches: each place's rows are written by tasks on the pool,
   * in pieces of at least 8 rows, at most 8 pieces (one for a place with 0
   * to 15 rows), then split as before; without a pool the thread fills the
   * whole batch in one call. */
  static const int64_t sizes[] = {3, 8, 0, 5, 64, 1, 7, 4, 13, 2};
  const int nb = (int)(sizeof sizes / sizeof sizes[0]);
  for (int workers = 0; workers <= 2; workers++) {
    pe_pool *pool = NULL;
    if (workers) ck_assert_ptr_null(pe_pool_new(workers, NULL, &pool));
    for (int np = 1; np <= 4; np++) {
      source src = {.sizes = sizes,
                    .n_batches = nb,
                    .fail_at = -1,
                    .two_phase = true,
                    .np = np,
                    .fill_fail_batch = -1,
                    .pool = pool};
      pe_prefetch *pf;
      pe_prefetch_opts o = {.n_places = np,
                            .n_inputs = 2,
                            .depth = 3,
                            .produce = produce,
                            .fill = fill,
                            .pool = pool,
                            .ctx = &src};
      ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
      int64_t id = 0;
      for (int k = 0; k < nb; k++) {
        pe_prefetch_batch *b;
        ck_assert_ptr_null(pe_prefetch_next(pf, &b));
        ck_assert_ptr_nonnull(b);
        check_batch(b, np, sizes[k], &id, PE_PLACE_CPU);
        pe_prefetch_release(pf, b);
      }
      pe_prefetch_batch *b;
      ck_assert_ptr_null(pe_prefetch_next(pf, &b));
      ck_assert_ptr_null(b);
      pe_prefetch_stop(pf);
      int want = 0;
      for (int k = 0; k < nb; k++) want += pool ? pieces_of(sizes[k], np) : 1;
      int got = atomic_load(&src.fills);
      ck_assert_msg(got == want, "%d workers, %d places: %d fill calls, want %d", workers, np, got,
                    want);
      ck_assert_int_eq(atomic_load(&src.fills_wrong), 0);
    }
    pe_pool_free(pool);
  }
}
END_TEST

START_TEST(fill_error_surfaces_on_next) {
  /* Place 1's rows of batch 2 fail: batches 0 and 1 arrive, then the
   * error (wrapped with the batch) on every later next. With 6 rows, 2 a
   * place, one piece; with 48, 16 a place, two pieces, both of place 1's
   * fail and the first one's rows are named. */
  static const int64_t sizes[2][5] = {{6, 6, 6, 6, 6}, {48, 48, 48, 48, 48}};
  static const char *const why[2] = {"rows 2..4 unreadable", "rows 16..24 unreadable"};
  pe_pool *pool;
  ck_assert_ptr_null(pe_pool_new(2, NULL, &pool));
  pe_prefetch *pf;
  pe_prefetch_opts o = {
      .n_places = 3, .n_inputs = 2, .produce = produce, .fill = fill, .pool = pool};
  for (int c = 0; c < 2; c++) {
    source src = {.sizes = sizes[c],
                  .n_batches = 5,
                  .fail_at = -1,
                  .two_phase = true,
                  .np = 3,
                  .fill_fail_batch = 2,
                  .fill_fail_place = 1,
                  .pool = pool};
    o.ctx = &src;
    ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
    expect_batches_then_error(pf, 2, 3, sizes[c][0], "prefetch batch 2", why[c]);
    pe_prefetch_stop(pf);
  }
  /* A pool without a fill is refused. */
  o.fill = NULL;
  pe_status *st = pe_prefetch_start(&o, &pf);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  pe_pool_free(pool);
}
END_TEST

/* Threads of this process (/proc/self/task entries). */
static int process_threads(void) {
  DIR *d = opendir("/proc/self/task");
  ck_assert_ptr_nonnull(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* A pool task that holds its worker until the gate opens. */
typedef struct gate {
  atomic_bool open, entered;
  pe_task task;
} gate;

static void gate_run(void *arg) {
  gate *g = arg;
  atomic_store(&g->entered, true);
  while (!atomic_load(&g->open)) usleep(100);
}

static void *open_gate_later(void *arg) {
  usleep(20000);
  atomic_store(&((gate *)arg)->open, true);
  return NULL;
}

START_TEST(pool_fill_has_no_thread_and_try_next) {
  /* With a pool there is no prefetch thread: production is kicked by the
   * start, each release and each finished batch. Its one worker is held by
   * a gate, so batch 0's rows wait: try_next says not ready and takes
   * nothing; once the gate opens, every batch arrives in order. Then stop
   * with a batch in flight (its fills queued behind a closed gate) waits
   * for them. */
  static const int64_t sizes[] = {4, 7, 0, 5, 9};
  const int nb = (int)(sizeof sizes / sizeof sizes[0]);
  pe_pool *pool;
  ck_assert_ptr_null(pe_pool_new(1, NULL, &pool));
  gate g = {0};
  g.task = (pe_task){gate_run, &g, NULL};
  pe_pool_submit(pool, &g.task);
  while (!atomic_load(&g.entered)) usleep(100);

  source src = {.sizes = sizes,
                .n_batches = nb,
                .fail_at = -1,
                .two_phase = true,
                .np = 2,
                .fill_fail_batch = -1,
                .pool = pool};
  pe_prefetch_opts o = {.n_places = 2,
                        .n_inputs = 2,
                        .depth = 2,
                        .produce = produce,
                        .fill = fill,
                        .pool = pool,
                        .ctx = &src};
  int threads = process_threads();
  pe_prefetch *pf;
  ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
  ck_assert_int_eq(process_threads(), threads);
  ck_assert_int_eq(atomic_load(&src.calls), 1); /* batch 0 sized by the start */
  pe_prefetch_batch *b = (pe_prefetch_batch *)&g;
  bool ready = true;
  ck_assert_ptr_null(pe_prefetch_try_next(pf, &b, &ready));
  ck_assert(!ready);
  ck_assert_ptr_null(b);
  atomic_store(&g.open, true);
  int64_t id = 0;
  for (int k = 0; k < nb; k++) {
    if (k % 2) { /* alternate: poll, then block */
      do ck_assert_ptr_null(pe_prefetch_try_next(pf, &b, &ready));
      while (!ready);
    } else {
      ck_assert_ptr_null(pe_prefetch_next(pf, &b));
    }
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(b->index, k);
    check_batch(b, 2, sizes[k], &id, PE_PLACE_CPU);
    pe_prefetch_release(pf, b);
  }
  /* The end (the producer says so on whichever thread kicks it last):
   * then try_next too is ready, with no batch. */
  ck_assert_ptr_null(pe_prefetch_next(pf, &b));
  ck_assert_ptr_null(b);
  b = (pe_prefetch_batch *)&g;
  ck_assert_ptr_null(pe_prefetch_try_next(pf, &b, &ready));
  ck_assert(ready);
  ck_assert_ptr_null(b);
  ck_assert_int_eq(atomic_load(&src.fills), nb * 2);
  ck_assert_int_eq(atomic_load(&src.fills_wrong), 0);
  pe_prefetch_stop(pf);

  /* Stop with batch 0 in flight behind a closed gate. */
  gate g2 = {0};
  g2.task = (pe_task){gate_run, &g2, NULL};
  pe_pool_submit(pool, &g2.task);
  while (!atomic_load(&g2.entered)) usleep(100);
  source src2 = src;
  src2.next = 0;
  src2.sample = 0;
  atomic_store(&src2.calls, 0);
  atomic_store(&src2.fills, 0);
  o.ctx = &src2;
  ck_assert_ptr_null(pe_prefetch_start(&o, &pf));
  pthread_t opener;
  ck_assert_int_eq(pthread_create(&opener, NULL, open_gate_later, &g2), 0);
  pe_prefetch_stop(pf); /* returns once batch 0's fills ran */
  ck_assert_int_eq(atomic_load(&src2.fills), 2);
  pthread_join(opener, NULL);
  pe_pool_free(pool);
}
END_TEST

static Suite *prefetch_suite(void) {
  Suite *s = suite_create("prefetch");
#define ADD(fn)                    \
  do {                             \
    TCase *tc = tcase_create(#fn); \
    tcase_add_test(tc, fn);        \
    suite_add_tcase(s, tc);        \
  } while (0)
  ADD(split_rule);
  ADD(delivers_every_batch_in_order);
  ADD(next_batch_is_prepared_during_the_step);
  ADD(producer_error_surfaces_on_next);
  ADD(mismatched_batch_sizes_fail);
  ADD(stop_with_batches_outstanding);
  ADD(sim_devices_receive_parts);
  ADD(fill_rows_on_the_pool);
  ADD(fill_error_surfaces_on_next);
  ADD(pool_fill_has_no_thread_and_try_next);
#undef ADD
  return s;
}

PE_CHECK_MAIN(prefetch_suite)
