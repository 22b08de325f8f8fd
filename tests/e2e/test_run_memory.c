/* pe-executord end to end: [limits] memory_per_run bounds the temporary
 * memory of one step, as the program's memory plan sizes it for the batch
 * fed. A run over it is refused before it starts (OUT_OF_MEMORY naming the
 * batch, the bytes and the limit); with batches, one mini-batch's rows
 * count. Without the limit a batch-100000 run of a small program takes
 * the daemon to 2.4 GB. Status shows the daemon's
 * resident memory and its host allocator's bytes.
 *
 * [limits] memory_runs_total bounds the runs in flight together: a run
 * that does not fit next to them waits (until its timeout: DEADLINE
 * naming the bytes), and Status shows the bytes reserved and the runs
 * waiting, so that N clients each under memory_per_run do not take N
 * times it. An executor gives back the temporaries of a batch twice the
 * current one or more, and after a request past [limits]
 * memory_kept_per_program all of them, so that an idle model does not keep
 * its largest batch's memory. */
#include "async_call.h"
#include "check_main.h"
#include "core/allocator.h"
#include "daemon_harness.h"

#define CLIENT 0x3e30
#define CLIENT_B 0x3e31
#define CLIENT_S 0x3e32

/* A daemon (conf: its config, may be NULL) with the mlp registered and
 * initialised as model "m". */
typedef struct fx {
  dh_daemon d;
  int s;
  pe_model_spec mlp;
  uint64_t h;
} fx;

static void fx_start(fx *f, const char *conf) {
  memset(f, 0, sizeof *f);
  dh_start(&f->d, conf);
  f->s = dh_connect(&f->d, 30000);
  f->mlp = dh_mlp();
  f->h = dh_setup_model(f->s, CLIENT, &f->mlp, "m", 1, false, NULL);
}

static void fx_end(fx *f) {
  pe_model_spec_release(&f->mlp);
  nn_close(f->s);
  ck_assert_int_eq(dh_stop(&f->d, SIGTERM), 0);
  dh_cleanup(&f->d);
}

/* The mlp's plan: about 1 MB at 16 rows, 2.6 MB at 256, 14 MB at 2048. */
START_TEST(run_over_memory_per_run_is_refused) {
  fx f;
  fx_start(&f, "[limits]\nmemory_per_run = 4M\n");
  dh_batch small, big;
  dh_batch_make(&small, 16, 1);
  dh_batch_make(&big, 2048, 2);
  float loss = dh_run_loss(f.s, CLIENT, f.h, &small, f.mlp.loss, 1);
  ck_assert_msg(loss > 0 && loss < 100, "loss %g", loss);

  Pe__Reply *rep = dh_run_batches(f.s, CLIENT, f.h, &big, f.mlp.loss, 0);
  dh_err(rep, PE_ENOMEM, "run: a batch of 2048 rows needs ");
  ck_assert_msg(strstr(rep->message, "over the limit [limits] memory_per_run = 4194304"), "%s",
                rep->message);
  pe__reply__free_unpacked(rep, NULL);
  /* The same rows as 8 mini-batches of 256: each step fits. */
  rep = dh_run_batches(f.s, CLIENT, f.h, &big, f.mlp.loss, 8);
  dh_ok(rep);
  ck_assert_uint_eq(rep->run->steps, 8);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch_free(&small);
  dh_batch_free(&big);
  fx_end(&f);
}
END_TEST

/* The daemon's resident bytes, from its /proc/<pid>/statm. */
static uint64_t daemon_rss(const dh_daemon *d) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/statm", (int)d->pid);
  FILE *f = fopen(path, "r");
  ck_assert(f != NULL);
  unsigned long long size, resident;
  ck_assert_int_eq(fscanf(f, "%llu %llu", &size, &resident), 2);
  fclose(f);
  return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Status shows the daemon's resident memory (the places' bytes count
 * parameters only: after a client's large run they said 0 while the
 * daemon held gigabytes) and its host allocator's bytes, whose cache stays
 * within its bound. */
START_TEST(status_shows_the_daemons_memory) {
  fx f;
  fx_start(&f, NULL);
  dh_batch b;
  dh_batch_make(&b, 2048, 1);
  dh_run_loss(f.s, CLIENT, f.h, &b, f.mlp.loss, 1);
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  uint64_t before = daemon_rss(&f.d);
  Pe__Reply *rep = dh_call(f.s, &rq);
  uint64_t after = daemon_rss(&f.d);
  dh_ok(rep);
  const Pe__StatusReply *st = rep->status;
  ck_assert_msg(st->rss_bytes >= before / 2 && st->rss_bytes <= after * 2,
                "rss_bytes %llu, /proc says %llu..%llu", (unsigned long long)st->rss_bytes,
                (unsigned long long)before, (unsigned long long)after);
  /* The parameters (about 0.4 MB) and the run's temporaries are host tensors. */
  ck_assert_uint_ge(st->host_bytes_in_use, 400000);
  ck_assert_uint_le(st->host_bytes_cached, PE_ALLOC_CACHE_LIMIT);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch_free(&b);
  fx_end(&f);
}
END_TEST

static Pe__StatusReply *status_of(int s, Pe__Reply **rep) {
  Pe__Request rq = dh_req(CLIENT_S);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  *rep = dh_call(s, &rq);
  dh_ok(*rep);
  return (*rep)->status;
}

/* Status until `what` holds (at most 10 s); the reply, for the caller to
 * free. */
#define STATUS_UNTIL(sock, st, rep, what)                                                   \
  do {                                                                                      \
    double t0_ = dh_now();                                                                  \
    for (;;) {                                                                              \
      st = status_of(sock, &rep);                                                           \
      if ((what) || dh_now() - t0_ > 10) break;                                             \
      pe__reply__free_unpacked(rep, NULL);                                                  \
      dh_sleep_ms(20);                                                                      \
    }                                                                                       \
    ck_assert_msg(what, "status: %s not seen in 10 s (reserved %llu, waiting %d)", #what,   \
                  (unsigned long long)st->run_bytes_reserved, st->runs_waiting_for_memory); \
  } while (0)

static Pe__Request run_req(uint64_t client, Pe__RunRequest *run, Pe__RunOptions *ro, uint64_t h,
                           dh_batch *b, char **fetch, uint32_t steps, uint32_t timeout_ms) {
  Pe__Request rq = dh_req(client);
  rq = dh_run_req(client, run, h, b->feeds, 2, fetch, 1, steps);
  pe__run_options__init(ro);
  ro->timeout_ms = timeout_ms;
  run->options = ro;
  return rq;
}

/* Two clients' runs of about 14 MB each under memory_runs_total = 20M:
 * the second waits while the first runs (DEADLINE at its timeout, naming
 * the bytes; Status shows it waiting and the first's bytes reserved), and
 * goes ahead once the first ends. A run over the total on its own is
 * refused at once. */
START_TEST(runs_in_flight_share_memory_runs_total) {
  fx f;
  fx_start(&f, "[server]\nrequest_threads = 3\n[limits]\nmemory_runs_total = 20M\n");
  int sb = dh_connect(&f.d, 30000), ss = dh_connect(&f.d, 30000);
  uint64_t hb = dh_setup_model(sb, CLIENT_B, &f.mlp, "n", 1, false, NULL);
  dh_batch big, huge;
  dh_batch_make(&big, 2048, 1);
  dh_batch_make(&huge, 4096, 2);
  char *fetch[] = {(char *)f.mlp.loss};
  Pe__RunRequest run;
  Pe__RunOptions ro;
  Pe__Reply *rep;
  Pe__StatusReply *st;

  /* Client A: a long run (ended below by deregistering its program). */
  Pe__Request rq = run_req(CLIENT, &run, &ro, f.h, &big, fetch, 1000000, 60000);
  dh_async a;
  dh_async_start(&a, &f.d, &rq);
  STATUS_UNTIL(ss, st, rep, st->run_bytes_reserved > 0);
  uint64_t one = st->run_bytes_reserved;
  ck_assert_msg(one > (10u << 20) && one <= (20u << 20), "reserved %llu", (unsigned long long)one);
  pe__reply__free_unpacked(rep, NULL);

  /* Client B: fits alone, not next to A: waits, here until its timeout. */
  rq = run_req(CLIENT_B, &run, &ro, hb, &big, fetch, 1, 300);
  double t0 = dh_now();
  rep = dh_call(sb, &rq);
  double took = dh_now() - t0;
  dh_err(rep, PE_EDEADLINE,
         "run: timeout of 300 ms reached waiting for memory: a batch of 2048 rows needs ");
  char want[160];
  snprintf(want, sizeof want, "the runs in flight hold %llu", (unsigned long long)one);
  ck_assert_msg(strstr(rep->message, want), "%s", rep->message);
  ck_assert_msg(strstr(rep->message, "of [limits] memory_runs_total = 20971520"), "%s",
                rep->message);
  ck_assert_msg(took >= 0.25, "refused after %.3f s", took);
  pe__reply__free_unpacked(rep, NULL);

  /* Over the total on its own: refused at once. */
  rep = dh_run_batches(sb, CLIENT_B, hb, &huge, f.mlp.loss, 0);
  dh_err(rep, PE_ENOMEM, "run: a batch of 4096 rows needs ");
  ck_assert_msg(strstr(rep->message, "over the limit [limits] memory_runs_total = 20971520"), "%s",
                rep->message);
  pe__reply__free_unpacked(rep, NULL);

  /* B again, no timeout: Status shows it waiting; once A's run ends, B's
   * goes ahead. */
  rq = run_req(CLIENT_B, &run, &ro, hb, &big, fetch, 1, 0);
  dh_async b;
  dh_async_start(&b, &f.d, &rq);
  STATUS_UNTIL(ss, st, rep, st->runs_waiting_for_memory == 1);
  ck_assert_uint_eq(st->run_bytes_reserved, one);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(!atomic_load(&b.done));
  rq = dh_req(CLIENT);
  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  dr.handle = f.h;
  dr.force = true;
  rq.body_case = PE__REQUEST__BODY_DEREGISTER;
  rq.deregister = &dr;
  pe__reply__free_unpacked(dh_call(ss, &rq), NULL);
  ck_assert(dh_async_wait(&a, 30));
  ck_assert_ptr_nonnull(a.rep);
  dh_err(a.rep, PE_EIO, "was deregistered");
  ck_assert(dh_async_wait(&b, 30));
  ck_assert_ptr_nonnull(b.rep);
  dh_ok(b.rep);
  ck_assert_uint_eq(b.rep->run->steps, 1);
  pe__reply__free_unpacked(a.rep, NULL);
  pe__reply__free_unpacked(b.rep, NULL);
  free(a.buf);
  free(b.buf);
  STATUS_UNTIL(ss, st, rep, st->run_bytes_reserved == 0 && st->runs_waiting_for_memory == 0);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch_free(&big);
  dh_batch_free(&huge);
  nn_close(sb);
  nn_close(ss);
  fx_end(&f);
}
END_TEST

/* A batch of 2048 rows, then one of 16: the executor gives back the large
 * batch's temporaries (host bytes in use drop by most of its 14 MB plan)
 * rather than keeping them until the model is deregistered. */
START_TEST(smaller_batch_gives_back_the_larger_ones_memory) {
  fx f;
  fx_start(&f, NULL);
  int ss = dh_connect(&f.d, 30000);
  dh_batch small, big;
  dh_batch_make(&small, 16, 1);
  dh_batch_make(&big, 2048, 2);
  Pe__Reply *rep;
  dh_run_loss(f.s, CLIENT, f.h, &big, f.mlp.loss, 2);
  uint64_t after_big = status_of(ss, &rep)->host_bytes_in_use;
  pe__reply__free_unpacked(rep, NULL);
  dh_run_loss(f.s, CLIENT, f.h, &small, f.mlp.loss, 2);
  uint64_t after_small = status_of(ss, &rep)->host_bytes_in_use;
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_msg(after_small + (8u << 20) < after_big,
                "host bytes in use %llu after the batch of 2048, %llu after the batch of 16",
                (unsigned long long)after_big, (unsigned long long)after_small);
  /* The small batch again: nothing more to give back, the loss is sane. */
  float loss = dh_run_loss(f.s, CLIENT, f.h, &small, f.mlp.loss, 1);
  ck_assert_msg(loss > 0 && loss < 100, "loss %g", loss);
  dh_batch_free(&small);
  dh_batch_free(&big);
  nn_close(ss);
  fx_end(&f);
}
END_TEST

/* memory_kept_per_program = 1M: after a request whose plan needs more,
 * the program's temporaries are given back; the next run still trains.
 * (Device places' memory is not in the host bytes: engine.test_par_temps
 * covers sim.) */
START_TEST(idle_program_keeps_at_most_memory_kept_per_program) {
  fx f;
  fx_start(&f, "[limits]\nmemory_kept_per_program = 1M\n");
  int ss = dh_connect(&f.d, 30000);
  dh_batch big;
  dh_batch_make(&big, 2048, 2);
  Pe__Reply *rep;
  float first = dh_run_loss(f.s, CLIENT, f.h, &big, f.mlp.loss, 3);
  uint64_t idle = status_of(ss, &rep)->host_bytes_in_use;
  pe__reply__free_unpacked(rep, NULL);
  /* The parameters (about 0.4 MB) and optimizer state stay. */
  ck_assert_msg(idle < (3u << 20), "host bytes in use %llu after the run",
                (unsigned long long)idle);
  float again = dh_run_loss(f.s, CLIENT, f.h, &big, f.mlp.loss, 3);
  ck_assert_msg(again > 0 && again < first, "loss %g, then %g", first, again);
  dh_batch_free(&big);
  nn_close(ss);
  fx_end(&f);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("run_memory");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, run_over_memory_per_run_is_refused);
  tcase_add_test(tc, status_shows_the_daemons_memory);
  tcase_add_test(tc, runs_in_flight_share_memory_runs_total);
  tcase_add_test(tc, smaller_batch_gives_back_the_larger_ones_memory);
  tcase_add_test(tc, idle_program_keeps_at_most_memory_kept_per_program);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
