/* pe-executord end to end, Register's options.optimizer: it replaces the
 * program's optimizer whole (weight decay and schedule included, refused as
 * decode refuses it), and a model registered again with another optimizer
 * keeps its trained weights and gets the new optimizer's state. Split from
 * test_daemon_basic.c (its helpers: daemon_basic.h). */
#include "check_main.h"
#include "daemon_basic.h"

/* Register's options.optimizer replaces the program's optimizer whole:
 * weight decay and learning-rate schedule included, checked as decode
 * checks them. The schedule's counter and rate are model state. */
START_TEST(test_register_optimizer_override) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  Pe__OptimizerDesc od;
  Pe__LrSchedule ls;
  dh_step_schedule(&od, &ls);
  dh_optimizer = &od;
  Pe__Reply *reg = NULL;
  uint64_t h = dh_register(s, CLIENT, &mlp, "sched", 7, false, NULL, &reg);
  bool listed = false;
  for (size_t i = 0; i < reg->register_->n_params; i++)
    listed |= !strcmp(reg->register_->params[i]->name, "@LR_DECAY_COUNTER@");
  ck_assert_msg(listed, "the step counter is not among the model's variables");
  char *w = dh_first_weight(reg);
  pe__reply__free_unpacked(reg, NULL);
  /* The same program with weight decay: another model, same seed. */
  od.weight_decay = 0.01f;
  uint64_t hd = dh_register(s, CLIENT, &mlp, "decayed", 7, false, NULL, NULL);
  /* adamw (decoupled decay, default coefficient): adam's state. */
  od.type = "adamw";
  od.weight_decay = 0.0f;
  uint64_t ha = dh_register(s, CLIENT, &mlp, "adamw", 7, false, NULL, &reg);
  char moment[256];
  snprintf(moment, sizeof moment, "%s@MOMENT1", w);
  listed = false;
  for (size_t i = 0; i < reg->register_->n_params; i++)
    listed |= !strcmp(reg->register_->params[i]->name, moment);
  ck_assert_msg(listed, "adamw: no %s among the model's variables", moment);
  pe__reply__free_unpacked(reg, NULL);
  od.type = "sgd";
  od.weight_decay = 0.01f;
  dh_optimizer = NULL;
  pe__reply__free_unpacked(dh_init(s, CLIENT, h), NULL);
  pe__reply__free_unpacked(dh_init(s, CLIENT, hd), NULL);
  pe__reply__free_unpacked(dh_init(s, CLIENT, ha), NULL);

  dh_batch b;
  dh_batch_make(&b, 16, 1);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 3); /* steps 0, 1, 2 */
  dh_run_loss(s, CLIENT, hd, &b, mlp.loss, 3);
  dh_run_loss(s, CLIENT, ha, &b, mlp.loss, 3);
  dh_expect_schedule(s, CLIENT, "sched", 3, 0.05f, "steps 0-2"); /* 0.1 * 0.5^(2 / 2) */
  dh_expect_schedule(s, CLIENT, "adamw", 3, 0.05f, "adamw steps 0-2");
  /* Weight decay was kept by the override: the same steps on the same
   * batch and initial values end elsewhere. */
  size_t n1, n2;
  uint8_t *w1 = dh_get_param(s, CLIENT, "sched", w, &n1);
  uint8_t *w2 = dh_get_param(s, CLIENT, "decayed", w, &n2);
  ck_assert_uint_eq(n1, n2);
  ck_assert_msg(memcmp(w1, w2, n1) != 0, "weight_decay in options.optimizer changed nothing");
  free(w1);
  free(w2);
  free(w);

  /* A bad schedule in the override: an error naming the field; the daemon
   * goes on serving. */
  ls.type = "cosine";
  ls.decay_steps = 0;
  Pe__Request rq = dh_req(CLIENT);
  Pe__RegisterRequest rr = PE__REGISTER_REQUEST__INIT;
  Pe__RegisterOptions opts = PE__REGISTER_OPTIONS__INIT;
  opts.optimizer = &od;
  rr.program.data = mlp.bytes;
  rr.program.len = mlp.len;
  rr.model = "bad";
  rr.options = &opts;
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &rr;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL,
         "register: options.optimizer: optimizer sgd: lr_schedule cosine: decay_steps must be > 0");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* The f32 scalar `name` of model `model`. */
static float get_scalar(int s, const char *model, const char *name) {
  size_t n;
  uint8_t *v = dh_get_param(s, CLIENT, model, name, &n);
  ck_assert_uint_eq(n, sizeof(float));
  float x;
  memcpy(&x, v, sizeof x);
  free(v);
  return x;
}

/* A model trained with one optimizer, then registered with another
 * (adamw through Register's options.optimizer) and initialised: the
 * startup runs for adam's new state, and the trained weights are kept, so
 * training goes on from them; learning_rate is the new program's. A second
 * init does nothing; a forced one re-initialises the weights too. */
START_TEST(test_new_optimizer_keeps_the_weights) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  char *w;
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "cont", 7, false, &w);
  dh_batch b;
  dh_batch_make(&b, 16, 1);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 3);
  size_t n1, n2;
  uint8_t *trained = dh_get_param(s, CLIENT, "cont", w, &n1);

  Pe__OptimizerDesc od = PE__OPTIMIZER_DESC__INIT;
  od.type = "adamw";
  od.learning_rate = 0.001f;
  dh_optimizer = &od;
  uint64_t ha = dh_register(s, CLIENT, &mlp, "cont", 7, false, NULL, NULL);
  dh_optimizer = NULL;
  ck_assert_uint_ne(ha, h);
  Pe__Reply *rep = dh_init(s, CLIENT, ha);
  dh_ok(rep);
  ck_assert(rep->init->initialized); /* adam's moments and powers were missing */
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *kept = dh_get_param(s, CLIENT, "cont", w, &n2);
  ck_assert_uint_eq(n1, n2);
  ck_assert_msg(memcmp(trained, kept, n1) == 0, "init of the adamw program reset '%s'", w);
  free(kept);
  ck_assert_float_eq(get_scalar(s, "cont", "learning_rate"), 0.001f);
  char name[256];
  snprintf(name, sizeof name, "%s@BETA1POW", w);
  ck_assert_float_eq(get_scalar(s, "cont", name), 0.9f);
  snprintf(name, sizeof name, "%s@MOMENT1", w);
  uint8_t *m1 = dh_get_param(s, CLIENT, "cont", name, &n2);
  ck_assert_uint_eq(n2, n1);
  for (size_t i = 0; i < n2; i++) ck_assert_msg(m1[i] == 0, "%s byte %zu is %d", name, i, m1[i]);
  free(m1);
  /* Training goes on with adamw from the trained weights. */
  dh_run_loss(s, CLIENT, ha, &b, mlp.loss, 1);
  kept = dh_get_param(s, CLIENT, "cont", w, &n2);
  ck_assert(memcmp(trained, kept, n1) != 0);
  free(kept);
  rep = dh_init(s, CLIENT, ha);
  dh_ok(rep);
  ck_assert(!rep->init->initialized); /* nothing missing now */
  pe__reply__free_unpacked(rep, NULL);
  /* force: everything from the startup, the weights included. */
  Pe__Request rq = dh_req(CLIENT);
  Pe__InitRequest in = PE__INIT_REQUEST__INIT;
  in.handle = ha;
  in.force = true;
  rq.body_case = PE__REQUEST__BODY_INIT;
  rq.init = &in;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert(rep->init->initialized);
  pe__reply__free_unpacked(rep, NULL);
  kept = dh_get_param(s, CLIENT, "cont", w, &n2);
  ck_assert(memcmp(trained, kept, n1) != 0);
  free(kept);
  free(trained);
  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_basic_optimizer");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_register_optimizer_override);
  tcase_add_test(tc, test_new_optimizer_keeps_the_weights);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
