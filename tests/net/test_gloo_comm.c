/* The Gloo communicator (daemon/net/gloo_comm.h) across processes: each
 * test forks one process per rank on 127.0.0.1; the ranks write what they
 * saw into shared memory and the test process checks it. alarm() guards
 * every process, so a hang fails the test instead of stalling the suite. */
#define _GNU_SOURCE
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "free_port.h"
#include "net/gloo_comm.h"
#include "test_assert.h"

#define MAX_RANKS 4
#define SHARED_MAX 256 /* bytes of a test's shared value at most */
#define GUARD_S 120    /* no process of a test lives longer than this */

typedef struct rank_result {
  int done;                         /* the rank reached its end (not killed, not hung) */
  int code;                         /* pe_code of the first failure; PE_OK when none */
  char msg[1024];                   /* its message */
  long wrong;                       /* elements that differ from the exact answer */
  uint64_t hash;                    /* FNV-1a of the result's bytes: the same bits on every rank */
  double fail_after;                /* seconds the failing call took */
  int rounds;                       /* collectives that succeeded */
  unsigned char shared[SHARED_MAX]; /* the shared value as the rank got it */
} rank_result;

typedef struct scenario {
  int world;
  char rendezvous[64];
  const char *token[MAX_RANKS]; /* NULL: "secret" */
  int world_of[MAX_RANKS];      /* 0: world */
  int timeout_ms;
  int die_rank; /* -1: nobody; this rank SIGKILLs itself at round die_round */
  int die_round;
  int send_only;                /* body_loop broadcasts from rank 0 instead of all-reducing */
  size_t shared_len[MAX_RANKS]; /* > 0: the rank passes a shared value of this length */
  void (*body)(const struct scenario *, int rank, pe_gloo_comm *, rank_result *);
  rank_result *all; /* every rank's result (shared memory) */
} scenario;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t fnv1a(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static void record(rank_result *r, pe_status *st, double t0) {
  if (!st) return;
  snprintf(r->msg, sizeof r->msg, "%s", pe_status_msg(st));
  r->fail_after = now_s() - t0;
  __atomic_store_n(&r->code, (int)pe_status_code(st), __ATOMIC_SEQ_CST); /* last: others poll it */
  pe_status_free(st);
}

/* The options every test's ranks share: job 'job-a', token "secret", pairs on
 * 127.0.0.1. */
static pe_gloo_opts job_opts(const char *rendezvous, int rank, int world, int timeout_ms) {
  return (pe_gloo_opts){.job = "job-a",
                        .token = "secret",
                        .rendezvous = rendezvous,
                        .host = "127.0.0.1",
                        .rank = rank,
                        .world_size = world,
                        .timeout_ms = timeout_ms};
}

static void run_rank(const scenario *s, int rank, rank_result *r) {
  alarm(GUARD_S);
  pe_gloo_opts o = job_opts(s->rendezvous, rank, s->world_of[rank] ? s->world_of[rank] : s->world,
                            s->timeout_ms);
  if (s->token[rank]) o.token = s->token[rank];
  unsigned char value[SHARED_MAX];
  for (size_t i = 0; i < SHARED_MAX; i++) value[i] = (unsigned char)(i * 13 + 5);
  pe_gloo_shared sh = {"nccl-id", value, r->shared, s->shared_len[rank]};
  if (sh.len) o.shared = &sh;
  pe_gloo_comm *c = NULL;
  double t0 = now_s();
  pe_status *st = pe_gloo_comm_new(&o, &c);
  if (st) {
    record(r, st, t0);
  } else {
    s->body(s, rank, c, r);
    pe_gloo_comm_free(c);
  }
  r->done = 1;
}

/* Runs one process per rank and waits for them all; returns the results
 * (shared memory, the caller unmaps it). */
static rank_result *run(scenario *s) {
  snprintf(s->rendezvous, sizeof s->rendezvous, "127.0.0.1:%d", free_port());
  rank_result *res = mmap(NULL, sizeof(rank_result) * MAX_RANKS, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(res, MAP_FAILED);
  memset(res, 0, sizeof(rank_result) * MAX_RANKS);
  s->all = res;
  alarm(GUARD_S + 30);
  pid_t pid[MAX_RANKS];
  for (int r = 0; r < s->world; r++) {
    pid[r] = fork();
    ck_assert_int_ge(pid[r], 0);
    if (pid[r] == 0) {
      run_rank(s, r, &res[r]);
      _exit(0);
    }
  }
  for (int r = 0; r < s->world; r++) {
    int wst;
    ck_assert_int_eq(waitpid(pid[r], &wst, 0), pid[r]);
    if (r != s->die_rank)
      ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "rank %d ended with status 0x%x", r,
                    wst);
  }
  alarm(0);
  return res;
}

static void done_with(rank_result *res) {
  munmap(res, sizeof(rank_result) * MAX_RANKS);
}

/* ---- bodies ---- */

/* Rank r holds r * 1000 + (i % 1000): integers, so the float sum is exact. */
#define AR_N 100003 /* not a multiple of the ranks: uneven ring chunks */

static float ar_value(int rank, size_t i) {
  return (float)(rank * 1000 + (int)(i % 1000));
}

static float ar_sum(int world, size_t i) {
  return (float)(1000 * world * (world - 1) / 2 + world * (int)(i % 1000));
}

static void body_allreduce(const scenario *s, int rank, pe_gloo_comm *c, rank_result *r) {
  float *a = malloc(AR_N * sizeof *a), *b = malloc(AR_N * sizeof *b);
  for (size_t i = 0; i < AR_N; i++) a[i] = ar_value(rank, i), b[i] = 2 * ar_value(rank, i);
  enum { B_N = 7 }; /* b's head, packed with a: unequal lengths */
  double t0 = now_s();
  pe_status *st = pe_gloo_allreduce_f32(c, a, AR_N);
  if (!st) {
    r->rounds++;
    /* a once more (it holds the sum), nothing, and b's head, in one call */
    float *bufs[3] = {a, NULL, b};
    size_t ns[3] = {AR_N, 0, B_N};
    st = pe_gloo_allreduce_f32_many(c, bufs, ns, 3);
  }
  record(r, st, t0);
  if (!st) r->rounds++;
  for (size_t i = 0; i < AR_N; i++) {
    float want = ar_sum(s->world, i);
    if (a[i] != (float)s->world * want) r->wrong++;
    if (b[i] != (i < B_N ? 2 * want : 2 * ar_value(rank, i))) r->wrong++; /* the tail stays */
  }
  r->hash = fnv1a(a, AR_N * sizeof *a) ^ fnv1a(b, B_N * sizeof *b);
  free(a);
  free(b);
}

#define BC_BYTES 70001

static void body_broadcast(const scenario *s, int rank, pe_gloo_comm *c, rank_result *r) {
  unsigned char *buf = malloc(BC_BYTES);
  for (size_t i = 0; i < BC_BYTES; i++) buf[i] = rank == 1 ? (unsigned char)(i * 7 + 3) : 0;
  double t0 = now_s();
  pe_status *st = pe_gloo_broadcast(c, buf, BC_BYTES, 1);
  record(r, st, t0);
  if (!st) r->rounds++;
  for (size_t i = 0; i < BC_BYTES; i++)
    if (buf[i] != (unsigned char)(i * 7 + 3)) r->wrong++;
  r->hash = fnv1a(buf, BC_BYTES);
  free(buf);
}

/* All-reduces until one fails; die_rank kills itself (SIGKILL, as kill -9)
 * at die_round, in the middle of the loop. */
static void body_loop(const scenario *s, int rank, pe_gloo_comm *c, rank_result *r) {
  enum { N = 4096, MAX_ROUNDS = 100000 };
  float *a = malloc(N * sizeof *a);
  for (int round = 0; round < MAX_ROUNDS; round++) {
    if (rank == s->die_rank && round == s->die_round) raise(SIGKILL);
    for (size_t i = 0; i < N; i++) a[i] = ar_value(rank, i);
    double t0 = now_s();
    pe_status *st =
        s->send_only ? pe_gloo_broadcast(c, a, N * sizeof *a, 0) : pe_gloo_allreduce_f32(c, a, N);
    if (st) {
      record(r, st, t0);
      break;
    }
    r->rounds++;
  }
  /* Every survivor holds its broken communicator until all have failed:
   * the connections of a rank that gave up stay open until it frees its
   * communicator, so the others see rank die_rank gone and no other. */
  for (int p = 0; p < s->world; p++)
    while (p != s->die_rank && !__atomic_load_n(&s->all[p].code, __ATOMIC_SEQ_CST)) usleep(1000);
  /* A broken communicator answers with the first failure. */
  if (r->code != PE_OK) {
    pe_status *again = pe_gloo_allreduce_f32(c, a, N);
    if (!again || !strstr(pe_status_msg(again), "failed earlier")) r->wrong++;
    pe_status_free(again);
  }
  free(a);
}

static void body_none(const scenario *s, int rank, pe_gloo_comm *c, rank_result *r) {}

/* ---- tests ---- */

static void check_allreduce(int world) {
  scenario s = {.world = world, .die_rank = -1, .body = body_allreduce};
  rank_result *res = run(&s);
  for (int r = 0; r < world; r++) {
    ck_assert_msg(res[r].done, "rank %d did not finish", r);
    ck_assert_msg(res[r].code == PE_OK, "rank %d: %s", r, res[r].msg);
    ck_assert_int_eq(res[r].rounds, 2);
    ck_assert_msg(res[r].wrong == 0, "rank %d: %ld elements differ from the exact sum", r,
                  res[r].wrong);
    ck_assert_msg(res[r].hash == res[0].hash, "rank %d's sum differs in bits from rank 0's", r);
  }
  done_with(res);
}

START_TEST(allreduce_one_rank_is_identity) {
  check_allreduce(1);
}
END_TEST

START_TEST(allreduce_two_ranks_exact) {
  check_allreduce(2);
}
END_TEST

START_TEST(allreduce_three_ranks_exact) {
  check_allreduce(3);
}
END_TEST

START_TEST(broadcast_from_rank_1) {
  scenario s = {.world = 3, .die_rank = -1, .body = body_broadcast};
  rank_result *res = run(&s);
  for (int r = 0; r < 3; r++) {
    ck_assert_msg(res[r].done && res[r].code == PE_OK, "rank %d: %s", r, res[r].msg);
    ck_assert_int_eq(res[r].rounds, 1);
    ck_assert_msg(res[r].wrong == 0, "rank %d: %ld bytes differ from rank 1's", r, res[r].wrong);
  }
  done_with(res);
}
END_TEST

/* Both ranks fail to join with PE_EINVAL and a message that holds each of
 * the NULL-terminated needles. */
static void expect_refused(scenario *s, const char *const *needles) {
  rank_result *res = run(s);
  for (int r = 0; r < s->world; r++) {
    ck_assert_msg(res[r].done, "rank %d did not finish", r);
    ck_assert_msg(res[r].code == PE_EINVAL, "rank %d: %s (%s)", r, res[r].msg,
                  pe_code_name(res[r].code));
    for (const char *const *n = needles; *n; n++)
      ck_assert_msg(strstr(res[r].msg, *n), "rank %d: '%s' not in: %s", r, *n, res[r].msg);
    ck_assert_msg(!strstr(res[r].msg, "secret"), "rank %d names the token: %s", r, res[r].msg);
  }
  ck_assert_msg(strstr(res[1].msg, "refused this rank"), "%s", res[1].msg);
  done_with(res);
}

START_TEST(token_mismatch_refused) {
  scenario s = {.world = 2, .die_rank = -1, .body = body_none, .token = {NULL, "other-secret"}};
  const char *needles[] = {"job 'job-a' rank ", "rank 1 (from 127.0.0.1:",
                           "presented a token that differs from rank 0's", NULL};
  expect_refused(&s, needles);
}
END_TEST

/* The value every rank gets is rank 0's, byte for byte. */
START_TEST(shared_value_reaches_every_rank) {
  scenario s = {.world = 3, .die_rank = -1, .body = body_none, .shared_len = {128, 128, 128}};
  rank_result *res = run(&s);
  for (int r = 0; r < 3; r++) {
    ck_assert_msg(res[r].done && res[r].code == PE_OK, "rank %d: %s", r, res[r].msg);
    for (int i = 0; i < 128; i++)
      ck_assert_msg(res[r].shared[i] == (unsigned char)(i * 13 + 5), "rank %d byte %d is %u", r, i,
                    res[r].shared[i]);
    ck_assert_int_eq(res[r].shared[128], 0); /* nothing past the length */
  }
  done_with(res);
}
END_TEST

/* A rank that expects another length refuses rank 0's value, naming both
 * lengths; rank 0 fails too (the refusing rank leaves the mesh). */
START_TEST(shared_value_of_other_length_refused) {
  scenario s = {.world = 2, .die_rank = -1, .body = body_none, .shared_len = {128, 136}};
  rank_result *res = run(&s);
  ck_assert_msg(res[1].done && res[1].code == PE_EINVAL, "rank 1: %s", res[1].msg);
  ck_assert_msg(strstr(res[1].msg, "rank 0's shared 'nccl-id' is 128 bytes, rank 1 expects 136"),
                "%s", res[1].msg);
  ck_assert_msg(res[0].done && res[0].code != PE_OK, "rank 0 formed without rank 1");
  for (int i = 0; i < SHARED_MAX; i++) ck_assert_int_eq(res[1].shared[i], 0);
  done_with(res);
}
END_TEST

/* A rank the token does not admit never gets the value. */
START_TEST(shared_value_withheld_from_wrong_token) {
  scenario s = {.world = 2,
                .die_rank = -1,
                .body = body_none,
                .token = {NULL, "other-secret"},
                .shared_len = {128, 128}};
  rank_result *res = run(&s);
  for (int r = 0; r < 2; r++)
    ck_assert_msg(res[r].done && res[r].code == PE_EINVAL, "rank %d: %s", r, res[r].msg);
  ck_assert_msg(strstr(res[1].msg, "presented a token that differs"), "%s", res[1].msg);
  for (int i = 0; i < SHARED_MAX; i++) ck_assert_int_eq(res[1].shared[i], 0);
  done_with(res);
}
END_TEST

START_TEST(world_size_mismatch_refused) {
  scenario s = {.world = 2, .die_rank = -1, .body = body_none, .world_of = {2, 3}};
  const char *needles[] = {"job 'job-a' rank ",
                           "rank 1 (from 127.0.0.1:", "expects world size 3, rank 0 expects 2",
                           NULL};
  expect_refused(&s, needles);
}
END_TEST

START_TEST(rank_0_unreachable) {
  /* World 2, rank 0 never starts: rank 1 gives up after its timeout. */
  char rv[64];
  snprintf(rv, sizeof rv, "127.0.0.1:%d", free_port());
  pe_gloo_opts o = job_opts(rv, 1, 2, 500);
  pe_gloo_comm *c = NULL;
  alarm(GUARD_S);
  pe_status *st = pe_gloo_comm_new(&o, &c);
  alarm(0);
  ck_assert_ptr_null(c);
  ck_assert_msg(st && pe_status_code(st) == PE_EIO, "%s", pe_status_msg(st));
  ck_assert_msg(strstr(pe_status_msg(st), "job 'job-a' rank 1") &&
                    strstr(pe_status_msg(st), "unreachable") && strstr(pe_status_msg(st), rv),
                "%s", pe_status_msg(st));
  pe_status_free(st);
}
END_TEST

START_TEST(bad_options_refused) {
  pe_gloo_comm *c = NULL;
  pe_gloo_opts o = {
      .job = "job-a", .token = "secret", .rendezvous = "127.0.0.1:1", .rank = 2, .world_size = 2};
  pe_status *st = pe_gloo_comm_new(&o, &c);
  ck_assert_msg(st && strstr(pe_status_msg(st), "rank 2 is outside 0..1"), "%s", pe_status_msg(st));
  pe_status_free(st);
  o.rank = 0;
  o.rendezvous = "127.0.0.1";
  st = pe_gloo_comm_new(&o, &c);
  ck_assert_msg(st && strstr(pe_status_msg(st), "'127.0.0.1' is not HOST:PORT"), "%s",
                pe_status_msg(st));
  pe_status_free(st);
  o.rendezvous = "127.0.0.1:1";
  o.token = "";
  st = pe_gloo_comm_new(&o, &c);
  ck_assert_msg(st && strstr(pe_status_msg(st), "no token"), "%s", pe_status_msg(st));
  pe_status_free(st);
  o.token = "secret";
  char out[8];
  pe_gloo_shared sh = {"nccl/id", "abcdefgh", out, sizeof out};
  o.shared = &sh;
  st = pe_gloo_comm_new(&o, &c);
  ck_assert_msg(st && strstr(pe_status_msg(st), "shared key 'nccl/id' must be"), "%s",
                pe_status_msg(st));
  pe_status_free(st);
  sh = (pe_gloo_shared){"nccl-id", NULL, out, sizeof out};
  st = pe_gloo_comm_new(&o, &c);
  ck_assert_msg(st && strstr(pe_status_msg(st), "needs an output buffer and rank 0's value"), "%s",
                pe_status_msg(st));
  pe_status_free(st);
  ck_assert_ptr_null(c);
}
END_TEST

START_TEST(killed_peer_fails_the_others) {
  /* Rank 2 dies (SIGKILL) in the middle of a loop of all-reduces; ranks 0
   * and 1 get an error naming it within the timeout, and do not hang. */
  scenario s = {.world = 3, .timeout_ms = 5000, .die_rank = 2, .die_round = 20, .body = body_loop};
  rank_result *res = run(&s);
  ck_assert_msg(!res[2].done, "rank 2 was to die");
  for (int r = 0; r < 2; r++) {
    ck_assert_msg(res[r].done, "rank %d did not finish", r);
    ck_assert_msg(res[r].rounds >= 20, "rank %d: %d rounds before the failure", r, res[r].rounds);
    ck_assert_msg(res[r].code == PE_EIO, "rank %d: %s (%s)", r, res[r].msg,
                  pe_code_name(res[r].code));
    ck_assert_msg(strstr(res[r].msg, "job 'job-a' rank ") &&
                      strstr(res[r].msg, "lost peer rank 2 (connection closed)"),
                  "rank %d: %s", r, res[r].msg);
    ck_assert_msg(res[r].fail_after < 20, "rank %d took %.1f s to fail", r, res[r].fail_after);
    ck_assert_msg(res[r].wrong == 0, "rank %d: a later call did not report the failure", r);
  }
  done_with(res);
}
END_TEST

START_TEST(broadcast_to_killed_peer_fails) {
  /* Rank 0 only sends (broadcasts) to rank 1, which dies first: the error
   * names it, and rank 0 exits normally (run() checks). */
  scenario s = {.world = 2,
                .timeout_ms = 5000,
                .die_rank = 1,
                .die_round = 0,
                .send_only = 1,
                .body = body_loop};
  rank_result *res = run(&s);
  ck_assert_msg(res[0].done && res[0].code == PE_EIO, "rank 0: %s (%s)", res[0].msg,
                pe_code_name(res[0].code));
  ck_assert_msg(strstr(res[0].msg, "broadcast of 16384 bytes from rank 0 failed: lost peer rank 1"),
                "%s", res[0].msg);
  done_with(res);
}
END_TEST

static void on_sigpipe(int sig) {}

/* Gloo's writes to a dead peer raise SIGPIPE: a communicator sets it to
 * ignored where it is at its default, and leaves a handler alone. */
START_TEST(sigpipe_ignored_unless_handled) {
  char rv[64];
  snprintf(rv, sizeof rv, "127.0.0.1:%d", free_port());
  pe_gloo_opts o = job_opts(rv, 0, 1, 5000);
  for (int handled = 0; handled < 2; handled++) {
    void (*before)(int) = handled ? on_sigpipe : SIG_DFL;
    signal(SIGPIPE, before);
    pe_gloo_comm *c = NULL;
    alarm(GUARD_S);
    PE_CK_OK(pe_gloo_comm_new(&o, &c));
    alarm(0);
    struct sigaction now;
    ck_assert_int_eq(sigaction(SIGPIPE, NULL, &now), 0);
    ck_assert_msg(now.sa_handler == (handled ? on_sigpipe : SIG_IGN), "handled=%d", handled);
    pe_gloo_comm_free(c);
  }
}
END_TEST

static Suite *gloo_comm_suite(void) {
  Suite *s = suite_create("gloo_comm");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, allreduce_one_rank_is_identity);
  tcase_add_test(tc, allreduce_two_ranks_exact);
  tcase_add_test(tc, allreduce_three_ranks_exact);
  tcase_add_test(tc, broadcast_from_rank_1);
  tcase_add_test(tc, token_mismatch_refused);
  tcase_add_test(tc, shared_value_reaches_every_rank);
  tcase_add_test(tc, shared_value_of_other_length_refused);
  tcase_add_test(tc, shared_value_withheld_from_wrong_token);
  tcase_add_test(tc, world_size_mismatch_refused);
  tcase_add_test(tc, rank_0_unreachable);
  tcase_add_test(tc, bad_options_refused);
  tcase_add_test(tc, killed_peer_fails_the_others);
  tcase_add_test(tc, broadcast_to_killed_peer_fails);
  tcase_add_test(tc, sigpipe_ignored_unless_handled);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(gloo_comm_suite)
