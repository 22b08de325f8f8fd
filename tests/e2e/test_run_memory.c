/* pe-executord end to end: [limits] memory_per_run bounds the temporary
 * memory of one step, as the program's memory plan sizes it for the batch
 * fed. A run over it is refused before it starts (OUT_OF_MEMORY naming the
 * batch, the bytes and the limit); with batches, one mini-batch's rows
 * count. Before, a run of any batch went ahead (a batch-100000 run of a
 * small program took the daemon to 2.4 GB). Status shows the daemon's
 * resident memory and its host allocator's bytes. */
#include "check_main.h"
#include "core/allocator.h"
#include "daemon_harness.h"

#define CLIENT 0x3e30

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

static Suite *suite(void) {
  Suite *s = suite_create("run_memory");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, run_over_memory_per_run_is_refused);
  tcase_add_test(tc, status_shows_the_daemons_memory);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
