/* pe-executord end to end, [limits]: an oversized message (max_message)
 * drops only its connection, and the daemon's log says so (naming the
 * limit) while clients that connect, ask and leave leave no such line;
 * max_programs refuses a new program until a
 * deregister frees a slot, and memory_per_client counts a client's
 * parameter bytes at register. Split from test_daemon_basic.c (its
 * helpers: daemon_basic.h). */
#include "check_main.h"
#include "daemon_basic.h"

/* Registering `mlp` as model `model` (default options) fails with code/needle. */
static void register_refused(int s, const pe_model_spec *mlp, const char *model, int code,
                             const char *needle) {
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  reg.program.data = mlp->bytes;
  reg.program.len = mlp->len;
  reg.model = (char *)model;
  register_fails(s, &reg, code, needle);
}

#define SILENT_ENDS "without delivering a request"

START_TEST(test_oversized) {
  dh_daemon d = {0};
  dh_start(&d, "[limits]\nmax_message = 64K\n");
  /* Clients that ask and leave: no warning (the tick runs every second). */
  for (int i = 0; i < 3; i++) {
    int s = dh_connect(&d, 5000);
    ck_assert(dh_ping(s));
    nn_close(s);
  }
  dh_sleep_ms(2500);
  ck_assert_msg(!dh_log_has(&d, SILENT_ENDS), "a warning about clients that delivered requests");
  /* nanomsg drops a message above NN_RCVMAXSIZE and the connection with it:
   * the sender gets no reply (the client library checks the size before
   * sending and reports it). The daemon must keep serving others. */
  int big = dh_connect(&d, 500);
  size_t n = 256 * 1024;
  uint8_t *buf = calloc(1, n);
  Pe__Reply *rep = dh_call_raw(big, buf, n);
  ck_assert_msg(rep == NULL, "an oversized request was answered");
  nn_close(big);
  free(buf);
  /* nanomsg says nothing; the daemon's log does, naming the limit. */
  double t0 = dh_now();
  while (!dh_log_has(&d, SILENT_ENDS) && dh_now() - t0 < 30) dh_sleep_ms(50);
  ck_assert_msg(dh_log_has(&d, SILENT_ENDS), "no warning about the dropped message (log %s)",
                d.log);
  ck_assert(dh_log_has(&d, "over [limits] max_message = 65536 bytes"));
  int s = dh_connect(&d, 5000);
  ck_assert(dh_ping(s));
  nn_close(s);
  ck_assert(dh_alive(&d));
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

START_TEST(test_limits) {
  dh_daemon d = {0};
  dh_start(&d, "[limits]\nmax_programs = 1\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_register(s, CLIENT, &mlp, "m1", 1, false, NULL, NULL);
  /* The same program again is not a new one. */
  ck_assert_uint_eq(dh_register(s, CLIENT, &mlp, "m1", 1, false, NULL, NULL), h);
  register_refused(s, &mlp, "m2", PE_EEXHAUSTED,
                   "limit max_programs = 1: retry later, or ask the admin to raise [limits] "
                   "max_programs");
  Pe__Request rq;
  Pe__Reply *rep;
  /* Deregister frees the slot. */
  rq = dh_req(CLIENT);
  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  dr.handle = h;
  rq.body_case = PE__REQUEST__BODY_DEREGISTER;
  rq.deregister = &dr;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  rep = dh_call(s, &rq); /* resend of the deregister: same (cached) answer */
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_DEREGISTER;
  rq.deregister = &dr;
  rep = dh_call(s, &rq); /* a new deregister of a gone handle */
  dh_err(rep, PE_ENOTFOUND, "no such program");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_uint_ne(dh_register(s, CLIENT, &mlp, "m2", 1, false, NULL, NULL), 0);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* memory_per_client counts the registering program's persistables (from
 * its declarations, before any Init): the MLP training program (1.9 MB
 * with its optimizer's state) is refused as the first program under a
 * 64 KiB limit, naming the model, the bytes and the limit. Under 2 MiB one
 * fits; an eval program of the same model adds nothing and is not counted
 * twice; a second model is refused before the first one's Init and after
 * it, while the existing program keeps working; another client is not
 * affected. */
START_TEST(test_memory_per_client) {
  dh_daemon d = {0};
  dh_start(&d, "[limits]\nmemory_per_client = 65536\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  Pe__Reply *rep = dh_register_call(s, CLIENT, &mlp, "m1", 1, false);
  dh_err(rep, PE_ENOMEM, "model 'm1': client c-");
  dh_err(rep, PE_ENOMEM, " holds 0 parameter bytes");
  ck_assert_ptr_nonnull(strstr(rep->message, "persistables of "));
  ck_assert_ptr_nonnull(strstr(rep->message, "over the limit memory_per_client = 65536"));
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  dh_start(&d, "[limits]\nmemory_per_client = 2M\n");
  s = dh_connect(&d, 30000);
  uint64_t h = dh_register(s, CLIENT, &mlp, "m1", 1, false, NULL, NULL);
  dh_for_test = true; /* an eval program: the training program's parameters, no optimizer state */
  dh_register(s, CLIENT, &mlp, "m1", 1, false, NULL, NULL);
  dh_for_test = false;
  register_refused(s, &mlp, "m2", PE_ENOMEM, "memory_per_client = 2097152");
  rep = dh_init(s, CLIENT, h);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  register_refused(s, &mlp, "m2", PE_ENOMEM, "model 'm2'");
  dh_batch b;
  dh_batch_make(&b, 16, 5);
  float loss = dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  ck_assert(loss > 0 && loss < 10);
  dh_batch_free(&b);
  /* Another client starts from zero bytes. */
  ck_assert_uint_ne(dh_register(s, CLIENT + 1, &mlp, "m3", 1, false, NULL, NULL), 0);
  ck_assert(dh_ping(s));
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_basic_limits");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_oversized);
  tcase_add_test(tc, test_limits);
  tcase_add_test(tc, test_memory_per_client);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
