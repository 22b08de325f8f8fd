/* NCCL over two or more GPUs: grouped all-reduce (sum, mean), a bucket of
 * gradients, per-rank parts from one thread per rank, broadcast, and the
 * error path of an aborted communicator. Skipped with fewer than 2 GPUs. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cuda/cuda_ctx.h"
#include "cuda/nccl_comm.h"
#include "cuda_test_main.h"
#include "engine/device.h"

enum { N = 1000003 };

typedef struct ranks {
  int n;
  pe_device *dev[PE_MAX_PLACES];
  float *buf[PE_MAX_PLACES];
  size_t cap[PE_MAX_PLACES];
  pe_nccl_comm *comm;
} ranks;

static float host[N];

static void ranks_open(ranks *r) {
  memset(r, 0, sizeof *r);
  r->n = pe_cuda_device_count(NULL);
  if (r->n > PE_MAX_PLACES) r->n = PE_MAX_PLACES;
  for (int i = 0; i < r->n; i++) {
    pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, i}, NULL, &r->dev[i]);
    ck_assert_msg(!st, "%s", pe_status_msg(st));
    r->buf[i] = pe_device_alloc(r->dev[i], N * sizeof(float), &r->cap[i]);
    ck_assert_ptr_nonnull(r->buf[i]);
  }
  pe_status *st = pe_nccl_comm_new(r->dev, r->n, &r->comm);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
  ck_assert_int_eq(pe_nccl_comm_size(r->comm), r->n);
}

static void ranks_close(ranks *r) {
  pe_nccl_comm_free(r->comm);
  for (int i = 0; i < r->n; i++) {
    pe_device_free(r->dev[i], r->buf[i], r->cap[i]);
    pe_device_close(r->dev[i]);
  }
}

/* Rank i's buffer: element j = (i + 1) * (j % 7). */
static void ranks_fill(ranks *r) {
  for (int i = 0; i < r->n; i++) {
    for (int j = 0; j < N; j++) host[j] = (float)((i + 1) * (j % 7));
    pe_stream *s = pe_device_stream(r->dev[i], PE_STREAM_COMM);
    ck_assert_ptr_null(pe_stream_copy(s, r->buf[i], host, N * sizeof(float), PE_COPY_H2D));
    ck_assert_ptr_null(pe_stream_sync(s));
  }
}

static void expect_all(ranks *r, float per_unit) {
  for (int i = 0; i < r->n; i++) {
    pe_stream *s = pe_device_stream(r->dev[i], PE_STREAM_D2H);
    /* The fetch waits for the comm stream only, not the whole device. */
    ck_assert_ptr_null(pe_device_sync_dep(PE_SYNC_WAIT_EVENT,
                                          pe_device_stream(r->dev[i], PE_STREAM_COMM), NULL, s));
    ck_assert_ptr_null(pe_stream_copy(s, host, r->buf[i], N * sizeof(float), PE_COPY_D2H));
    ck_assert_ptr_null(pe_stream_sync(s));
    /* Sums of small integers are exact; ncclAvg scales by 1/n, which is
     * exact only for n a power of two, hence the one-ulp-scale margin. */
    for (int j = 0; j < N; j += 4099) {
      float want = per_unit * (float)(j % 7);
      ck_assert_msg(fabsf(host[j] - want) <= 1e-6f * fabsf(want), "rank %d elem %d: %g, want %g", i,
                    j, host[j], want);
    }
  }
}

START_TEST(allreduce_sum_and_mean) {
  ranks r;
  ranks_open(&r);
  float total = (float)(r.n * (r.n + 1) / 2); /* sum of i + 1 */
  ranks_fill(&r);
  ck_assert_ptr_null(pe_nccl_allreduce(r.comm, r.buf, N, PE_REDUCE_SUM));
  ck_assert_ptr_null(pe_nccl_wait(r.comm, 60000, NULL));
  expect_all(&r, total);
  ranks_fill(&r);
  ck_assert_ptr_null(pe_nccl_allreduce(r.comm, r.buf, N, PE_REDUCE_MEAN));
  ck_assert_ptr_null(pe_nccl_wait(r.comm, 60000, NULL));
  expect_all(&r, total / (float)r.n);
  ranks_close(&r);
}
END_TEST

START_TEST(allreduce_bucket) {
  ranks r;
  ranks_open(&r);
  ranks_fill(&r);
  /* Two "gradients" per rank: the first 1000 elements and the rest. */
  float *bufs[2 * PE_MAX_PLACES];
  for (int i = 0; i < r.n; i++) {
    bufs[2 * i] = r.buf[i];
    bufs[2 * i + 1] = r.buf[i] + 1000;
  }
  size_t counts[2] = {1000, N - 1000};
  ck_assert_ptr_null(pe_nccl_allreduce_bucket(r.comm, bufs, counts, 2, PE_REDUCE_SUM));
  ck_assert_ptr_null(pe_nccl_wait(r.comm, 60000, NULL));
  expect_all(&r, (float)(r.n * (r.n + 1) / 2));
  ranks_close(&r);
}
END_TEST

typedef struct part_arg {
  ranks *r;
  int rank;
  pe_status *st;
} part_arg;

static void *part_thread(void *p) {
  part_arg *a = p;
  a->st = pe_nccl_allreduce_part(a->r->comm, a->rank, a->r->buf[a->rank], N, PE_REDUCE_SUM);
  return NULL;
}

START_TEST(allreduce_parts_from_rank_threads) {
  ranks r;
  ranks_open(&r);
  ranks_fill(&r);
  pthread_t th[PE_MAX_PLACES];
  part_arg args[PE_MAX_PLACES];
  for (int i = 0; i < r.n; i++) {
    args[i] = (part_arg){&r, i, NULL};
    pthread_create(&th[i], NULL, part_thread, &args[i]);
  }
  for (int i = 0; i < r.n; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(!args[i].st, "%s", pe_status_msg(args[i].st));
  }
  ck_assert_ptr_null(pe_nccl_wait(r.comm, 60000, NULL));
  expect_all(&r, (float)(r.n * (r.n + 1) / 2));
  ranks_close(&r);
}
END_TEST

START_TEST(broadcast_from_root) {
  ranks r;
  ranks_open(&r);
  ranks_fill(&r);
  void *bufs[PE_MAX_PLACES];
  for (int i = 0; i < r.n; i++) bufs[i] = r.buf[i];
  ck_assert_ptr_null(pe_nccl_broadcast(r.comm, bufs, N * sizeof(float), 1));
  ck_assert_ptr_null(pe_nccl_wait(r.comm, 60000, NULL));
  expect_all(&r, 2.0f); /* rank 1's values: 2 * (j % 7) */
  pe_status *st = pe_nccl_broadcast(r.comm, bufs, 4, r.n);
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(st->code, PE_EINVAL);
  pe_status_free(st);
  ranks_close(&r);
}
END_TEST

START_TEST(lone_part_times_out_into_an_error) {
  ranks r;
  ranks_open(&r);
  /* A full all-reduce first, so that NCCL's lazy connection setup (which
   * needs every rank) is done before the lone part below. */
  ck_assert_ptr_null(pe_nccl_allreduce(r.comm, r.buf, 1024, PE_REDUCE_SUM));
  ck_assert_ptr_null(pe_nccl_wait(r.comm, 60000, NULL));
  /* Only rank 0 joins: its kernel waits for peers forever. The wait must
   * turn that into a status (timeout, abort), not hang. */
  ck_assert_ptr_null(pe_nccl_allreduce_part(r.comm, 0, r.buf[0], 1024, PE_REDUCE_SUM));
  pe_status *st = pe_nccl_wait(r.comm, 2000, NULL);
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(st->code, PE_EBACKEND);
  printf("expected NCCL error: %s\n", st->msg);
  pe_status_free(st);
  st = pe_nccl_allreduce(r.comm, r.buf, 16, PE_REDUCE_SUM);
  ck_assert_ptr_nonnull(st); /* aborted: later calls fail */
  pe_status_free(st);
  /* The devices' streams may hold the aborted kernel's fault; close anyway. */
  for (int i = 0; i < r.n; i++)
    pe_status_free(pe_stream_sync(pe_device_stream(r.dev[i], PE_STREAM_COMM)));
  ranks_close(&r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_nccl");
  TCase *t = tcase_create("multi_gpu");
  tcase_add_test(t, allreduce_sum_and_mean);
  tcase_add_test(t, allreduce_bucket);
  tcase_add_test(t, allreduce_parts_from_rank_threads);
  tcase_add_test(t, broadcast_from_root);
  tcase_add_test(t, lone_part_times_out_into_an_error);
  suite_add_tcase(s, t);
  return s;
}

PE_CUDA_MAIN(suite, 2)

#endif
