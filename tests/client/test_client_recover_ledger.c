/* libpeclient's recovery bookkeeping against a scripted daemon (a nanomsg
 * REP socket in a thread of the test): which request ids go out, and the
 * count of rolled-back runs and steps, exactly, also past the 4096 answered
 * runs a program remembers and for a run only partly in the parameters,
 * and fail_on_rollback's refusal to send a run on rolled-back parameters.
 * The real daemon's side is in e2e.test_client_recover. */
#include <check.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "core/status.h"
#include "pe_client.h"
#include "service.pb-c.h"

#define HANDLE 0x5eedull

/* The script: while `lost`, a run gets NOT_FOUND (its id kept in
 * lost_request; with applied_lost the register reply then says it reached
 * the parameters); a register answers `applied` and ends the loss. */
typedef struct fake {
  int sock;
  bool lost, applied_lost;
  uint64_t applied;
  uint32_t applied_steps;
  uint64_t lost_request, register_request, last_run_request;
  int registers, runs;
} fake;

static void reply(fake *f, Pe__Reply *r) {
  size_t len = pe__reply__get_packed_size(r);
  uint8_t *buf = malloc(len);
  pe__reply__pack(r, buf);
  nn_send(f->sock, buf, len, 0);
  free(buf);
}

static void *serve(void *arg) {
  fake *f = arg;
  for (;;) {
    void *msg = NULL;
    int n = nn_recv(f->sock, &msg, NN_MSG, 0);
    if (n < 0) return NULL; /* closed by the test */
    Pe__Request *q = pe__request__unpack(NULL, (size_t)n, msg);
    nn_freemsg(msg);
    Pe__Reply r = PE__REPLY__INIT;
    r.client_id = q->client_id;
    r.request_id = q->request_id;
    Pe__RegisterReply rr = PE__REGISTER_REPLY__INIT;
    Pe__RunReply run = PE__RUN_REPLY__INIT;
    if (q->body_case == PE__REQUEST__BODY_REGISTER) {
      f->registers++;
      f->register_request = q->request_id;
      rr.handle = HANDLE;
      rr.has_values = true;
      rr.applied_request = f->applied_lost ? f->lost_request : f->applied;
      rr.applied_steps = f->applied_steps;
      f->lost = false;
      r.body_case = PE__REPLY__BODY_REGISTER;
      r.register_ = &rr;
    } else if (f->lost) {
      f->lost_request = q->request_id;
      r.code = PE_ENOTFOUND;
      r.message = (char *)"run: handle 0x0000000000005eed: no such program";
    } else {
      f->runs++;
      f->last_run_request = q->request_id;
      run.steps = q->run->steps ? q->run->steps : 1;
      r.body_case = PE__REPLY__BODY_RUN;
      r.run = &run;
    }
    reply(f, &r);
    pe__request__free_unpacked(q, NULL);
  }
}

typedef struct rig {
  char dir[48], addr[96];
  fake f;
  pthread_t th;
  pe_client *c;
} rig;

static void rig_start(rig *x, bool no_recover, bool fail_on_rollback) {
  memset(x, 0, sizeof *x);
  snprintf(x->dir, sizeof x->dir, "/tmp/pe-ledger-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(x->dir));
  snprintf(x->addr, sizeof x->addr, "ipc://%s/d.sock", x->dir);
  x->f.sock = nn_socket(AF_SP, NN_REP);
  ck_assert_int_ge(nn_bind(x->f.sock, x->addr), 0);
  ck_assert_int_eq(pthread_create(&x->th, NULL, serve, &x->f), 0);
  x->c = pe_client_new();
  pe_client_opts o = {.address = x->addr,
                      .timeout_ms = 5000,
                      .no_recover = no_recover,
                      .fail_on_rollback = fail_on_rollback};
  ck_assert_int_eq(pe_client_connect(x->c, &o), 0);
  static const uint8_t program[] = {1, 2, 3};
  pe_client_register_args a = {
      .program = program, .program_len = sizeof program, .model = "m", .persistent = true};
  pe_client_program p;
  ck_assert_int_eq(pe_client_register(x->c, &a, &p), 0);
  ck_assert_uint_eq(p.handle, HANDLE);
}

static void rig_stop(rig *x) {
  pe_client_free(x->c);
  nn_close(x->f.sock); /* ends serve's nn_recv */
  pthread_join(x->th, NULL);
  char path[128];
  snprintf(path, sizeof path, "%s/d.sock", x->dir);
  unlink(path);
  rmdir(x->dir);
}

static int run(rig *x, uint32_t steps) {
  pe_client_run_opts o = {.steps = steps};
  return pe_client_run(x->c, HANDLE, NULL, 0, NULL, 0, &o, NULL);
}

/* 5000 answered runs of 2 steps (ids 2..5001; the newest 4096, 906..5001,
 * are remembered). A loss restoring request 4991 with 1 of its 2 steps:
 * 10 runs and 21 steps rolled back, and the lost run goes out again under
 * a new id after the register. A second loss restoring request 100: every
 * remembered run newer than it, 4086 + the resent one. */
START_TEST(rolled_back_runs_and_steps_are_counted_exactly) {
  rig x;
  rig_start(&x, false, false);
  for (int i = 0; i < 5000; i++) ck_assert_int_eq(run(&x, 2), 0);
  ck_assert_uint_eq(x.f.last_run_request, 5001);
  x.f.lost = true;
  x.f.applied = 4991;
  x.f.applied_steps = 1;
  ck_assert_int_eq(run(&x, 2), 0);
  ck_assert_uint_eq(x.f.lost_request, 5002);
  ck_assert_uint_eq(x.f.register_request, 5003);
  ck_assert_uint_eq(x.f.last_run_request, 5004);
  pe_client_recovery r;
  pe_client_recovery_info(x.c, &r);
  ck_assert_uint_eq(r.recoveries, 1);
  ck_assert_uint_eq(r.handle, HANDLE);
  ck_assert_uint_eq(r.applied_request, 4991);
  ck_assert_uint_eq(r.rolled_back_runs, 10);
  ck_assert_uint_eq(r.rolled_back_steps, 21);
  ck_assert(r.rolled_back_exact);

  x.f.lost = true;
  x.f.applied = 100;
  x.f.applied_steps = 2;
  ck_assert_int_eq(run(&x, 2), 0);
  pe_client_recovery_info(x.c, &r);
  ck_assert_uint_eq(r.recoveries, 2);
  ck_assert_uint_eq(r.rolled_back_runs, 4087);
  ck_assert_uint_eq(r.rolled_back_steps, 4085 * 2 + 1 + 2);
  ck_assert(!r.rolled_back_exact); /* runs 101..905 were forgotten */
  ck_assert_int_eq(x.f.runs, 5002);
  rig_stop(&x);
}
END_TEST

/* The lost run itself is in the restored parameters: ALREADY_APPLIED, the
 * message names the request and its steps, and it is not sent again. */
START_TEST(a_run_already_in_the_parameters_is_not_sent_again) {
  rig x;
  rig_start(&x, false, false);
  ck_assert_int_eq(run(&x, 3), 0);
  x.f.lost = true;
  x.f.applied_lost = true;
  x.f.applied_steps = 2;
  int rc = run(&x, 3);
  ck_assert_int_eq(rc, PE_C_EALREADY);
  ck_assert_str_eq(pe_client_error(x.c),
                   "run: request 3 reached model 'm' before the daemon lost program "
                   "0x0000000000005eed (2 step(s) of it are in the restored parameters); it is not "
                   "applied again and its fetches are lost");
  ck_assert_int_eq(x.f.runs, 1);
  pe_client_recovery r;
  pe_client_recovery_info(x.c, &r);
  ck_assert_uint_eq(r.applied_request, 3);
  ck_assert_uint_eq(r.rolled_back_runs, 0);
  ck_assert_uint_eq(r.rolled_back_steps, 0);
  ck_assert_int_eq(run(&x, 1), 0); /* the next one goes out */
  ck_assert_uint_eq(x.f.last_run_request, 5);
  rig_stop(&x);
}
END_TEST

/* With fail_on_rollback a lost run is not sent on top of parameters that
 * lack answered runs: ROLLED_BACK, with the counts, and the caller goes on
 * from there. With nothing rolled back it is sent as usual. */
START_TEST(fail_on_rollback_stops_the_lost_run) {
  rig x;
  rig_start(&x, false, true);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(run(&x, 2), 0); /* ids 2, 3, 4 */
  x.f.lost = true;
  x.f.applied = 2;
  x.f.applied_steps = 2;
  ck_assert_int_eq(run(&x, 2), PE_C_EROLLEDBACK);
  ck_assert_str_eq(pe_client_error(x.c),
                   "run: request 5 not sent: the daemon lost program 0x0000000000005eed and model "
                   "'m' came back from a checkpoint without 2 answered request(s), 4 step(s), of "
                   "this client's");
  ck_assert_str_eq(pe_client_code_name(PE_C_EROLLEDBACK), "ROLLED_BACK");
  ck_assert_int_eq(x.f.runs, 3);
  pe_client_recovery r;
  pe_client_recovery_info(x.c, &r);
  ck_assert_uint_eq(r.applied_request, 2);
  ck_assert_uint_eq(r.rolled_back_steps, 4);
  ck_assert(r.rolled_back_exact);
  ck_assert_int_eq(run(&x, 2), 0); /* the caller repeats: it goes out */
  ck_assert_uint_eq(x.f.last_run_request, 7);

  x.f.lost = true; /* restored with every answered run: sent again */
  x.f.applied = 7;
  x.f.applied_steps = 2;
  ck_assert_int_eq(run(&x, 2), 0);
  ck_assert_uint_eq(x.f.lost_request, 8);
  ck_assert_uint_eq(x.f.last_run_request, 10);
  ck_assert_int_eq(x.f.runs, 5);
  rig_stop(&x);
}
END_TEST

/* With no_recover the daemon's NOT_FOUND comes back as it is. */
START_TEST(no_recover_returns_not_found) {
  rig x;
  rig_start(&x, true, false);
  x.f.lost = true;
  ck_assert_int_eq(run(&x, 1), PE_C_ENOTFOUND);
  ck_assert_str_eq(pe_client_error(x.c), "run: handle 0x0000000000005eed: no such program");
  ck_assert_int_eq(x.f.registers, 1); /* rig_start's */
  pe_client_recovery r;
  pe_client_recovery_info(x.c, &r);
  ck_assert_uint_eq(r.recoveries, 0);
  rig_stop(&x);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_recover_ledger");
  TCase *tc = tcase_create("ledger");
  tcase_add_test(tc, rolled_back_runs_and_steps_are_counted_exactly);
  tcase_add_test(tc, a_run_already_in_the_parameters_is_not_sent_again);
  tcase_add_test(tc, fail_on_rollback_stops_the_lost_run);
  tcase_add_test(tc, no_recover_returns_not_found);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
