/* pe-executord end to end, a partial Init (a program registered under a
 * model's name adds persistables the model lacks, e.g. another optimizer's
 * state): it loses none of the steps another client is training meanwhile,
 * whose runs and the init interleave as they come (its weights and velocity
 * end bit for bit where a model trained alone with the same steps ends;
 * an init that read the model's values, ran the whole startup and wrote
 * them back would undo a run in between). A startup op that would
 * write a value the model has together with one it lacks is refused, naming
 * both. */
#include <math.h>
#include <pthread.h>

#include "check_main.h"
#include "ir/program.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define TRAINER 0x7A11
#define OTHER 0x0B0B
#define REQUESTS 120 /* of STEPS steps each */
#define STEPS 2
#define TRIALS 3

typedef struct trainer_arg {
  const dh_daemon *d;
  uint64_t handle;
  const char *loss;
  dh_batch *b;
  atomic_int done;  /* requests answered so far */
  atomic_int pause; /* the trainer waits before request `pause` until the init is sent (-1: none) */
  atomic_bool sent; /* the other client is sending its init */
  char error[512];  /* the first failure ("" when none) */
} trainer_arg;

/* The trainer's thread: its own socket, REQUESTS runs one after another. */
static void *trainer_main(void *p) {
  trainer_arg *a = p;
  int s = dh_connect(a->d, 30000);
  char *fl[] = {(char *)a->loss};
  for (int i = 0; i < REQUESTS && !a->error[0]; i++) {
    /* Hold here until the other client's register has returned, so that
     * its init, not a slow register on a loaded machine, meets the
     * requests still to come; then leave the init a little time per
     * request so that the runs do not all end before it is answered. */
    if (i == atomic_load(&a->pause))
      while (!atomic_load(&a->sent)) dh_sleep_ms(1);
    if (i > atomic_load(&a->pause) && atomic_load(&a->pause) >= 0) dh_sleep_ms(5);
    Pe__RunRequest run;
    Pe__Request rq = dh_run_req(TRAINER, &run, a->handle, a->b->feeds, 2, fl, 1, STEPS);
    Pe__Reply *rep = dh_call(s, &rq);
    if (!rep || rep->code)
      snprintf(a->error, sizeof a->error, "run %d: %s", i, rep ? rep->message : "no reply");
    if (rep) pe__reply__free_unpacked(rep, NULL);
    atomic_fetch_add(&a->done, 1);
  }
  nn_close(s);
  return NULL;
}

static void expect_same(int s, const char *model, const char *ref, const char *name) {
  size_t n1, n2;
  uint8_t *x = dh_get_param(s, OTHER, model, name, &n1);
  uint8_t *y = dh_get_param(s, OTHER, ref, name, &n2);
  ck_assert_uint_eq(n1, n2);
  ck_assert_msg(memcmp(x, y, n1) == 0,
                "%s: '%s' differs from the model trained alone: the init undid some of the "
                "trainer's steps",
                model, name);
  free(x);
  free(y);
}

START_TEST(test_init_during_training_loses_no_step) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 5);

  /* The reference: the trainer's steps alone. */
  char *w;
  uint64_t ref = dh_setup_model(s, OTHER, &mlp, "ref", 7, false, &w);
  for (int i = 0; i < REQUESTS; i++) dh_run_loss(s, OTHER, ref, &b, mlp.loss, STEPS);
  char velocity[256];
  snprintf(velocity, sizeof velocity, "%s@VELOCITY", w);

  Pe__OptimizerDesc od = PE__OPTIMIZER_DESC__INIT;
  od.type = "adamw";
  od.learning_rate = 0.1f; /* the mlp's: learning_rate is set again by the init */
  for (int t = 0; t < TRIALS; t++) {
    char model[16];
    snprintf(model, sizeof model, "race%d", t);
    dh_optimizer = NULL;
    uint64_t h = dh_setup_model(s, OTHER, &mlp, model, 7, false, NULL);
    trainer_arg a = {&d, h, mlp.loss, &b, 0, 10 + 30 * t, false, ""};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, trainer_main, &a), 0);
    /* Another client registers the model with adam's state and inits it
     * while the trainer is under way (at a different point each trial). */
    while (atomic_load(&a.done) < 10 + 30 * t && !a.error[0]) dh_sleep_ms(1);
    dh_optimizer = &od;
    uint64_t h2 = dh_register(s, OTHER, &mlp, model, 7, false, NULL, NULL);
    dh_optimizer = NULL;
    atomic_store(&a.sent, true);
    ck_assert(dh_init_ok(s, OTHER, h2));
    int at_init = atomic_load(&a.done);
    pthread_join(th, NULL);
    ck_assert_msg(!a.error[0], "%s", a.error);
    ck_assert_msg(at_init < REQUESTS, "the trainer was done before the init (%d requests)",
                  at_init);
    expect_same(s, model, "ref", w);
    expect_same(s, model, "ref", velocity);
  }
  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* The mlp with a startup op writing one of its 1-D parameters and a new
 * persistable together (clip_by_global_norm of two constants). */
static pe_model_spec mixed_spec(const pe_model_spec *mlp, char *bias, size_t n) {
  pe_program *prog;
  PE_CK_OK(pe_program_decode(mlp->bytes, mlp->len, &prog));
  pe_block *sb = pe_program_startup(prog);
  ck_assert_ptr_nonnull(sb);
  const pe_var_desc *b = NULL;
  for (int i = 0; i < sb->n_vars && !b; i++)
    if (sb->vars[i]->persistable && sb->vars[i]->shape.ndim == 1) b = sb->vars[i];
  ck_assert_ptr_nonnull(b);
  snprintf(bias, n, "%s", b->name);
  pe_shape bs = b->shape, one = {.ndim = 1, .d = {1}};
  pe_var_desc *v;
  PE_CK_OK(pe_block_add_var(sb, "mixed.tmp_b", PE_F32, &bs, &v));
  PE_CK_OK(pe_block_add_var(sb, "mixed.tmp_e", PE_F32, &one, &v));
  PE_CK_OK(pe_block_add_var(sb, "mixed.norm", PE_F32, &one, &v));
  PE_CK_OK(pe_block_add_var(sb, "mixed.extra", PE_F32, &one, &v));
  v->persistable = true;
  const char *tmp[] = {"mixed.tmp_b", "mixed.tmp_e"}, *out[] = {bias, "mixed.extra"};
  for (int k = 0; k < 2; k++) {
    pe_op_desc *f;
    PE_CK_OK(pe_block_append_op(sb, "fill_constant", &f));
    PE_CK_OK(pe_op_output1(f, "Out", tmp[k]));
    int64_t dim = k ? 1 : bs.d[0];
    PE_CK_OK(pe_op_set_ints(f, "shape", 1, &dim));
    PE_CK_OK(pe_op_set_float(f, "value", 1.0f));
  }
  pe_op_desc *c;
  PE_CK_OK(pe_block_append_op(sb, "clip_by_global_norm", &c));
  PE_CK_OK(pe_op_set_input(c, "X", 2, tmp));
  PE_CK_OK(pe_op_set_output(c, "Out", 2, out));
  PE_CK_OK(pe_op_output1(c, "GlobalNorm", "mixed.norm"));
  PE_CK_OK(pe_op_set_float(c, "max_norm", 1.0f));
  pe_model_spec spec = *mlp;
  PE_CK_OK(pe_program_encode(prog, &spec.bytes, &spec.len));
  pe_program_free(prog);
  return spec;
}

START_TEST(test_init_refuses_kept_and_missing_in_one_op) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  char bias[128];
  pe_model_spec mixed = mixed_spec(&mlp, bias, sizeof bias);
  uint64_t h = dh_setup_model(s, OTHER, &mlp, "mixed", 7, false, NULL);
  uint64_t h2 = dh_register(s, OTHER, &mixed, "mixed", 7, false, NULL, NULL);
  Pe__Reply *rep = dh_init(s, OTHER, h2);
  dh_err(rep, PE_EINVAL, "clip_by_global_norm");
  char want[300];
  snprintf(want, sizeof want,
           "writes '%s', which model 'mixed' has, and 'mixed.extra', which it lacks", bias);
  ck_assert_msg(strstr(rep->message, want), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);
  /* The model trains on; init with force initialises everything. */
  dh_batch b;
  dh_batch_make(&b, 8, 2);
  float loss = dh_run_loss(s, OTHER, h, &b, mlp.loss, 1);
  ck_assert(isfinite(loss));
  Pe__Request rq = dh_req(OTHER);
  Pe__InitRequest in = PE__INIT_REQUEST__INIT;
  in.handle = h2;
  in.force = true;
  rq.body_case = PE__REQUEST__BODY_INIT;
  rq.init = &in;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  dh_run_loss(s, OTHER, h2, &b, mlp.loss, 1);
  dh_batch_free(&b);
  free(mixed.bytes);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_partial_init");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_init_during_training_loses_no_step);
  tcase_add_test(tc, test_init_refuses_kept_and_missing_in_one_op);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
