/* pe-executord end to end: after a restart, the first register of a model
 * name restores its restart checkpoint whether or not the program is
 * persistent. Otherwise a non-persistent program (a `pe-client run`,
 * `trace` or `register --init`) registered first would create the model
 * with fresh parameters; a persistent program would then join them, and
 * the next SIGTERM or autosave would replace the trained checkpoint with
 * them. Here: a persistent model is trained and SIGTERMed; after the
 * restart a non-persistent program registers, inits (nothing to init) and
 * runs, and sees the trained values; a persistent program joins and trains
 * on; the next SIGTERM's checkpoint holds the continued values, and a
 * non-persistent model restored this way alone never writes the file. */
#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT 0xa11
#define OTHER 0xa12

static uint8_t *read_file(const char *path, size_t *len) {
  uint8_t *buf;
  PE_CK_OK(pe_read_file(path, (size_t)1 << 30, &buf, len));
  return buf;
}

/* The weight w of model pm equals want (len bytes). */
static void same_param(int s, const char *w, const uint8_t *want, size_t len, const char *when) {
  size_t n;
  uint8_t *got = dh_get_param(s, CLIENT, "pm", w, &n);
  ck_assert_msg(n == len && !memcmp(got, want, len), "%s: '%s' of model pm differs", when, w);
  free(got);
}

START_TEST(test_non_persistent_first_register_restores) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  char *w = NULL;
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "pm", 3, true, &w);
  float fresh_loss = dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 20);
  size_t tlen;
  uint8_t *trained = dh_get_param(s, CLIENT, "pm", w, &tlen);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  char path[512];
  snprintf(path, sizeof path, "%s/models/pm/shutdown.ckpt", d.state);
  size_t flen;
  uint8_t *file1 = read_file(path, &flen);

  /* A non-persistent program first (another seed: fresh values would
   * differ), as `pe-client run` or `register --init` would. */
  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  Pe__Reply *rep;
  uint64_t hn = dh_register(s, OTHER, &mlp, "pm", 7, false, NULL, &rep);
  ck_assert_msg(rep->register_->has_values, "a non-persistent register did not restore");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_msg(!dh_init_ok(s, OTHER, hn), "init ran the startup over the restored values");
  same_param(s, w, trained, tlen, "after a non-persistent register");
  float cont = dh_run_loss(s, OTHER, hn, &b, mlp.loss, 1);
  ck_assert_msg(cont < fresh_loss, "loss %g after the restart, a fresh model's was %g", cont,
                fresh_loss);

  /* A persistent program joins and trains on from there. */
  uint64_t hp = dh_register(s, CLIENT, &mlp, "pm", 3, true, NULL, NULL);
  dh_init_ok(s, CLIENT, hp);
  dh_run_loss(s, CLIENT, hp, &b, mlp.loss, 5);
  size_t clen;
  uint8_t *continued = dh_get_param(s, CLIENT, "pm", w, &clen);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  /* The checkpoint holds the continued values, not fresh ones. */
  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  dh_register(s, CLIENT, &mlp, "pm", 3, true, NULL, NULL);
  same_param(s, w, continued, clen, "after the second restart");
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  /* A model restored by a non-persistent program alone is not
   * persistent: its training never reaches the file. */
  size_t len2;
  uint8_t *file2 = read_file(path, &len2);
  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  hn = dh_register(s, OTHER, &mlp, "pm", 7, false, NULL, NULL);
  dh_init_ok(s, OTHER, hn);
  dh_run_loss(s, OTHER, hn, &b, mlp.loss, 3);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  size_t len3;
  uint8_t *file3 = read_file(path, &len3);
  ck_assert_msg(len2 == len3 && !memcmp(file2, file3, len2),
                "a non-persistent model rewrote the restart checkpoint");
  ck_assert_msg(flen != len2 || memcmp(file1, file2, flen), "continued training not saved");

  free(file1);
  free(file2);
  free(file3);
  free(trained);
  free(continued);
  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("restart_any_register");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_non_persistent_first_register_restores);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
