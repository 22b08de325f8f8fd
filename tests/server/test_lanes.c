/* The request lanes (server/lanes.h) with a handler of the test's own:
 * each kind goes to its lane's threads; a request waits until its
 * client's earlier ones have started, whatever their lanes, while other
 * clients' requests, and anonymous ones, pass it; a run "starts" when its
 * handler says so, any request at the latest when its handler returns;
 * closing handles the requests that still wait rather than drop them. */
#include <nanomsg/nn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "server/lanes.h"
#include "service.pb-c.h"
#include "test_assert.h"

#define WAIT_S 5.0   /* for what must happen (a loaded host) */
#define QUIET_MS 200 /* for what must not */

/* What the handler saw: the seqs in the order their handlers began, and
 * the lane of each. The handler of seq `hold` waits for `start` before it
 * calls pe_lanes_started, then for `release`. */
typedef struct rec {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t order[32];
  pe_lane lane[32];
  int n;
  uint64_t hold;
  uint64_t park[2]; /* seqs whose handlers wait for `release` (0: none) */
  bool start, release;
  int total;         /* handlers begun, all of them */
  uint64_t last;     /* the seq of the latest */
  bool out_of_order; /* one began after a later seq had */
} rec;

static void handler(void *ctx, pe_job *j) {
  rec *r = ctx;
  pthread_mutex_lock(&r->mu);
  r->total++;
  r->out_of_order |= j->seq < r->last;
  r->last = j->seq;
  if (r->n < 32) { /* most tests send fewer */
    r->lane[r->n] = j->lane;
    r->order[r->n++] = j->seq;
  }
  pthread_cond_broadcast(&r->cv);
  if (j->seq == r->hold) {
    while (!r->start) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    pe_lanes_started();
    pthread_mutex_lock(&r->mu);
    while (!r->release) pthread_cond_wait(&r->cv, &r->mu);
  } else if (j->seq == r->park[0] || j->seq == r->park[1]) {
    while (!r->release) pthread_cond_wait(&r->cv, &r->mu);
  }
  pthread_mutex_unlock(&r->mu);
  pe_job_free(j);
}

static void rec_init(rec *r, uint64_t hold) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->hold = hold;
}

static void rec_set(rec *r, bool *flag) {
  pthread_mutex_lock(&r->mu);
  *flag = true;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Where seq's handler began in r->order (mu held); -1: not yet. */
static int index_of(const rec *r, uint64_t seq) {
  for (int i = 0; i < r->n; i++)
    if (r->order[i] == seq) return i;
  return -1;
}

/* Whether seq's handler began within limit_s; its position in *at. */
static bool began(rec *r, uint64_t seq, double limit_s, int *at) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  long ns = dl.tv_nsec + (long)((limit_s - (long)limit_s) * 1e9);
  dl.tv_sec += (time_t)limit_s + ns / 1000000000L;
  dl.tv_nsec = ns % 1000000000L;
  pthread_mutex_lock(&r->mu);
  int i;
  while ((i = index_of(r, seq)) < 0 && pthread_cond_timedwait(&r->cv, &r->mu, &dl) == 0) {
  }
  i = index_of(r, seq);
  pthread_mutex_unlock(&r->mu);
  if (at) *at = i;
  return i >= 0;
}

/* The handle of the tests' read-only program. */
#define EVAL_HANDLE 0xe7a1u

static bool read_only(void *ctx, uint64_t handle) {
  (void)ctx;
  return handle == EVAL_HANDLE;
}

/* A job of client's request of kind k (a run: of program h), received
 * seq-th. */
static pe_job *job_of(uint64_t client, Pe__Request__BodyCase k, uint64_t seq, uint64_t h) {
  Pe__Request rq = PE__REQUEST__INIT;
  Pe__RunRequest run = PE__RUN_REQUEST__INIT;
  Pe__CheckpointRequest cr = PE__CHECKPOINT_REQUEST__INIT;
  run.handle = h;
  rq.client_id = client;
  rq.request_id = seq;
  rq.body_case = k;
  if (k == PE__REQUEST__BODY_RUN) rq.run = &run;
  if (k == PE__REQUEST__BODY_SAVE) rq.save = &cr;
  if (k == PE__REQUEST__BODY_PING) rq.ping = 1;
  pe_job *j = calloc(1, sizeof *j);
  ck_assert_ptr_nonnull(j);
  j->len = pe__request__get_packed_size(&rq);
  j->body = nn_allocmsg(j->len ? j->len : 1, 0);
  ck_assert_ptr_nonnull(j->body);
  pe__request__pack(&rq, j->body);
  j->seq = seq;
  return j;
}

static pe_job *job(uint64_t client, Pe__Request__BodyCase k, uint64_t seq) {
  return job_of(client, k, seq, 0x7a1au);
}

/* A run of the read-only program. */
static pe_job *eval_job(uint64_t client, uint64_t seq) {
  return job_of(client, PE__REQUEST__BODY_RUN, seq, EVAL_HANDLE);
}

/* Lanes with `work` work, 1 control and `run` run threads, where client
 * 5's run (seq 1) is taken and held, not started yet. */
static pe_lanes *start_lanes(rec *r, pe_lane_counts *counts, int work, int run) {
  rec_init(r, 1);
  int threads[PE_LANES] = {[PE_LANE_WORK] = work, [PE_LANE_CONTROL] = 1, [PE_LANE_RUN] = run};
  memset(counts, 0, sizeof(pe_lane_counts) * PE_LANES);
  pe_lanes *ls;
  PE_CK_OK(pe_lanes_start(threads, counts, handler, read_only, r, &ls));
  pe_lanes_enqueue(ls, job(5, PE__REQUEST__BODY_RUN, 1));
  int at;
  ck_assert(began(r, 1, WAIT_S, &at));
  ck_assert_int_eq(r->lane[at], PE_LANE_RUN);
  return ls;
}

static pe_lanes *start_with_held_run(rec *r, pe_lane_counts *counts, int run) {
  return start_lanes(r, counts, 1, run);
}

#define RUN PE__REQUEST__BODY_RUN
#define SAVE PE__REQUEST__BODY_SAVE
#define PING PE__REQUEST__BODY_PING

/* Client 5's run (1) is taken and has not started: its ping (2) and save
 * (4) wait in their lanes, though each has a thread free; client 6's ping
 * (3) and an anonymous save (5) pass them. Once the run starts, its ping
 * goes, then its save (after the ping, which it follows). */
START_TEST(later_requests_wait_for_the_earlier_to_start) {
  rec r;
  pe_lane_counts c[PE_LANES];
  pe_lanes *ls = start_with_held_run(&r, c, 1);
  int at;
  pe_lanes_enqueue(ls, job(5, PING, 2));
  pe_lanes_enqueue(ls, job(6, PING, 3));
  pe_lanes_enqueue(ls, job(5, SAVE, 4));
  pe_lanes_enqueue(ls, job(0, SAVE, 5));
  ck_assert_msg(began(&r, 3, WAIT_S, &at), "another client's ping waited");
  ck_assert_int_eq(r.lane[at], PE_LANE_CONTROL);
  ck_assert_msg(began(&r, 5, WAIT_S, &at), "an anonymous save waited");
  ck_assert_int_eq(r.lane[at], PE_LANE_WORK);
  ck_assert_msg(!began(&r, 2, QUIET_MS / 1e3, NULL), "client 5's ping overtook its run");
  ck_assert_msg(!began(&r, 4, 0, NULL), "client 5's save overtook its run");
  ck_assert_int_eq(atomic_load(&c[PE_LANE_CONTROL].queued), 1);
  ck_assert_int_eq(atomic_load(&c[PE_LANE_WORK].queued), 1);

  rec_set(&r, &r.start);
  int ping, save;
  ck_assert_msg(began(&r, 2, WAIT_S, &ping), "client 5's ping still waits after its run started");
  ck_assert_msg(began(&r, 4, WAIT_S, &save), "client 5's save still waits after its run started");
  ck_assert_int_lt(ping, save);
  rec_set(&r, &r.release);
  pe_lanes_free(ls);
  ck_assert_int_eq(r.n, 5);
}
END_TEST

/* In one lane too: client 5's second run (2) waits for its first (1) to
 * start, though the lane has a second thread; client 7's run (3) takes
 * it. */
START_TEST(same_lane_keeps_a_clients_order) {
  rec r;
  pe_lane_counts c[PE_LANES];
  pe_lanes *ls = start_with_held_run(&r, c, 2);
  pe_lanes_enqueue(ls, job(5, RUN, 2));
  pe_lanes_enqueue(ls, job(7, RUN, 3));
  ck_assert_msg(began(&r, 3, WAIT_S, NULL), "client 7's run waited behind client 5's");
  ck_assert_msg(!began(&r, 2, QUIET_MS / 1e3, NULL), "client 5's second run overtook its first");
  rec_set(&r, &r.start);
  ck_assert(began(&r, 2, WAIT_S, NULL));
  rec_set(&r, &r.release);
  pe_lanes_free(ls);
}
END_TEST

static void *start_later(void *arg) {
  rec *r = arg;
  struct timespec ts = {0, QUIET_MS * 1000000L};
  nanosleep(&ts, NULL);
  rec_set(r, &r->start);
  rec_set(r, &r->release);
  return NULL;
}

/* Closing while client 5's ping (2) waits for its run (1): the ping is
 * handled once the run starts, not dropped, and the threads end. */
START_TEST(close_handles_what_waits) {
  rec r;
  pe_lane_counts c[PE_LANES];
  pe_lanes *ls = start_with_held_run(&r, c, 1);
  pe_lanes_enqueue(ls, job(5, PING, 2));
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, start_later, &r), 0);
  pe_lanes_close(ls);
  pe_lanes_free(ls); /* joins the threads */
  pthread_join(th, NULL);
  ck_assert_int_eq(r.n, 2);
  ck_assert_uint_eq(r.order[1], 2);
}
END_TEST

/* 3 work threads, the one run thread held by client 5's run (1). Runs of
 * the read-only program go to work threads, at most 2 at a time (one
 * stays for work requests), each after its client's earlier requests have
 * started; a training run waits for the run thread. */
START_TEST(read_only_runs_take_work_threads_when_runs_are_busy) {
  rec r;
  pe_lane_counts c[PE_LANES];
  pe_lanes *ls = start_lanes(&r, c, 3, 1);
  r.park[0] = 3;
  r.park[1] = 5;
  int at;
  pe_lanes_enqueue(ls, eval_job(5, 2));
  pe_lanes_enqueue(ls, eval_job(7, 3));
  ck_assert_msg(began(&r, 3, WAIT_S, &at), "an eval waited for the busy run thread");
  ck_assert_int_eq(r.lane[at], PE_LANE_WORK);
  ck_assert_msg(!began(&r, 2, 0, NULL), "client 5's eval overtook its run");
  pe_lanes_enqueue(ls, job(8, RUN, 4));
  pe_lanes_enqueue(ls, eval_job(9, 5));
  ck_assert(began(&r, 5, WAIT_S, &at));
  ck_assert_int_eq(r.lane[at], PE_LANE_WORK);
  pe_lanes_enqueue(ls, eval_job(10, 6));
  pe_lanes_enqueue(ls, job(11, SAVE, 7));
  ck_assert_msg(began(&r, 7, WAIT_S, &at), "no work thread left for a save");
  ck_assert_int_eq(r.lane[at], PE_LANE_WORK);
  ck_assert_msg(!began(&r, 6, QUIET_MS / 1e3, NULL), "a third work thread took an eval");
  ck_assert_msg(!began(&r, 4, 0, NULL), "a training run took a work thread");
  ck_assert_msg(!began(&r, 2, 0, NULL), "client 5's eval overtook its run");
  ck_assert_int_eq(atomic_load(&c[PE_LANE_RUN].queued), 3);

  rec_set(&r, &r.start);
  rec_set(&r, &r.release);
  ck_assert(began(&r, 2, WAIT_S, NULL));
  ck_assert(began(&r, 6, WAIT_S, NULL));
  ck_assert(began(&r, 4, WAIT_S, &at));
  ck_assert_int_eq(r.lane[at], PE_LANE_RUN);
  pe_lanes_free(ls);
  ck_assert_int_eq(r.n, 7);
}
END_TEST

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One client pipelines MANY requests (of each lane, in turn) behind its
 * held run: the order rule costs O(1) per request, so MANY = 20,000 take
 * about 0.1 s to queue and handle (Release, a 2-core host shared with other
 * builds), where walking every queue to count a client's unstarted
 * requests on each receipt and again on each start is quadratic and takes
 * seconds. They start in the order received. */
#define MANY 20000
#define MANY_LIMIT_S 2.0
START_TEST(many_pipelined_requests_cost_o1_each) {
  rec r;
  pe_lane_counts c[PE_LANES];
  pe_lanes *ls = start_with_held_run(&r, c, 2);
  static const Pe__Request__BodyCase kinds[] = {RUN, SAVE, PING};
  pe_job **jobs = malloc(sizeof *jobs * MANY);
  ck_assert_ptr_nonnull(jobs);
  for (int i = 0; i < MANY; i++) jobs[i] = job(5, kinds[i % 3], (uint64_t)i + 2);
  double t0 = now_s();
  for (int i = 0; i < MANY; i++) pe_lanes_enqueue(ls, jobs[i]);
  double queued = now_s() - t0;
  ck_assert_int_eq(atomic_load(&c[PE_LANE_RUN].queued) + atomic_load(&c[PE_LANE_WORK].queued) +
                       atomic_load(&c[PE_LANE_CONTROL].queued),
                   MANY);
  rec_set(&r, &r.start);
  rec_set(&r, &r.release);
  pthread_mutex_lock(&r.mu);
  while (r.total < MANY + 1) pthread_cond_wait(&r.cv, &r.mu);
  pthread_mutex_unlock(&r.mu);
  double took = now_s() - t0;
  printf("%d requests of one client: queued in %.3f s, all handled in %.3f s\n", MANY, queued,
         took);
  ck_assert_msg(!r.out_of_order, "a request started before an earlier one of its client");
  ck_assert_msg(took < MANY_LIMIT_S, "%d pipelined requests took %.2f s (queueing %.2f s)", MANY,
                took, queued);
  pe_lanes_free(ls);
  free(jobs);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("lanes");
  TCase *tc = tcase_create("order");
  tcase_add_test(tc, later_requests_wait_for_the_earlier_to_start);
  tcase_add_test(tc, same_lane_keeps_a_clients_order);
  tcase_add_test(tc, close_handles_what_waits);
  tcase_add_test(tc, many_pipelined_requests_cost_o1_each);
  tcase_add_test(tc, read_only_runs_take_work_threads_when_runs_are_busy);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
