/* A label out of range is named by its row in the batch the client fed, on
 * every place (on cpu:2 too the fed row 6 is "row 6", not its row within
 * the place's shard, "row 2"). */
#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT 0x1abe1

static void label_row_on(const char *places) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_places = places;
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "labels", 3, false, NULL);
  dh_places = NULL;
  dh_batch b;
  dh_batch_make(&b, 8, 1);
  b.label[6] = 12; /* on two places: the second place's row 2 */
  Pe__RunRequest run;
  char *f[] = {mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, f, 1, 3);
  Pe__Reply *rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "row 6 ");
  dh_err(rep, PE_EINVAL, "12, outside [0, 10)");
  /* Its first step failed: no step applied, so no RunReply counting any. */
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY__NOT_SET);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}

static const char *const places[] = {"cpu:1", "cpu:2", "sim:2"};

START_TEST(test_label_row) {
  label_row_on(places[_i]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("label_row");
  TCase *tc = tcase_create("e2e");
  tcase_add_loop_test(tc, test_label_row, 0, 3); /* places[_i] */
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
