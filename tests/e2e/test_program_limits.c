/* pe-executord end to end: the size of one registered program is bounded
 * ([limits] max_program_ops and max_program_vars: a program over either is
 * refused before any compile pass, naming its count, the limit and the
 * key), and SIGTERM abandons a register that is compiling instead of
 * waiting for it (a large program compiled for minutes, and systemd would
 * SIGKILL the daemon before the persistent models' shutdown checkpoints):
 * the register gets "the daemon is shutting down", the daemon exits 0 at
 * once and the persistent model's checkpoint is written; the same while a
 * large register is being decoded. */
#include "async_call.h"
#include "check_main.h"
#include "daemon_harness.h"
#include "program.pb-c.h"

#define CLIENT 0x11a1

/* Ops and variables of the program bytes of spec, all blocks. */
static void program_size(const pe_model_spec *spec, size_t *ops, size_t *vars) {
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, spec->len, spec->bytes);
  ck_assert(pd != NULL);
  *ops = *vars = 0;
  for (size_t b = 0; b < pd->n_blocks; b++) {
    *ops += pd->blocks[b]->n_ops;
    *vars += pd->blocks[b]->n_vars;
  }
  pe__program_desc__free_unpacked(pd, NULL);
}

/* The mlp is refused by a daemon whose limit `key` is one under its count
 * of `what`, and registers where the limit equals the count. */
static void limit_case(const char *key, const char *what) {
  pe_model_spec mlp = dh_mlp();
  size_t ops, vars;
  program_size(&mlp, &ops, &vars);
  size_t n = !strcmp(what, "ops") ? ops : vars;
  char conf[128], want[160];
  snprintf(conf, sizeof conf, "[limits]\n%s = %zu\n", key, n - 1);
  snprintf(want, sizeof want,
           "program (%zu bytes): ProgramDesc: %zu %s in its 2 block(s), over "
           "the limit [limits] %s = %zu",
           mlp.len, n, what, key, n - 1);
  dh_daemon d = {0};
  dh_start(&d, conf);
  int s = dh_connect(&d, 30000);
  Pe__Reply *rep = dh_register_call(s, CLIENT, &mlp, "m", 1, false);
  dh_err(rep, PE_EINVAL, want);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  snprintf(conf, sizeof conf, "[limits]\n%s = %zu\n", key, n);
  dh_start(&d, conf);
  s = dh_connect(&d, 30000);
  dh_register(s, CLIENT, &mlp, "m", 1, false, NULL, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}

START_TEST(over_max_program_ops) {
  limit_case("max_program_ops", "ops");
}
END_TEST

START_TEST(over_max_program_vars) {
  limit_case("max_program_vars", "variables");
}
END_TEST

/* Each compile pass sleeps 700 ms (the daemon's test hook), so a register
 * of the mlp takes about 5 s: SIGTERM 1 s into one ends it before its next
 * pass, rather than waiting for the register to finish (here the
 * remaining 4 s; with a 200k-op program, more than 10 minutes). */
START_TEST(sigterm_abandons_a_register) {
  setenv("PE_TEST_PASS_DELAY_MS", "700", 1);
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_setup_model(s, CLIENT, &mlp, "kept", 1, true, NULL);
  nn_close(s);

  pe_model_spec wide = dh_mlp_wide();
  Pe__Request rq = dh_req(CLIENT);
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  reg.program.data = wide.bytes;
  reg.program.len = wide.len;
  reg.model = "slow";
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  dh_async x;
  dh_async_start(&x, &d, &rq);
  dh_sleep_ms(1000);

  double t0 = dh_now();
  int ws = dh_stop(&d, SIGTERM);
  double took = dh_now() - t0;
  ck_assert(dh_async_wait(&x, 5));
  ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "daemon wait status %d", ws);
  ck_assert_msg(took < 2.5, "SIGTERM took %.1f s with a register compiling", took);
  ck_assert_msg(x.rep != NULL, "no reply to the register");
  dh_err(x.rep, PE_EIO, "register: compile: the daemon is shutting down (SIGTERM/SIGINT)");
  ck_assert_msg(strstr(x.rep->message, "stopped before pass"), "%s", x.rep->message);
  char ckpt[512];
  snprintf(ckpt, sizeof ckpt, "%s/models/kept/shutdown.ckpt", d.state);
  ck_assert_msg(access(ckpt, F_OK) == 0, "%s not written", ckpt);
  snprintf(ckpt, sizeof ckpt, "%s/models/slow", d.state);
  ck_assert_msg(access(ckpt, F_OK) != 0, "%s: the abandoned register made a model", ckpt);

  pe__reply__free_unpacked(x.rep, NULL);
  free(x.buf);
  pe_model_spec_release(&wide);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* The work lane's busy threads, per Status (answered by a control
 * thread while the work lane is busy). */
static int work_busy(int s) {
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  int busy = -1;
  for (size_t i = 0; i < rep->status->n_lanes; i++)
    if (!strcmp(rep->status->lanes[i]->name, "work")) busy = rep->status->lanes[i]->busy;
  pe__reply__free_unpacked(rep, NULL);
  return busy;
}

/* A 1.9 MB register (one op of 80,000 attributes) and SIGTERM once the
 * daemon handles it: the daemon exits within seconds, with the persistent
 * model's shutdown checkpoint written. Its decode compared each attribute
 * name with every earlier one and never looked at SIGTERM: the shutdown
 * waited for it (60 s on a loaded machine). */
START_TEST(sigterm_during_a_large_register) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_setup_model(s, CLIENT, &mlp, "kept", 1, true, NULL);

  size_t len;
  uint8_t *prog = dh_program_of_attrs("relu", 1, 80000, &len);
  ck_assert_uint_gt(len, 1 << 20);
  Pe__RegisterRequest reg;
  Pe__Request rq = dh_register_req(CLIENT, &reg, prog, len, "large");
  dh_async x;
  dh_async_start(&x, &d, &rq);
  /* SIGTERM while a work thread has it, or once it is answered. */
  double t0 = dh_now();
  while (!atomic_load(&x.done) && work_busy(s) < 1 && dh_now() - t0 < 20) dh_sleep_ms(5);
  nn_close(s);

  t0 = dh_now();
  int ws = dh_stop(&d, SIGTERM);
  double took = dh_now() - t0;
  ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "daemon wait status %d", ws);
  ck_assert_msg(took < 5, "SIGTERM took %.1f s with a large register in the daemon", took);
  ck_assert(dh_async_wait(&x, 5));
  char ckpt[512];
  snprintf(ckpt, sizeof ckpt, "%s/models/kept/shutdown.ckpt", d.state);
  ck_assert_msg(access(ckpt, F_OK) == 0, "%s not written", ckpt);

  if (x.rep) pe__reply__free_unpacked(x.rep, NULL);
  free(x.buf);
  free(prog);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("program_limits");
  TCase *tc = tcase_create("limits");
  tcase_add_test(tc, over_max_program_ops);
  tcase_add_test(tc, over_max_program_vars);
  tcase_add_test(tc, sigterm_abandons_a_register);
  tcase_add_test(tc, sigterm_during_a_large_register);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
