/* A run whose feeds have no rows is refused, with the same code and
 * message on every place (not the loss and accuracy of the step before on
 * cpu:1, nor "fetch 'mean_0.out': no value" on cpu:2 and sim:2). The parameters stay as they were,
 * and the next run with rows trains as before. */
#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT 0xe3b7

static void empty_batch_refused_on(const char *places) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_places = places;
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "empty", 3, false, NULL);
  dh_places = NULL;
  dh_batch rows, none;
  dh_batch_make(&rows, 8, 1);
  dh_batch_make(&none, 0, 2);
  float loss = dh_run_loss(s, CLIENT, h, &rows, mlp.loss, 1);
  ck_assert_msg(loss == loss && loss > 0, "%s: loss %g", places, loss);
  Pe__Reply *before = dh_get_all(s, CLIENT, "empty");

  for (uint32_t batches = 0; batches <= 2; batches += 2) {
    Pe__Reply *rep = dh_run_batches(s, CLIENT, h, &none, mlp.loss, batches);
    dh_err(rep, PE_ESHAPE,
           "run: feed 'image' has shape [0,784]: an empty batch; a run needs at least one row");
    pe__reply__free_unpacked(rep, NULL);
  }
  Pe__Reply *after = dh_get_all(s, CLIENT, "empty");
  const char *changed = dh_params_differ(before, after);
  ck_assert_msg(!changed, "%s: '%s' changed by a refused run", places, changed);
  float next = dh_run_loss(s, CLIENT, h, &rows, mlp.loss, 1);
  ck_assert_msg(next < loss, "%s: loss %g after %g", places, next, loss);

  pe__reply__free_unpacked(before, NULL);
  pe__reply__free_unpacked(after, NULL);
  dh_batch_free(&rows);
  dh_batch_free(&none);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}

static const char *const places[] = {"cpu:1", "cpu:2", "sim:2"};

START_TEST(test_empty_batch) {
  empty_batch_refused_on(places[_i]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("run_empty_batch");
  TCase *tc = tcase_create("e2e");
  tcase_add_loop_test(tc, test_empty_batch, 0, 3); /* places[_i] */
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
