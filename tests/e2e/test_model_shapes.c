/* pe-executord end to end, a model's shapes: a program registered under a
 * model name whose persistables have other shapes (or dtypes) than the
 * model's is refused at register, naming the model, the variable and both
 * shapes, whether the model has values (Init, SetParams, Load, a restart's
 * restore) or only another program's declarations; SetParams and Load
 * before Init are checked against the declarations; a restart checkpoint
 * that does not fit the program binding its model is refused and kept
 * byte for byte (also through the SIGTERM after). */
#include <fcntl.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT_A 0x5a01
#define CLIENT_B 0x5b02

/* Register must be refused with code, its message holding every needle
 * (NULL-terminated). */
static void register_refused(int s, uint64_t client, const pe_model_spec *spec, const char *model,
                             bool persistent, int code, const char *const *needles) {
  Pe__Reply *rep = dh_register_call(s, client, spec, model, 3, persistent);
  ck_assert_msg(rep->code == code, "register of %s under '%s': code %d (want %d): %s", spec->name,
                model, rep->code, code, rep->message);
  for (int i = 0; needles[i]; i++)
    ck_assert_msg(strstr(rep->message, needles[i]), "'%s' not in: %s", needles[i], rep->message);
  pe__reply__free_unpacked(rep, NULL);
}

static void close_session(int s, uint64_t client) {
  Pe__Request rq = dh_req(client);
  rq.body_case = PE__REQUEST__BODY_CLOSE;
  rq.close = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
}

static Pe__Reply *checkpoint(int s, bool save, const char *model, const char *name) {
  return dh_checkpoint(s, CLIENT_A, save, model, name);
}

static const char *const mismatch_784x256[] = {"fc_0.w", "[784,256]", "[784,512]", NULL};

/* A model with values (Init), one with only a program's declarations, and
 * a persistent one whose client has gone: a program of other shapes is
 * refused under each name; once a non-persistent model is gone, its name
 * is free for any shapes. */
START_TEST(test_register_other_shapes_refused) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp(), wide = dh_mlp_wide();

  char *w;
  uint64_t h = dh_setup_model(s, CLIENT_A, &mlp, "m", 3, false, &w);
  ck_assert_str_eq(w, "fc_0.w");
  const char *const with_model_m[] = {"model 'm'", "fc_0.w", "[784,256]", "[784,512]", NULL};
  register_refused(s, CLIENT_B, &wide, "m", false, PE_ESHAPE, with_model_m);
  /* The model kept its shapes and trains as before. */
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  float loss = dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 1);
  ck_assert(loss > 0 && loss < 10);
  size_t n;
  free(dh_get_param(s, CLIENT_A, "m", "fc_0.w", &n));
  ck_assert_uint_eq(n, 784 * 256 * 4);

  /* No values yet: the other program's declarations decide. */
  dh_register(s, CLIENT_A, &mlp, "n", 3, false, NULL, NULL);
  register_refused(s, CLIENT_B, &wide, "n", false, PE_ESHAPE, mismatch_784x256);
  /* ... either way round. */
  dh_register(s, CLIENT_B, &wide, "o", 3, false, NULL, NULL);
  const char *const o_needles[] = {"model 'o'", "fc_0.w", "[784,512]", "[784,256]", NULL};
  register_refused(s, CLIENT_A, &mlp, "o", false, PE_ESHAPE, o_needles);

  /* A persistent model whose only client has gone keeps its shapes. */
  dh_setup_model(s, CLIENT_B, &mlp, "p", 3, true, NULL);
  close_session(s, CLIENT_B);
  register_refused(s, CLIENT_A, &wide, "p", false, PE_ESHAPE, mismatch_784x256);

  /* A non-persistent model goes with its last client, and its name with it. */
  close_session(s, CLIENT_A);
  uint64_t hw = dh_setup_model(s, CLIENT_B, &wide, "m", 3, false, NULL);
  dh_run_loss(s, CLIENT_B, hw, &b, wide.loss, 1);
  free(dh_get_param(s, CLIENT_B, "m", "fc_0.w", &n));
  ck_assert_uint_eq(n, 784 * 512 * 4);

  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  pe_model_spec_release(&wide);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* Before Init, SetParams and Load are checked against the program's
 * declarations (before, any value went while the model had none, and every
 * run failed inside a kernel). */
START_TEST(test_set_and_load_before_init_checked) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp(), wide = dh_mlp_wide();
  /* A checkpoint of the wide model under the name "q". */
  dh_setup_model(s, CLIENT_B, &wide, "q", 3, false, NULL);
  Pe__Reply *rep = checkpoint(s, true, "q", "wide");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  close_session(s, CLIENT_B);

  dh_register(s, CLIENT_A, &mlp, "q", 3, false, NULL, NULL);
  size_t bytes = 784 * 512 * sizeof(float);
  float *zeros = calloc(1, bytes);
  Pe__Tensor t = PE__TENSOR__INIT;
  t.name = (char *)"fc_0.w";
  t.dtype = PE__DATA_TYPE__F32;
  int64_t shape[2] = {784, 512};
  t.n_shape = 2;
  t.shape = shape;
  t.data.data = (uint8_t *)zeros;
  t.data.len = bytes;
  Pe__Tensor *vals[] = {&t};
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  pr.model = (char *)"q";
  pr.n_values = 1;
  pr.values = vals;
  Pe__Request rq = dh_req(CLIENT_A);
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ESHAPE, "model 'q': 'fc_0.w' has shape [784,256], the value has [784,512]");
  pe__reply__free_unpacked(rep, NULL);
  /* The same dims as f64: a dtype mismatch. */
  t.dtype = PE__DATA_TYPE__F64;
  shape[1] = 256;
  rq = dh_req(CLIENT_A);
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EDTYPE, "model 'q': 'fc_0.w' is f32 [784,256], the value is f64 [784,256]");
  pe__reply__free_unpacked(rep, NULL);

  rep = checkpoint(s, false, "q", "wide");
  /* The file's first misfit in name order. */
  dh_err(rep, PE_ESHAPE, "model 'q': 'fc_0.b' has shape [256], the value has [512]");
  pe__reply__free_unpacked(rep, NULL);

  free(zeros);
  pe_model_spec_release(&mlp);
  pe_model_spec_release(&wide);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static uint8_t *read_all(const char *path, size_t *len) {
  uint8_t *buf;
  PE_CK_OK(pe_read_file(path, (size_t)1 << 30, &buf, len));
  return buf;
}

/* A persistent model's restart checkpoint that does not fit the program
 * registered after the restart: the register is refused naming the file,
 * nothing is restored or created, and the file stays byte for byte through
 * the SIGTERM after; the program it fits restores it. */
START_TEST(test_restart_checkpoint_of_other_shapes_refused) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp(), wide = dh_mlp_wide();
  uint64_t h = dh_setup_model(s, CLIENT_A, &mlp, "pm", 3, true, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 2);
  size_t n;
  uint8_t *w0 = dh_get_param(s, CLIENT_A, "pm", "fc_0.w", &n);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  char path[512];
  snprintf(path, sizeof path, "%s/models/pm/shutdown.ckpt", d.state);
  size_t len0;
  uint8_t *file0 = read_all(path, &len0);

  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  const char *const needles[] = {"model 'pm'", path,
                                 "'fc_0.b' has shape [256], the program declares [512]",
                                 "drop-model --model pm", NULL};
  register_refused(s, CLIENT_B, &wide, "pm", true, PE_ESHAPE, needles);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  size_t len1;
  uint8_t *file1 = read_all(path, &len1);
  ck_assert_msg(len1 == len0 && memcmp(file0, file1, len0) == 0, "%s changed", path);

  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  Pe__Reply *reg;
  h = dh_register(s, CLIENT_A, &mlp, "pm", 3, true, NULL, &reg);
  ck_assert(reg->register_->has_values);
  pe__reply__free_unpacked(reg, NULL);
  ck_assert(!dh_init_ok(s, CLIENT_A, h));
  uint8_t *w1 = dh_get_param(s, CLIENT_A, "pm", "fc_0.w", &n);
  ck_assert_msg(memcmp(w0, w1, n) == 0, "fc_0.w not restored");
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  free(w0);
  free(w1);
  free(file0);
  free(file1);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  pe_model_spec_release(&wide);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("model_shapes");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_register_other_shapes_refused);
  tcase_add_test(tc, test_set_and_load_before_init_checked);
  tcase_add_test(tc, test_restart_checkpoint_of_other_shapes_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
