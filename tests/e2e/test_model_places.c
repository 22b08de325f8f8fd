/* pe-executord end to end: a register that names no places takes an
 * existing model's (after `train --places cpu:2`, an eval, run or train
 * of the model need not repeat --places, the daemon's cpu:1 not being
 * taken for a request of other places); one naming other places is still refused
 * naming both. The register reply names where the model runs. */
#include "check_main.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define CLIENT 0x91ace

START_TEST(test_register_without_places_takes_the_models) {
  dh_daemon d = {0};
  dh_start(&d, NULL); /* the daemon's places: cpu:1 */
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  dh_places = "cpu:2";
  uint64_t h2 = dh_setup_model(s, CLIENT, &mlp, "p2", 3, true, NULL);
  dh_run_loss(s, CLIENT, h2, &b, mlp.loss, 2);

  /* No places: the model's cpu:2, for a training and an eval program. */
  dh_places = NULL;
  Pe__Reply *rep = dh_register_call(s, CLIENT, &mlp, "p2", 3, false);
  dh_ok(rep);
  ck_assert_str_eq(rep->register_->places, "cpu:2");
  uint64_t h = rep->register_->handle;
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(!dh_init_ok(s, CLIENT, h));
  float loss = dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  ck_assert_msg(loss == loss && loss > 0, "loss %g", loss);
  dh_for_test = true;
  rep = dh_register_call(s, CLIENT, &mlp, "p2", 3, false);
  dh_for_test = false;
  dh_ok(rep);
  ck_assert_str_eq(rep->register_->places, "cpu:2");
  pe__reply__free_unpacked(rep, NULL);

  /* Other places named: refused, naming both. */
  dh_places = "cpu:1";
  rep = dh_register_call(s, CLIENT, &mlp, "p2", 3, false);
  dh_err(rep, PE_EINVAL, "model 'p2' lives on cpu:2, the program asks for cpu:1");
  pe__reply__free_unpacked(rep, NULL);
  dh_places = NULL;

  /* A new name without places: the daemon's. */
  rep = dh_register_call(s, CLIENT, &mlp, "p1", 3, false);
  dh_ok(rep);
  ck_assert_str_eq(rep->register_->places, "cpu:1");
  pe__reply__free_unpacked(rep, NULL);

  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("model_places");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_register_without_places_takes_the_models);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
