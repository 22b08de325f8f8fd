/* pe-executord end to end, fused convolutions, fully-connected layers and
 * batch norms (pass fuse_conv_act): by default the daemon runs the CNN's
 * conv2d + bias add + relu and matmul + bias add (+ relu) as one op each
 * (the run's trace has no node for any of the adds and relus), and the
 * resnet's batch_norm + relu as one batch_norm and its residual adds with
 * their relus as one elementwise_add each (pass fuse_add_act: no relu and
 * no relu_grad left; a fetch of a sum fused away names the op it went
 * into); RegisterOptions.no_op_fusion keeps them apart; from
 * the same seed both programs train to the same losses (to rounding). */
#include <math.h>
#include <stdlib.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "pe_model_file.h"
#include "test_assert.h"

#define CLIENT 0xF0F0
#define BATCH 8

/* Occurrences of needle in s. */
static int count(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

typedef struct traced {
  float loss[3];
  /* trace events of one traced step */
  int adds, relus, convs, matmuls, bns, relu_grads;
} traced;

/* Register the CNN (or another model of 1x28x28 images) as `model`, init
 * it (seed 5), run 3 single steps on the same batch, the last one traced;
 * fused, a fetch of fused_away (when given) fails naming fused_note. */
static traced train_cnn(int s, const pe_model_spec *cnn, const char *model, bool no_fusion,
                        const char *fused_away, const char *fused_note) {
  dh_no_op_fusion = no_fusion;
  uint64_t h = dh_register(s, CLIENT, cnn, model, 5, false, NULL, NULL);
  dh_no_op_fusion = false;
  ck_assert(dh_init_ok(s, CLIENT, h));
  dh_batch b;
  dh_batch_make(&b, BATCH, 3);
  int64_t shape[4] = {BATCH, 1, 28, 28}; /* the CNN's image is NCHW */
  b.t_image.n_shape = 4;
  b.t_image.shape = shape;
  traced t = {{0}};
  for (int i = 0; i < 2; i++) t.loss[i] = dh_run_loss(s, CLIENT, h, &b, cnn->loss, 1);
  Pe__RunRequest run;
  Pe__RunOptions ro = PE__RUN_OPTIONS__INIT;
  ro.trace = 1;
  char *fetch[] = {(char *)cnn->loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fetch, 1, 1);
  run.options = &ro;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert_int_eq((int)rep->run->n_fetched, 1);
  ck_assert_uint_ge(rep->run->fetched[0]->data.len, 4);
  memcpy(&t.loss[2], rep->run->fetched[0]->data.data, 4);
  char *json = strndup((const char *)rep->run->trace_json.data, rep->run->trace_json.len);
  if (fused_away && !no_fusion) { /* a fetch of it names the op it went into */
    char *f2[] = {(char *)fused_away};
    Pe__RunRequest run2;
    Pe__Request rq2 = dh_run_req(CLIENT, &run2, h, b.feeds, 2, f2, 1, 1);
    Pe__Reply *r2 = dh_call(s, &rq2);
    dh_err(r2, PE_EUNKNOWN_VAR, fused_note);
    pe__reply__free_unpacked(r2, NULL);
  }
  t.adds = count(json, "\"elementwise_add#");
  t.relus = count(json, "\"relu#");
  t.convs = count(json, "\"conv2d#");
  t.matmuls = count(json, "\"matmul#");
  t.bns = count(json, "\"batch_norm#");
  t.relu_grads = count(json, "\"relu_grad#");
  free(json);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch_free(&b);
  return t;
}

/* Start a daemon, train m fused (the default) and with no_op_fusion: from
 * the same seed both reach the same losses (to rounding), which fall. */
static void train_both(const pe_model_spec *m, traced *fused, traced *plain, const char *fused_away,
                       const char *fused_note) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  *fused = train_cnn(s, m, "fused", false, fused_away, fused_note);
  *plain = train_cnn(s, m, "plain", true, NULL, NULL);
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(isfinite(fused->loss[i]), "fused loss %d: %f", i, fused->loss[i]);
    ck_assert_msg(
        fabsf(fused->loss[i] - plain->loss[i]) <= 1e-5f * fmaxf(1.f, fabsf(plain->loss[i])),
        "step %d: fused loss %.7f, unfused %.7f", i, fused->loss[i], plain->loss[i]);
  }
  ck_assert_msg(fused->loss[2] < fused->loss[0], "loss %f -> %f", fused->loss[0], fused->loss[2]);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}

START_TEST(test_conv_fusion_default_and_off) {
  pe_model_spec cnn;
  char err[256];
  ck_assert_msg(pe_model_spec_build("cnn", &cnn, err, sizeof err) == 0, "cnn: %s", err);
  traced fused, plain;
  train_both(&cnn, &fused, &plain, NULL, NULL);
  /* Unfused: both convolutions and fc 1024 add a bias and apply relu, fc 10
   * adds a bias. Fused: the convolutions and matmuls do it all. */
  ck_assert_int_eq(plain.convs, 2);
  ck_assert_int_eq(plain.matmuls, 2);
  ck_assert_int_eq(plain.adds, 4);
  ck_assert_int_eq(plain.relus, 3);
  ck_assert_int_eq(fused.convs, 2);
  ck_assert_int_eq(fused.matmuls, 2);
  ck_assert_int_eq(fused.adds, 0);
  ck_assert_int_eq(fused.relus, 0);
  pe_model_spec_release(&cnn);
}
END_TEST

START_TEST(test_bn_fusion_default_and_off) {
  pe_model_spec rn;
  char err[256], path[1024];
  const char *src = getenv("PE_SOURCE_DIR");
  snprintf(path, sizeof path, "%s/conf/models/resnet", src ? src : ".");
  ck_assert_msg(pe_model_file_load(path, &rn, err, sizeof err) == 0, "resnet: %s", err);
  traced fused, plain;
  /* The first residual sum, fused into its add with the relu. */
  train_both(&rn, &fused, &plain, "add_0.tmp_0",
             "fetch 'add_0.tmp_0': it was fused into op elementwise_add writing 'add_0.out' "
             "(elementwise_add+relu) by op fusion");
  /* Nine batch norms, four with act=relu; three residual adds with a relu
   * each (fused: the adds stay and take the relus); fc 10's bias add (fused
   * into its matmul). */
  ck_assert_int_eq(plain.bns, 9);
  ck_assert_int_eq(plain.relus, 7);
  ck_assert_int_eq(plain.relu_grads, 7);
  ck_assert_int_eq(plain.adds, 4);
  ck_assert_int_eq(fused.bns, 9);
  ck_assert_int_eq(fused.relus, 0);
  ck_assert_int_eq(fused.relu_grads, 0);
  ck_assert_int_eq(fused.adds, 3);
  pe_model_spec_release(&rn);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_fusion");
  TCase *tc = tcase_create("fusion");
  tcase_add_test(tc, test_conv_fusion_default_and_off);
  tcase_add_test(tc, test_bn_fusion_default_and_off);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
