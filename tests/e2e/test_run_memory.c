/* pe-executord end to end: [limits] memory_per_run bounds the temporary
 * memory of one step, as the program's memory plan sizes it for the batch
 * fed. A run over it is refused before it starts (OUT_OF_MEMORY naming the
 * batch, the bytes and the limit); with batches, one mini-batch's rows
 * count. Before, a run of any batch went ahead (a batch-100000 run of a
 * small program took the daemon to 2.4 GB). */
#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT 0x3e30

/* A run of handle h on b, `batches` mini-batches (0: one step); the reply. */
static Pe__Reply *run(int s, uint64_t h, dh_batch *b, const char *loss, uint32_t batches) {
  Pe__RunRequest rr;
  char *f[] = {(char *)loss};
  Pe__Request rq = dh_run_req(CLIENT, &rr, h, b->feeds, 2, f, 1, 0);
  rr.batches = batches;
  return dh_call(s, &rq);
}

/* The mlp's plan: about 1 MB at 16 rows, 2.6 MB at 256, 14 MB at 2048. */
START_TEST(run_over_memory_per_run_is_refused) {
  dh_daemon d = {0};
  dh_start(&d, "[limits]\nmemory_per_run = 4M\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "m", 1, false, NULL);
  dh_batch small, big;
  dh_batch_make(&small, 16, 1);
  dh_batch_make(&big, 2048, 2);
  float loss = dh_run_loss(s, CLIENT, h, &small, mlp.loss, 1);
  ck_assert_msg(loss > 0 && loss < 100, "loss %g", loss);

  Pe__Reply *rep = run(s, h, &big, mlp.loss, 0);
  dh_err(rep, PE_ENOMEM, "run: a batch of 2048 rows needs ");
  ck_assert_msg(strstr(rep->message, "over the limit [limits] memory_per_run = 4194304"), "%s",
                rep->message);
  pe__reply__free_unpacked(rep, NULL);
  /* The same rows as 8 mini-batches of 256: each step fits. */
  rep = run(s, h, &big, mlp.loss, 8);
  dh_ok(rep);
  ck_assert_uint_eq(rep->run->steps, 8);
  pe__reply__free_unpacked(rep, NULL);

  dh_batch_free(&small);
  dh_batch_free(&big);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("run_memory");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, run_over_memory_per_run_is_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
