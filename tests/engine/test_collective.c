/* Collectives: all-reduce (sum, mean) and broadcast against a serial
 * reference, on sim comm streams and on cpu calling threads; concurrent
 * operations of one group; argument mismatches fail every part. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "engine/collective.h"
#include "engine/device.h"

static const size_t sizes[] = {0, 1, 7, 17, 1000, 4099, 100003};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

static float val(int rank, size_t i, int salt) {
  /* Varied magnitudes so that summation order would show. */
  unsigned h = (unsigned)(rank * 2654435761u) ^ (unsigned)(i * 40503u) ^ (unsigned)salt * 977u;
  h ^= h >> 13;
  return (float)((int)(h % 2001) - 1000) / ((h & 7) + 1.0f);
}

static float **make_bufs(int n, size_t count, int salt) {
  float **b = malloc((size_t)n * sizeof(float *));
  for (int r = 0; r < n; r++) {
    b[r] = malloc((count ? count : 1) * sizeof(float));
    for (size_t i = 0; i < count; i++) b[r][i] = val(r, i, salt);
  }
  return b;
}

static void free_bufs(float **b, int n) {
  for (int r = 0; r < n; r++) free(b[r]);
  free(b);
}

/* The serial reference: rank order, then the division for mean. */
static float *reference(float **b, int n, size_t count, pe_reduce_op op) {
  float *ref = malloc((count ? count : 1) * sizeof(float));
  for (size_t i = 0; i < count; i++) {
    float acc = b[0][i];
    for (int r = 1; r < n; r++) acc += b[r][i];
    if (op == PE_REDUCE_MEAN) acc /= (float)n;
    ref[i] = acc;
  }
  return ref;
}

/* Exact equality: every rank sums in the same order as the reference.
 * (One assertion per call: Check reports every assertion to its parent.) */
static void check_equal(float **b, int n, const float *ref, size_t count, const char *what) {
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++)
      if (b[r][i] != ref[i])
        ck_abort_msg("%s: n=%d count=%zu rank %d [%zu] = %g, want %g", what, n, count, r, i,
                     b[r][i], ref[i]);
}

/* --- sim: parts launched on each place's comm stream ---------------------------------------- */

START_TEST(sim_allreduce_matches_serial_reference) {
  pe_device *dev[8];
  for (int i = 0; i < 8; i++) {
    pe_device_opts o = {.threads = 1};
    ck_assert_ptr_null(pe_device_open((pe_place){PE_PLACE_SIM, i}, &o, &dev[i]));
  }
  uint64_t id = 1;
  for (int n = 1; n <= 8; n++) {
    pe_comm *c;
    ck_assert_ptr_null(pe_comm_new(n, &c));
    for (size_t si = 0; si < N_SIZES; si++) {
      for (int op = 0; op < 2; op++) {
        size_t count = sizes[si];
        float **b = make_bufs(n, count, (int)si);
        float *ref = reference(b, n, count, (pe_reduce_op)op);
        pe_coll_part parts[8];
        for (int r = 0; r < n; r++) {
          parts[r] = (pe_coll_part){.comm = c,
                                    .op_id = id,
                                    .rank = r,
                                    .kind = PE_COLL_ALLREDUCE,
                                    .red = (pe_reduce_op)op,
                                    .buf = b[r],
                                    .count = count};
          ck_assert_ptr_null(pe_stream_launch(pe_device_stream(dev[r], PE_STREAM_COMM),
                                              pe_coll_part_run, &parts[r]));
        }
        for (int r = 0; r < n; r++) {
          pe_status *st = pe_stream_sync(pe_device_stream(dev[r], PE_STREAM_COMM));
          ck_assert_msg(!st, "%s", pe_status_msg(st));
        }
        check_equal(b, n, ref, count, op ? "mean" : "sum");
        free(ref);
        free_bufs(b, n);
        id++;
      }
    }
    pe_comm_free(c);
  }
  for (int i = 0; i < 8; i++) pe_device_close(dev[i]);
}
END_TEST

START_TEST(sim_concurrent_allreduces_on_different_buffers) {
  /* K all-reduces in flight at once: queued in the same order on every
   * place, some on the comm stream and some on the compute stream, so two
   * run at the same time on each place. */
  enum { N = 4, K = 6 };
  const size_t count = 5003;
  pe_device *dev[N];
  for (int i = 0; i < N; i++)
    ck_assert_ptr_null(pe_device_open((pe_place){PE_PLACE_SIM, i}, NULL, &dev[i]));
  pe_comm *c;
  ck_assert_ptr_null(pe_comm_new(N, &c));
  float **b[K], *ref[K];
  pe_coll_part parts[K][N];
  for (int k = 0; k < K; k++) {
    b[k] = make_bufs(N, count, 100 + k);
    ref[k] = reference(b[k], N, count, k % 2 ? PE_REDUCE_MEAN : PE_REDUCE_SUM);
  }
  for (int r = 0; r < N; r++)
    for (int k = 0; k < K; k++) {
      parts[k][r] = (pe_coll_part){.comm = c,
                                   .op_id = 1000 + k,
                                   .rank = r,
                                   .kind = PE_COLL_ALLREDUCE,
                                   .red = k % 2 ? PE_REDUCE_MEAN : PE_REDUCE_SUM,
                                   .buf = b[k][r],
                                   .count = count};
      pe_stream *s = pe_device_stream(dev[r], k < K / 2 ? PE_STREAM_COMM : PE_STREAM_COMPUTE);
      ck_assert_ptr_null(pe_stream_launch(s, pe_coll_part_run, &parts[k][r]));
    }
  for (int r = 0; r < N; r++) {
    ck_assert_ptr_null(pe_stream_sync(pe_device_stream(dev[r], PE_STREAM_COMM)));
    ck_assert_ptr_null(pe_stream_sync(pe_device_stream(dev[r], PE_STREAM_COMPUTE)));
  }
  for (int k = 0; k < K; k++) {
    check_equal(b[k], N, ref[k], count, "concurrent");
    free(ref[k]);
    free_bufs(b[k], N);
  }
  pe_comm_free(c);
  for (int i = 0; i < N; i++) pe_device_close(dev[i]);
}
END_TEST

/* --- cpu: every part on its own calling thread ------------------------------------------------ */

typedef struct thread_part {
  pe_coll_part part;
  pe_status *st;
  int repeat; /* run the same op id this many times in a row */
} thread_part;

static void *part_thread(void *arg) {
  thread_part *t = arg;
  for (int i = 0; i < t->repeat && !t->st; i++) t->st = pe_coll_part_run(&t->part);
  return NULL;
}

static void run_threads(thread_part *t, int n) {
  pthread_t th[64];
  /* Start them in reverse to vary arrival order. */
  for (int i = n - 1; i >= 0; i--)
    ck_assert_int_eq(pthread_create(&th[i], NULL, part_thread, &t[i]), 0);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

START_TEST(cpu_allreduce_and_broadcast_on_calling_threads) {
  uint64_t id = 7;
  for (int n = 1; n <= 8; n++) {
    pe_comm *c;
    ck_assert_ptr_null(pe_comm_new(n, &c));
    ck_assert_int_eq(pe_comm_size(c), n);
    for (size_t si = 0; si < N_SIZES; si++) {
      size_t count = sizes[si];
      for (int kind = 0; kind < 3; kind++) { /* sum, mean, broadcast */
        float **b = make_bufs(n, count, (int)si * 3 + kind);
        int root = (int)(si % (size_t)n);
        float *ref;
        if (kind < 2) {
          ref = reference(b, n, count, (pe_reduce_op)kind);
        } else {
          ref = malloc((count ? count : 1) * sizeof(float));
          memcpy(ref, b[root], count * sizeof(float));
        }
        thread_part t[8];
        for (int r = 0; r < n; r++)
          t[r] = (thread_part){.part = {.comm = c,
                                        .op_id = id,
                                        .rank = r,
                                        .kind = kind < 2 ? PE_COLL_ALLREDUCE : PE_COLL_BROADCAST,
                                        .red = (pe_reduce_op)(kind % 2),
                                        .root = root,
                                        .buf = b[r],
                                        .count = count},
                               .repeat = 1};
        run_threads(t, n);
        for (int r = 0; r < n; r++) ck_assert_msg(!t[r].st, "%s", pe_status_msg(t[r].st));
        check_equal(b, n, ref, count, kind == 2 ? "broadcast" : kind ? "mean" : "sum");
        free(ref);
        free_bufs(b, n);
        id++;
      }
    }
    pe_comm_free(c);
  }
}
END_TEST

START_TEST(cpu_concurrent_allreduces_keyed_by_op_id) {
  /* K operations x N ranks, every part on its own thread, all started at
   * once: rendezvous must keep the operations apart. Each operation is then
   * repeated with the same id (id reuse after completion). */
  enum { N = 5, K = 8, REPEAT = 20 };
  const size_t count = 1031;
  pe_comm *c;
  ck_assert_ptr_null(pe_comm_new(N, &c));
  float **b[K];
  thread_part t[K * N];
  for (int k = 0; k < K; k++) {
    b[k] = make_bufs(N, count, 50 + k);
    for (int r = 0; r < N; r++)
      t[k * N + r] = (thread_part){.part = {.comm = c,
                                            .op_id = (uint64_t)k << 32 | 5u,
                                            .rank = r,
                                            .kind = PE_COLL_ALLREDUCE,
                                            .red = PE_REDUCE_SUM,
                                            .buf = b[k][r],
                                            .count = count},
                                   .repeat = REPEAT};
  }
  /* Expected after REPEAT sums: the first sum times N^(REPEAT-1). */
  float *ref[K];
  for (int k = 0; k < K; k++) {
    ref[k] = reference(b[k], N, count, PE_REDUCE_SUM);
    for (int rep = 1; rep < REPEAT; rep++) {
      float *cur[N];
      for (int r = 0; r < N; r++) cur[r] = ref[k];
      float *next = reference(cur, N, count, PE_REDUCE_SUM);
      free(ref[k]);
      ref[k] = next;
    }
  }
  run_threads(t, K * N);
  for (int i = 0; i < K * N; i++) ck_assert_msg(!t[i].st, "%s", pe_status_msg(t[i].st));
  for (int k = 0; k < K; k++) {
    check_equal(b[k], N, ref[k], count, "concurrent cpu");
    free(ref[k]);
    free_bufs(b[k], N);
  }
  pe_comm_free(c);
}
END_TEST

START_TEST(fused_buffer_equals_separate_reductions) {
  /* Fusing two gradients into one buffer gives the same values. */
  enum { N = 3 };
  const size_t a = 333, bsz = 4097;
  pe_comm *c;
  ck_assert_ptr_null(pe_comm_new(N, &c));
  float **fa = make_bufs(N, a, 1), **fb = make_bufs(N, bsz, 2);
  float **fused = make_bufs(N, a + bsz, 0);
  for (int r = 0; r < N; r++) {
    memcpy(fused[r], fa[r], a * sizeof(float));
    memcpy(fused[r] + a, fb[r], bsz * sizeof(float));
  }
  thread_part t[N];
  for (int r = 0; r < N; r++)
    t[r] = (thread_part){.part = {.comm = c,
                                  .op_id = 9,
                                  .rank = r,
                                  .kind = PE_COLL_ALLREDUCE,
                                  .red = PE_REDUCE_MEAN,
                                  .buf = fused[r],
                                  .count = a + bsz},
                         .repeat = 1};
  run_threads(t, N);
  float *ra = reference(fa, N, a, PE_REDUCE_MEAN), *rb = reference(fb, N, bsz, PE_REDUCE_MEAN);
  for (int r = 0; r < N; r++) {
    ck_assert_ptr_null(t[r].st);
    ck_assert_int_eq(memcmp(fused[r], ra, a * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(fused[r] + a, rb, bsz * sizeof(float)), 0);
  }
  free(ra);
  free(rb);
  free_bufs(fa, N);
  free_bufs(fb, N);
  free_bufs(fused, N);
  pe_comm_free(c);
}
END_TEST

START_TEST(mismatched_parts_all_fail) {
  enum { N = 4 };
  pe_comm *c;
  ck_assert_ptr_null(pe_comm_new(N, &c));
  float **b = make_bufs(N, 64, 3);
  thread_part t[N];
  for (int r = 0; r < N; r++)
    t[r] = (thread_part){.part = {.comm = c,
                                  .op_id = 3,
                                  .rank = r,
                                  .kind = PE_COLL_ALLREDUCE,
                                  .buf = b[r],
                                  .count = r == 2 ? 32 : 64},
                         .repeat = 1};
  run_threads(t, N);
  for (int r = 0; r < N; r++) {
    ck_assert_int_eq(pe_status_code(t[r].st), PE_EINVAL);
    ck_assert_ptr_nonnull(strstr(pe_status_msg(t[r].st), "disagree"));
    pe_status_free(t[r].st);
  }
  /* Broadcast with a root out of range: every part fails the same way. */
  for (int r = 0; r < N; r++)
    t[r] = (thread_part){.part = {.comm = c,
                                  .op_id = 4,
                                  .rank = r,
                                  .kind = PE_COLL_BROADCAST,
                                  .root = 9,
                                  .buf = b[r],
                                  .count = 64},
                         .repeat = 1};
  run_threads(t, N);
  for (int r = 0; r < N; r++) {
    ck_assert_int_eq(pe_status_code(t[r].st), PE_EINVAL);
    pe_status_free(t[r].st);
  }
  /* The group still works afterwards. */
  for (int r = 0; r < N; r++)
    t[r] = (thread_part){
        .part =
            {.comm = c, .op_id = 3, .rank = r, .kind = PE_COLL_ALLREDUCE, .buf = b[r], .count = 64},
        .repeat = 1};
  run_threads(t, N);
  for (int r = 0; r < N; r++) ck_assert_ptr_null(t[r].st);
  pe_status *st = pe_allreduce_part(c, 1, 7, b[0], 64, PE_REDUCE_SUM);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  pe_coll_part bad = {0};
  st = pe_comm_new(0, &bad.comm);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  free_bufs(b, N);
  pe_comm_free(c);
}
END_TEST

static Suite *collective_suite(void) {
  Suite *s = suite_create("collective");
  /* One case per test, so CK_RUN_CASE=<name> runs one. */
#define ADD(fn)                    \
  do {                             \
    TCase *tc = tcase_create(#fn); \
    tcase_add_test(tc, fn);        \
    suite_add_tcase(s, tc);        \
  } while (0)
  ADD(sim_allreduce_matches_serial_reference);
  ADD(sim_concurrent_allreduces_on_different_buffers);
  ADD(cpu_allreduce_and_broadcast_on_calling_threads);
  ADD(cpu_concurrent_allreduces_keyed_by_op_id);
  ADD(fused_buffer_equals_separate_reductions);
  ADD(mismatched_parts_all_fail);
#undef ADD
  return s;
}

PE_CHECK_MAIN(collective_suite)
