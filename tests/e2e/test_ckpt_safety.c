/* pe-executord end to end, what protects a model's values: a training run stops at a non-finite
 * loss (check_finite, both run paths), no checkpoint write (save, shutdown) puts non-finite values
 * or an empty file over a good one, and a load of an empty file is refused. */
#include <math.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT 0x5afe

static Pe__Reply *checkpoint(int s, bool save, const char *model, const char *name) {
  return dh_checkpoint(s, CLIENT, save, model, name);
}

/* SetParams of one f32 tensor of shape [n]... given by dims. */
static void set_f32(int s, const char *model, const char *name, int64_t *dims, int ndim,
                    const float *data, size_t n) {
  Pe__Request rq = dh_req(CLIENT);
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  Pe__Tensor t = PE__TENSOR__INIT;
  t.name = (char *)name;
  t.dtype = PE__DATA_TYPE__F32;
  t.n_shape = (size_t)ndim;
  t.shape = dims;
  t.data.data = (uint8_t *)data;
  t.data.len = n * sizeof(float);
  Pe__Tensor *vals[] = {&t};
  pr.model = (char *)model;
  pr.n_values = 1;
  pr.values = vals;
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
}

/* The mlp's logits bias (fc_2.b [10]) with a NaN: every loss is NaN. */
static void poison(int s, const char *model) {
  float b[10] = {0};
  b[3] = NAN;
  int64_t dims[] = {10};
  set_f32(s, model, "fc_2.b", dims, 1, b, 10);
}

/* The bytes of a file (malloc'd), or NULL when it does not exist. */
static uint8_t *slurp(const char *path, size_t *len) {
  uint8_t *buf = NULL;
  pe_status *st = pe_read_file(path, (size_t)1 << 30, &buf, len);
  if (st) {
    pe_status_free(st);
    return NULL;
  }
  return buf;
}

/* The test's usual start: a daemon, a connection, the mlp registered as
 * `model` (seed) with its startup run, batch *b made and `steps` steps run;
 * the program's handle. */
typedef struct trained {
  dh_daemon d;
  int s;
  pe_model_spec mlp;
  dh_batch b;
  uint64_t h;
  float loss; /* of the last step */
} trained;

static void train_start(trained *t, const char *model, uint64_t seed, bool persistent,
                        uint32_t steps) {
  dh_start(&t->d, NULL);
  t->s = dh_connect(&t->d, 30000);
  t->mlp = dh_mlp();
  t->h = dh_setup_model(t->s, CLIENT, &t->mlp, model, seed, persistent, NULL);
  dh_batch_make(&t->b, 16, (unsigned)seed);
  t->loss = dh_run_loss(t->s, CLIENT, t->h, &t->b, t->mlp.loss, steps);
}

/* The end of such a test: its daemon stopped by SIGTERM (exit 0), all freed. */
static void train_end(dh_daemon *d, int s, pe_model_spec *mlp, dh_batch *b) {
  dh_batch_free(b);
  pe_model_spec_release(mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(d, SIGTERM), 0);
  dh_cleanup(d);
}

/* A NaN loss fails the run at its step, naming model, loss and step; the
 * steps before it (and it) stay applied; with or without the loss among
 * the fetches, stepped or batched. check_finite = false trains on. */
START_TEST(test_nonfinite_loss_stops_the_run) {
  trained t = {0};
  train_start(&t, "div", 3, false, 2);
  ck_assert(isfinite(t.loss));
  dh_daemon d = t.d;
  int s = t.s;
  pe_model_spec mlp = t.mlp;
  dh_batch b = t.b;
  uint64_t h = t.h;
  poison(s, "div");

  /* The loss fetched, 3 steps: step 0 fails, and says it stays applied. */
  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fl, 1, 3);
  Pe__Reply *rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "the loss");
  ck_assert_msg(strstr(rep->message, "'div'") && strstr(rep->message, mlp.loss) &&
                    strstr(rep->message, "nan at step 0") && strstr(rep->message, "step 0 stays"),
                "%s", rep->message);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_RUN);
  ck_assert_uint_eq(rep->run->steps, 1);
  pe__reply__free_unpacked(rep, NULL);

  /* No fetch at all: checked just the same. */
  rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, NULL, 0, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "nan at step 0");
  pe__reply__free_unpacked(rep, NULL);

  /* Batched: the first mini-batch stops it. */
  rep = dh_run_batches(s, CLIENT, h, &b, mlp.accuracy, 2);
  dh_err(rep, PE_EINVAL, "nan at step 0");
  pe__reply__free_unpacked(rep, NULL);

  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  /* check_finite = false: the run succeeds and fetches the NaN. */
  dh_start(&d, "[runtime]\ncheck_finite = false\n");
  s = dh_connect(&d, 30000);
  h = dh_setup_model(s, CLIENT, &mlp, "div", 3, false, NULL);
  poison(s, "div");
  ck_assert(isnan(dh_run_loss(s, CLIENT, h, &b, mlp.loss, 2)));

  train_end(&d, s, &mlp, &b);
}
END_TEST

/* A model with NaN values: a named save is refused naming the variable and
 * keeps the file; the shutdown checkpoint keeps the last good one, which
 * the next start restores. */
START_TEST(test_nonfinite_values_are_not_saved) {
  trained t = {0};
  train_start(&t, "pm", 4, true, 2);
  dh_daemon d = t.d;
  int s = t.s;
  pe_model_spec mlp = t.mlp;
  dh_batch b = t.b;
  Pe__Reply *rep = checkpoint(s, true, "pm", "good");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0); /* writes the good restart checkpoint */

  char good[400], restart[400];
  snprintf(good, sizeof good, "%s/models/pm/good.ckpt", d.state);
  snprintf(restart, sizeof restart, "%s/models/pm/shutdown.ckpt", d.state);
  size_t n_good, n_restart;
  uint8_t *good0 = slurp(good, &n_good), *restart0 = slurp(restart, &n_restart);
  ck_assert_ptr_nonnull(good0);
  ck_assert_ptr_nonnull(restart0);

  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  dh_register(s, CLIENT, &mlp, "pm", 4, true, NULL, NULL); /* restored */
  poison(s, "pm");
  rep = checkpoint(s, true, "pm", "good");
  dh_err(rep, PE_EINVAL, "'fc_2.b'");
  ck_assert_msg(strstr(rep->message, "non-finite") && strstr(rep->message, "left as it is"), "%s",
                rep->message);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  dh_stop(&d, SIGTERM); /* the shutdown checkpoint fails: exit status 1 */
  ck_assert(dh_log_has(&d, "non-finite"));

  size_t n1, n2;
  uint8_t *good1 = slurp(good, &n1), *restart1 = slurp(restart, &n2);
  ck_assert_msg(good1 && n1 == n_good && !memcmp(good0, good1, n1), "save replaced good.ckpt");
  ck_assert_msg(restart1 && n2 == n_restart && !memcmp(restart0, restart1, n2),
                "the shutdown checkpoint replaced the good restart checkpoint");

  /* The next start restores the good values. */
  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  dh_register(s, CLIENT, &mlp, "pm", 4, true, NULL, NULL);
  size_t n;
  float *bias = (float *)dh_get_param(s, CLIENT, "pm", "fc_2.b", &n);
  ck_assert_uint_eq(n, 10 * sizeof(float));
  for (int i = 0; i < 10; i++) ck_assert_msg(isfinite(bias[i]), "fc_2.b[%d] = %g", i, bias[i]);
  free(bias);

  free(good0);
  free(good1);
  free(restart0);
  free(restart1);
  train_end(&d, s, &mlp, &b);
}
END_TEST

/* A model without values (registered, no Init): save is refused and the
 * file there stays; a file with no tensors does not load. */
START_TEST(test_empty_save_and_load_refused) {
  trained t = {0};
  train_start(&t, "em", 5, false, 1);
  dh_daemon d = t.d;
  int s = t.s;
  pe_model_spec mlp = t.mlp;
  dh_batch b = t.b;
  Pe__Reply *rep = checkpoint(s, true, "em", "best");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  char best[500], fresh_dir[400], empty[500];
  snprintf(best, sizeof best, "%s/models/em/best.ckpt", d.state);
  size_t n0;
  uint8_t *b0 = slurp(best, &n0);
  ck_assert_ptr_nonnull(b0);
  /* The good file, where a model without values would save. */
  snprintf(fresh_dir, sizeof fresh_dir, "%s/models/fresh", d.state);
  PE_CK_OK(pe_mkdir_p(fresh_dir, 0750));
  PE_CK_OK(pe_write_atomic(fresh_dir, "best.ckpt", b0, n0));
  dh_register(s, CLIENT, &mlp, "fresh", 5, false, NULL, NULL);

  rep = checkpoint(s, true, "fresh", "best");
  dh_err(rep, PE_EINVAL, "model 'fresh' has no values");
  ck_assert_msg(strstr(rep->message, "best.ckpt left as it is"), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);
  size_t n1;
  snprintf(best, sizeof best, "%s/best.ckpt", fresh_dir);
  uint8_t *b1 = slurp(best, &n1);
  ck_assert_msg(b1 && n1 == n0 && !memcmp(b0, b1, n0), "the save replaced best.ckpt");

  /* An empty file (what such a save wrote before) does not load. */
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_ckpt_encode(NULL, 0, NULL, &buf, &len));
  PE_CK_OK(pe_write_atomic(fresh_dir, "empty.ckpt", buf, len));
  free(buf);
  rep = checkpoint(s, false, "fresh", "empty");
  dh_err(rep, PE_EINVAL, "holds no tensors");
  snprintf(empty, sizeof empty, "%s/empty.ckpt", fresh_dir);
  ck_assert_msg(strstr(rep->message, empty) && strstr(rep->message, "'fresh'"), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);
  /* The good file still loads. */
  rep = checkpoint(s, false, "fresh", "best");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);

  free(b0);
  free(b1);
  train_end(&d, s, &mlp, &b);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ckpt_safety");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_nonfinite_loss_stops_the_run);
  tcase_add_test(tc, test_nonfinite_values_are_not_saved);
  tcase_add_test(tc, test_empty_save_and_load_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
