/* Captured steps on a GPU (cuda/cuda_graph.h): a step captured over the
 * compute and copy streams replays with new feeds and gives the values the
 * uncaptured step gives; the device allocator refuses cudaMalloc during a
 * capture and the capture then fails with a reason, leaving the streams
 * usable; a fault inside a replayed step is reported as a status; a
 * captured random kernel draws, per replay, the numbers of the uncaptured
 * one at the generator's new offset. Skipped without a GPU. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include <check.h>
#include <string.h>

#include "cuda/cuda_ctx.h"
#include "cuda/cuda_graph.h"
#include "cuda/kernels.h"
#include "cuda_test_main.h"
#include "engine/device.h"

static pe_device *open_cuda(void) {
  pe_device *d = NULL;
  pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, 0}, NULL, &d);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
  return d;
}

#define OK(expr)                                   \
  do {                                             \
    pe_status *st_ = (expr);                       \
    ck_assert_msg(!st_, "%s", pe_status_msg(st_)); \
  } while (0)

enum { N = 4096 };

/* The "step": y = 2x + 1 on compute, then y copied to z on the d2h stream
 * after an event, so that the capture spans two streams. */
static void enqueue_step(pe_device *d, const float *x, float *y, float *z) {
  cudaStream_t c = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  cudaStream_t o = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_D2H));
  ck_assert_int_eq(pe_cu_affine(x, y, N, 2.0f, 1.0f, c), cudaSuccess);
  cudaEvent_t ev;
  ck_assert_int_eq(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  ck_assert_int_eq(cudaEventRecord(ev, c), cudaSuccess);
  ck_assert_int_eq(cudaStreamWaitEvent(o, ev, 0), cudaSuccess);
  ck_assert_int_eq(cudaMemcpyAsync(z, y, N * sizeof(float), cudaMemcpyDeviceToDevice, o),
                   cudaSuccess);
  cudaEventDestroy(ev);
}

START_TEST(replay_equals_the_uncaptured_step) {
  pe_device *d = open_cuda();
  size_t cap;
  float *x = pe_device_alloc(d, N * sizeof(float), &cap);
  float *y = pe_device_alloc(d, N * sizeof(float), &cap);
  float *z = pe_device_alloc(d, N * sizeof(float), &cap);
  ck_assert(x && y && z);
  OK(pe_cuda_graph_begin(d));
  ck_assert(pe_cuda_graph_capturing(0));
  enqueue_step(d, x, y, z);
  pe_cuda_graph *g;
  OK(pe_cuda_graph_end(d, &g));
  ck_assert(!pe_cuda_graph_capturing(0));
  static float in[N], out[N];
  for (int step = 0; step < 20; step++) {
    for (int i = 0; i < N; i++) in[i] = (float)(i * (step + 1)) * 0.25f;
    pe_cuda_graph_io feed = {in, x, sizeof in}, fetch = {out, z, sizeof out};
    OK(pe_cuda_graph_replay(g, &feed, 1, &fetch, 1, 0, NULL, NULL));
    for (int i = 0; i < N; i++) ck_assert_float_eq(out[i], 2.0f * in[i] + 1.0f);
  }
  pe_cuda_graph_free(g);
  pe_device_free(d, x, cap);
  pe_device_free(d, y, cap);
  pe_device_free(d, z, cap);
  pe_device_close(d);
}
END_TEST

START_TEST(allocation_during_capture_fails_the_capture) {
  pe_device *d = open_cuda();
  OK(pe_cuda_graph_begin(d));
  size_t cap;
  /* A size no warm-up cached: the cache would have to cudaMalloc. */
  void *p = pe_device_alloc(d, (size_t)3 << 29, &cap);
  ck_assert_ptr_null(p);
  pe_cuda_graph *g = NULL;
  /* Nothing was captured either: end may succeed with an empty graph or
   * fail; either way the streams leave capture mode. */
  pe_status *st = pe_cuda_graph_end(d, &g);
  pe_status_free(st);
  pe_cuda_graph_free(g);
  ck_assert(!pe_cuda_graph_capturing(0));
  /* The device works normally afterwards. */
  float *x = pe_device_alloc(d, N * sizeof(float), &cap);
  ck_assert_ptr_nonnull(x);
  OK(pe_stream_sync(pe_device_stream(d, PE_STREAM_COMPUTE)));
  pe_device_free(d, x, cap);
  pe_device_close(d);
}
END_TEST

START_TEST(unjoined_sync_invalidates_the_capture_with_a_reason) {
  pe_device *d = open_cuda();
  OK(pe_cuda_graph_begin(d));
  cudaStream_t c = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  /* A host sync inside the step (what a host-sync op does): illegal while
   * capturing, it invalidates the capture. */
  ck_assert_int_ne(cudaStreamSynchronize(c), cudaSuccess);
  pe_cuda_graph *g = NULL;
  pe_status *st = pe_cuda_graph_end(d, &g);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_null(g);
  ck_assert_ptr_nonnull(strstr(pe_status_msg(st), "cuda:0"));
  pe_status_free(st);
  cudaGetLastError();
  OK(pe_stream_sync(pe_device_stream(d, PE_STREAM_COMPUTE)));
  pe_device_close(d);
}
END_TEST

START_TEST(fault_in_a_replay_is_reported) {
  pe_device *d = open_cuda();
  size_t cap;
  float *y = pe_device_alloc(d, N * sizeof(float), &cap);
  OK(pe_cuda_graph_begin(d));
  cudaStream_t c = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  /* Reads from an address that is not device memory: faults at replay. */
  ck_assert_int_eq(pe_cu_affine((const float *)(uintptr_t)0x10, y, N, 1.0f, 0.0f, c), cudaSuccess);
  pe_cuda_graph *g;
  OK(pe_cuda_graph_end(d, &g));
  static float out[N];
  pe_cuda_graph_io fetch = {out, y, sizeof out};
  pe_status *st = pe_cuda_graph_replay(g, NULL, 0, &fetch, 1, 0, NULL, NULL);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(pe_status_msg(st), "replayed step"));
  pe_status_free(st);
  pe_cuda_graph_free(g);
  /* The context is lost after a fault; the device is not reused. */
}
END_TEST

/* A captured dropout reads the generator delta: replay k with delta
 * k * n draws the mask the uncaptured kernel draws at base + k * n, and
 * outside a capture the kernel reads no delta. */
START_TEST(replayed_dropout_advances_with_the_device_delta) {
  pe_device *d = open_cuda();
  cudaStream_t c = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  ck_assert_ptr_null(pe_cuda_graph_rng_delta(0, c));
  size_t cap;
  float *x = pe_device_alloc(d, N * sizeof(float), &cap);
  float *y = pe_device_alloc(d, N * sizeof(float), &cap);
  float *ref = pe_device_alloc(d, N * sizeof(float), &cap);
  ck_assert(x && y && ref);
  static float ones[N], got[N], want[N], first[N];
  for (int i = 0; i < N; i++) ones[i] = 1.0f;
  ck_assert_int_eq(cudaMemcpy(x, ones, sizeof ones, cudaMemcpyHostToDevice), cudaSuccess);
  const uint64_t seed = 11, base = 1000;
  OK(pe_cuda_graph_begin(d));
  const uint64_t *delta = pe_cuda_graph_rng_delta(0, c);
  ck_assert_ptr_nonnull(delta);
  ck_assert_int_eq(pe_cu_dropout(x, y, NULL, N, seed, base, delta, 0.5, 2.0f, c), cudaSuccess);
  pe_cuda_graph *g;
  OK(pe_cuda_graph_end(d, &g));
  ck_assert_ptr_null(pe_cuda_graph_rng_delta(0, c));
  for (uint64_t k = 0; k < 4; k++) {
    pe_cuda_graph_io fetch = {got, y, sizeof got};
    OK(pe_cuda_graph_replay(g, NULL, 0, &fetch, 1, k * N, NULL, NULL));
    ck_assert_int_eq(pe_cu_dropout(x, ref, NULL, N, seed, base + k * N, NULL, 0.5, 2.0f, c),
                     cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(want, ref, sizeof want, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(memcmp(got, want, sizeof got), 0);
    if (k == 0) memcpy(first, got, sizeof first);
    if (k == 1) ck_assert_int_ne(memcmp(got, first, sizeof got), 0); /* the delta moved the mask */
  }
  pe_cuda_graph_free(g);
  pe_device_free(d, x, cap);
  pe_device_free(d, y, cap);
  pe_device_free(d, ref, cap);
  pe_device_close(d);
}
END_TEST

/* A second capture on the same GPU while one runs is refused, named. */
START_TEST(second_capture_on_a_gpu_is_refused) {
  pe_device *d = open_cuda();
  OK(pe_cuda_graph_begin(d));
  pe_status *st = pe_cuda_graph_begin(d);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(pe_status_msg(st), "another step captures on cuda:0"));
  pe_status_free(st);
  pe_cuda_graph *g = NULL;
  st = pe_cuda_graph_end(d, &g); /* an empty capture: instantiates or fails, both fine */
  pe_status_free(st);
  pe_cuda_graph_free(g);
  ck_assert(!pe_cuda_graph_capturing(0));
  pe_device_close(d);
}
END_TEST

static Suite *cuda_graph_suite(void) {
  Suite *s = suite_create("cuda_graph");
  TCase *tc = tcase_create("graph");
  tcase_add_test(tc, replay_equals_the_uncaptured_step);
  tcase_add_test(tc, allocation_during_capture_fails_the_capture);
  tcase_add_test(tc, unjoined_sync_invalidates_the_capture_with_a_reason);
  tcase_add_test(tc, replayed_dropout_advances_with_the_device_delta);
  tcase_add_test(tc, second_capture_on_a_gpu_is_refused);
  /* Last: a fault leaves the CUDA context unusable for the rest. */
  tcase_add_test(tc, fault_in_a_replay_is_reported);
  suite_add_tcase(s, tc);
  return s;
}

PE_CUDA_MAIN(cuda_graph_suite, 1)

#endif
