/* Values for names the model does not know (a SetParams of a name no
 * program declared must not add a junk "parameter" to the model: a user
 * loading weights under a wrong name would train from the random init,
 * told OK). Once a program is registered:
 *   - SetParams of a name no program of the model declares, and the model
 *     does not hold, is refused (UNKNOWN_VARIABLE, naming it and some of the
 *     model's), with nothing of the request set;
 *   - Load of a checkpoint none of whose tensors the model knows (of
 *     another architecture) is refused alike; one that holds the model's
 *     variables and more (a training program's optimizer state, when only
 *     an eval program is registered now) loads all of them, and those names
 *     are then the model's. */
#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT 0x5e7a

/* SetParams of f32 values (names[i], n_i floats of v each) on model; the
 * reply. */
static Pe__Reply *set_f32(int s, const char *model, const char *const *names, const int64_t *len,
                          int n, float v) {
  Pe__Tensor t[4], *vals[4];
  float *data[4];
  ck_assert_int_le(n, 4);
  for (int i = 0; i < n; i++) {
    pe__tensor__init(&t[i]);
    data[i] = malloc(sizeof(float) * (size_t)len[i]);
    for (int64_t k = 0; k < len[i]; k++) data[i][k] = v;
    t[i].name = (char *)names[i];
    t[i].dtype = PE__DATA_TYPE__F32;
    t[i].n_shape = 1;
    t[i].shape = (int64_t *)&len[i];
    t[i].data.data = (uint8_t *)data[i];
    t[i].data.len = sizeof(float) * (size_t)len[i];
    vals[i] = &t[i];
  }
  Pe__Request rq = dh_req(CLIENT);
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  pr.model = (char *)model;
  pr.n_values = (size_t)n;
  pr.values = vals;
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  Pe__Reply *rep = dh_call(s, &rq);
  for (int i = 0; i < n; i++) free(data[i]);
  return rep;
}

/* A checkpoint `name` of model holding f32 tensors names[i] of len[i]
 * zeros, written into the daemon's state directory. */
static void write_ckpt(const dh_daemon *d, const char *model, const char *name,
                       const char *const *names, const int64_t *len, int n) {
  pe_ckpt_entry e[4] = {{0}};
  ck_assert_int_le(n, 4);
  for (int i = 0; i < n; i++) {
    e[i].name = (char *)names[i];
    pe_shape sh = PE_SHAPE(len[i]);
    PE_CK_OK(pe_tensor_resize(&e[i].t, PE_F32, &sh, names[i]));
    pe_tensor_zero(&e[i].t);
  }
  uint8_t *buf;
  size_t blen;
  PE_CK_OK(pe_ckpt_encode(e, n, NULL, &buf, &blen));
  char dir[400], file[128];
  snprintf(dir, sizeof dir, "%s/models/%s", d->state, model);
  snprintf(file, sizeof file, "%s.ckpt", name);
  PE_CK_OK(pe_mkdir_p(dir, 0750));
  PE_CK_OK(pe_write_atomic(dir, file, buf, blen));
  free(buf);
  for (int i = 0; i < n; i++) pe_tensor_release(&e[i].t);
}

START_TEST(test_unknown_names_refused) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_setup_model(s, CLIENT, &mlp, "names", 3, false, NULL);
  Pe__Reply *before = dh_get_all(s, CLIENT, "names");

  /* A typo alone, and beside a good name: refused, nothing set. */
  const char *typo[] = {"nosuch"};
  Pe__Reply *rep = set_f32(s, "names", typo, (int64_t[]){3}, 1, 1.f);
  dh_err(rep, PE_EUNKNOWN_VAR, "'nosuch' is not a variable of model 'names'");
  dh_err(rep, PE_EUNKNOWN_VAR, "no program of the model declares it (the model has fc_0.b, fc_0.w");
  pe__reply__free_unpacked(rep, NULL);
  const char *mixed[] = {"fc_0.b", "fc1.w"};
  rep = set_f32(s, "names", mixed, (int64_t[]){256, 4}, 2, 1.f);
  dh_err(rep, PE_EUNKNOWN_VAR, "'fc1.w' is not a variable of model 'names'");
  pe__reply__free_unpacked(rep, NULL);
  Pe__Reply *after = dh_get_all(s, CLIENT, "names");
  const char *changed = dh_params_differ(before, after);
  ck_assert_msg(!changed, "'%s' changed (or added) by a refused set_params", changed);
  pe__reply__free_unpacked(after, NULL);
  pe__reply__free_unpacked(before, NULL);
  /* A declared name alone is set. */
  rep = set_f32(s, "names", mixed, (int64_t[]){256}, 1, 1.f);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);

  /* Load: a file of another architecture is refused, nothing set. */
  const char *other[] = {"conv2d_0.w", "conv2d_0.b"};
  write_ckpt(&d, "names", "other", other, (int64_t[]){8, 2}, 2);
  before = dh_get_all(s, CLIENT, "names");
  rep = dh_checkpoint(s, CLIENT, false, "names", "other");
  dh_err(rep, PE_EUNKNOWN_VAR, "none of its 2 tensors ('conv2d_0.b', ...) is a variable of model");
  pe__reply__free_unpacked(rep, NULL);
  after = dh_get_all(s, CLIENT, "names");
  changed = dh_params_differ(before, after);
  ck_assert_msg(!changed, "'%s' changed (or added) by a refused load", changed);
  pe__reply__free_unpacked(before, NULL);
  pe__reply__free_unpacked(after, NULL);
  /* One with a variable of the model and more: every tensor loads, and the
   * extra name is the model's from then on. */
  const char *more[] = {"extra_state", "fc_0.b"};
  write_ckpt(&d, "names", "more", more, (int64_t[]){2, 256}, 2);
  rep = dh_checkpoint(s, CLIENT, false, "names", "more");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  size_t n;
  free(dh_get_param(s, CLIENT, "names", "extra_state", &n));
  ck_assert_uint_eq(n, 2 * sizeof(float));
  rep = set_f32(s, "names", more, (int64_t[]){2}, 1, 1.f);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);

  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("params_names");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_unknown_names_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
