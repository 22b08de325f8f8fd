/* A forced Init of a model that another live client's program uses is
 * refused, as drop-model is (an eval script's pe_client_init(force=true)
 * must not reset a colleague's model mid-training, the trainer told
 * nothing). PERMISSION_DENIED names the other
 * client's program and the override; pe_client_init_force_in_use resets
 * the model anyway; the trainer itself, alone on the model, may force. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_daemon.h"
#include "pe_client.h"
#include "pe_models.h"

#define ROWS 16

static uint64_t register_on(pe_client *c, const pe_model_spec *m, bool for_test) {
  pe_client_register_args a = {.program = m->bytes,
                               .program_len = m->len,
                               .model = "shared",
                               .places = "cpu:1",
                               .seed = 5,
                               .for_test = for_test};
  pe_client_program p;
  CD_OK(c, pe_client_register(c, &a, &p));
  return p.handle;
}

static void train_step(pe_client *c, const pe_model_spec *m, uint64_t h) {
  static float x[ROWS * 784];
  static int64_t y[ROWS];
  for (int i = 0; i < ROWS * 784; i++) x[i] = (float)((i * 37) % 101) / 101.f;
  for (int i = 0; i < ROWS; i++) y[i] = i % 10;
  pe_client_tensor f[2];
  pe_client_tensor_set(&f[0], m->image, PE_B_F32, 2, (int64_t[]){ROWS, 784}, x);
  pe_client_tensor_set(&f[1], m->label, PE_B_I64, 2, (int64_t[]){ROWS, 1}, y);
  const char *fetch[] = {m->loss};
  pe_client_run_result r;
  CD_OK(c, pe_client_run(c, h, f, 2, fetch, 1, NULL, &r));
}

/* A malloc'd copy of fc_0.b. */
static float *bias(pe_client *c) {
  const char *names[] = {"fc_0.b"};
  const pe_client_tensor *v;
  size_t n;
  CD_OK(c, pe_client_get_params(c, "shared", names, 1, &v, &n));
  ck_assert_uint_eq(v[0].nbytes, 256 * sizeof(float));
  float *b = malloc(v[0].nbytes);
  memcpy(b, v[0].data, v[0].nbytes);
  return b;
}

static bool same(const float *a, const float *b) {
  return !memcmp(a, b, 256 * sizeof(float));
}

START_TEST(test_forced_init_of_a_model_in_use) {
  char err[256];
  pe_model_spec m;
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  cd_daemon d;
  cd_start(&d);
  pe_client *A = cd_connect(&d), *B = cd_connect(&d);
  uint64_t ha = register_on(A, &m, false);
  bool ran = false;
  CD_OK(A, pe_client_init(A, ha, false, &ran));
  ck_assert(ran);
  float *fresh = bias(A);
  train_step(A, &m, ha);
  float *trained = bias(A);
  ck_assert(!same(fresh, trained));

  /* B's eval program of the model: a forced init is refused, naming A's
   * program and client, and changes nothing. */
  uint64_t hb = register_on(B, &m, true);
  int rc = pe_client_init(B, hb, true, &ran);
  char want[160];
  snprintf(want, sizeof want,
           "init: model 'shared' is in use by program 0x%016" PRIx64 " of client c-", ha);
  char id[20]; /* A's id is a credential: named by its tag only */
  snprintf(id, sizeof id, "%016" PRIx64, pe_client_id(A));
  const char *e = pe_client_error(B);
  ck_assert_msg(rc == PE_C_EPERM && strstr(e, want) && strstr(e, "force_in_use") && !strstr(e, id),
                "rc %d (%s): %s", rc, pe_client_code_name(rc), e);
  float *now = bias(B);
  ck_assert_msg(same(now, trained), "a refused forced init changed fc_0.b");
  free(now);
  /* Not forced: nothing to initialise, allowed. */
  CD_OK(B, pe_client_init(B, hb, false, &ran));
  ck_assert(!ran);

  /* The override resets it. */
  CD_OK(B, pe_client_init_force_in_use(B, hb, &ran));
  ck_assert(ran);
  now = bias(B);
  ck_assert_msg(same(now, fresh), "force_in_use did not reset fc_0.b");
  free(now);

  /* A alone on the model (B's session ended) may force. */
  train_step(A, &m, ha);
  CD_OK(B, pe_client_close(B));
  CD_OK(A, pe_client_init(A, ha, true, &ran));
  ck_assert(ran);

  free(fresh);
  free(trained);
  pe_client_free(A);
  pe_client_free(B);
  cd_stop(&d);
  pe_model_spec_release(&m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("init_in_use");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_forced_init_of_a_model_in_use);
  suite_add_tcase(s, tc);
  return s;
}

CD_CHECK_MAIN(suite)
