/* cuda places on a GPU: streams and events with both synchronisation
 * strategies (pe_device_sync_dep), errors kept on streams, copies through
 * pinned staging, the caching device allocator. Skipped without a GPU. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_ctx.h"
#include "cuda/kernels.h"
#include "cuda_test_main.h"
#include "engine/device.h"

static pe_device *open_cuda(int id) {
  pe_device *d = NULL;
  pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, id}, NULL, &d);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
  return d;
}

typedef struct fill_job {
  pe_stream *s;
  float *p;
  int64_t n;
  float v;
} fill_job;

/* Runs on the host with the stream current: enqueue a fill on it. */
static pe_status *fill_fn(void *arg) {
  fill_job *j = arg;
  return pe_cuda_status(pe_cu_fill(j->p, 0, j->v, j->n, pe_cuda_stream_handle(j->s)), "fill");
}

static pe_status *fail_fn(void *arg) {
  return pe_error(PE_EINVAL, "planned failure %d", *(int *)arg);
}

/* Producer fills on compute, the consumer (d2h stream) copies out after
 * the synchronisation rule; the values must be the producer's. A large
 * buffer makes the fill take long enough that a missing wait shows. */
static void producer_consumer(pe_sync_strategy strategy) {
  pe_device *d = open_cuda(0);
  const int64_t n = 1 << 24;
  size_t cap;
  float *buf = pe_device_alloc(d, (size_t)n * sizeof(float), &cap);
  ck_assert_ptr_nonnull(buf);
  static float host[1 << 24];
  pe_stream *comp = pe_device_stream(d, PE_STREAM_COMPUTE);
  pe_stream *d2h = pe_device_stream(d, PE_STREAM_D2H);
  for (int round = 1; round <= 3; round++) {
    fill_job j = {comp, buf, n, (float)round};
    ck_assert_ptr_null(pe_stream_launch(comp, fill_fn, &j));
    pe_event *e;
    ck_assert_ptr_null(pe_event_get(d, &e));
    ck_assert_ptr_null(pe_event_record(e, comp));
    ck_assert_ptr_null(pe_device_sync_dep(strategy, comp, e, d2h));
    pe_event_put(e); /* the wait captured its position */
    ck_assert_ptr_null(pe_stream_copy(d2h, host, buf, (size_t)n * sizeof(float), PE_COPY_D2H));
    ck_assert_ptr_null(pe_stream_sync(d2h));
    ck_assert_float_eq(host[0], (float)round);
    ck_assert_float_eq(host[n / 2], (float)round);
    ck_assert_float_eq(host[n - 1], (float)round);
  }
  ck_assert_ptr_null(pe_stream_sync(comp));
  pe_device_free(d, buf, cap);
  pe_device_close(d);
}

START_TEST(sync_dep_wait_event) {
  producer_consumer(PE_SYNC_WAIT_EVENT);
}
END_TEST

START_TEST(sync_dep_wait_producer) {
  producer_consumer(PE_SYNC_WAIT_PRODUCER);
}
END_TEST

START_TEST(events_query_and_sync) {
  pe_device *d = open_cuda(0);
  pe_event *e;
  ck_assert_ptr_null(pe_event_get(d, &e));
  ck_assert(pe_event_query(e)); /* never recorded: complete */
  ck_assert_ptr_null(pe_event_sync(e));
  ck_assert_ptr_nonnull(e->impl);
  size_t cap;
  float *buf = pe_device_alloc(d, 1 << 20, &cap);
  pe_stream *comp = pe_device_stream(d, PE_STREAM_COMPUTE);
  fill_job j = {comp, buf, (1 << 20) / 4, 2.0f};
  ck_assert_ptr_null(pe_stream_launch(comp, fill_fn, &j));
  ck_assert_ptr_null(pe_event_record(e, comp));
  ck_assert_ptr_null(pe_event_sync(e));
  ck_assert(pe_event_query(e));
  pe_event_put(e);
  /* The pool hands the same event back. */
  pe_event *e2;
  ck_assert_ptr_null(pe_event_get(d, &e2));
  ck_assert_ptr_eq(e, e2);
  pe_event_put(e2);
  pe_device_free(d, buf, cap);
  pe_device_close(d);
}
END_TEST

START_TEST(errors_are_kept_on_the_stream) {
  pe_device *d = open_cuda(0);
  pe_stream *comp = pe_device_stream(d, PE_STREAM_COMPUTE);
  int one = 1, two = 2;
  pe_event *before, *after;
  ck_assert_ptr_null(pe_event_get(d, &before));
  ck_assert_ptr_null(pe_event_get(d, &after));
  ck_assert_ptr_null(pe_event_record(before, comp));
  ck_assert_ptr_null(pe_stream_launch(comp, fail_fn, &one));
  ck_assert_ptr_null(pe_stream_launch(comp, fail_fn, &two)); /* later errors are dropped */
  ck_assert_ptr_null(pe_event_record(after, comp));
  ck_assert_ptr_null(pe_event_sync(before)); /* recorded before the failure */
  pe_status *st = pe_event_sync(after);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(strstr(st->msg, "planned failure 1"), "%s", st->msg);
  pe_status_free(st);
  st = pe_stream_sync(comp);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(strstr(st->msg, "planned failure 1"), "%s", st->msg);
  pe_status_free(st);
  ck_assert_ptr_null(pe_stream_sync(comp)); /* cleared */
  pe_event_put(before);
  pe_event_put(after);
  pe_device_close(d);
}
END_TEST

START_TEST(copies_round_trip_through_staging) {
  pe_device *d = open_cuda(0);
  enum { N = 100003 };
  static float src[N], back[N];
  for (int i = 0; i < N; i++) src[i] = (float)i * 0.5f;
  size_t cap;
  float *a = pe_device_alloc(d, sizeof src, &cap), *b;
  size_t capb;
  b = pe_device_alloc(d, sizeof src, &capb);
  pe_stream *h2d = pe_device_stream(d, PE_STREAM_H2D);
  pe_stream *d2h = pe_device_stream(d, PE_STREAM_D2H);
  ck_assert_ptr_null(pe_stream_copy(h2d, a, src, sizeof src, PE_COPY_H2D));
  ck_assert_ptr_null(pe_stream_copy(h2d, b, a, sizeof src, PE_COPY_D2D));
  /* The source may be reused as soon as the h2d copy was queued (staged). */
  memset(src, 0, sizeof src);
  ck_assert_ptr_null(pe_device_sync_dep(PE_SYNC_WAIT_EVENT, h2d, NULL, d2h));
  ck_assert_ptr_null(pe_stream_copy(d2h, back, b, sizeof back, PE_COPY_D2H));
  ck_assert_ptr_null(pe_stream_sync(d2h));
  for (int i = 0; i < N; i += 997) ck_assert_float_eq(back[i], (float)i * 0.5f);
  ck_assert_float_eq(back[N - 1], (float)(N - 1) * 0.5f);
  pe_device_free(d, a, cap);
  pe_device_free(d, b, capb);
  pe_device_close(d);
}
END_TEST

START_TEST(allocator_reuses_device_blocks) {
  pe_device *d = open_cuda(0);
  size_t c1, c2;
  void *p = pe_device_alloc(d, 3 << 20, &c1);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_ge(c1, 3 << 20);
  pe_device_free(d, p, c1);
  void *q = pe_device_alloc(d, (3 << 20) - 100, &c2);
  ck_assert_ptr_eq(p, q); /* same class: no cudaMalloc */
  ck_assert_uint_eq(c1, c2);
  pe_device_free(d, q, c2);
  pe_device_close(d);
}
END_TEST

START_TEST(kernel_context_is_bound_to_the_stream) {
  pe_device *d = open_cuda(0);
  pe_stream *comp = pe_device_stream(d, PE_STREAM_COMPUTE);
  pe_cuda_ctx *x = pe_stream_ctx(comp)->cuda;
  ck_assert_ptr_nonnull(x);
  ck_assert_ptr_eq(x->stream, pe_cuda_stream_handle(comp));
  ck_assert_ptr_nonnull(x->cublas);
  ck_assert_ptr_nonnull(x->cudnn);
  /* The four streams are distinct. */
  for (int a = 0; a < PE_STREAM_KINDS; a++)
    for (int b = a + 1; b < PE_STREAM_KINDS; b++)
      ck_assert_ptr_ne(pe_cuda_stream_handle(pe_device_stream(d, a)),
                       pe_cuda_stream_handle(pe_device_stream(d, b)));
  ck_assert_str_eq(comp->name, "cuda:0/compute");
  pe_device_close(d);
}
END_TEST

/* The executor's pool threads launch on one stream at once; the device runs
 * one fn at a time per stream (cuDNN handles are not for concurrent use,
 * and an op's kernels must not interleave with another's on the stream's
 * workspace). */
typedef struct overlap_job {
  pe_stream *s;
  atomic_int *inside, *overlaps;
} overlap_job;

static pe_status *overlap_fn(void *arg) {
  overlap_job *j = arg;
  if (atomic_fetch_add(j->inside, 1) != 0) atomic_fetch_add(j->overlaps, 1);
  struct timespec ts = {0, 20 * 1000};
  nanosleep(&ts, NULL);
  atomic_fetch_sub(j->inside, 1);
  return NULL;
}

static void *overlap_thread(void *arg) {
  overlap_job *j = arg;
  for (int i = 0; i < 200; i++)
    if (pe_stream_launch(j->s, overlap_fn, j)) atomic_fetch_add(j->overlaps, 1000);
  return NULL;
}

START_TEST(launches_on_one_stream_do_not_overlap) {
  pe_device *d = open_cuda(0);
  atomic_int inside = 0, overlaps = 0;
  overlap_job j = {pe_device_stream(d, PE_STREAM_COMPUTE), &inside, &overlaps};
  pthread_t th[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, overlap_thread, &j), 0);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  ck_assert_int_eq(atomic_load(&overlaps), 0);
  ck_assert_ptr_null(pe_stream_sync(j.s));
  pe_device_close(d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_device");
  TCase *t = tcase_create("gpu");
  tcase_add_test(t, sync_dep_wait_event);
  tcase_add_test(t, sync_dep_wait_producer);
  tcase_add_test(t, events_query_and_sync);
  tcase_add_test(t, errors_are_kept_on_the_stream);
  tcase_add_test(t, copies_round_trip_through_staging);
  tcase_add_test(t, allocator_reuses_device_blocks);
  tcase_add_test(t, kernel_context_is_bound_to_the_stream);
  tcase_add_test(t, launches_on_one_stream_do_not_overlap);
  suite_add_tcase(s, t);
  return s;
}

PE_CUDA_MAIN(suite, 1)

#endif
