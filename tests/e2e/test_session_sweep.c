/* pe-executord end to end, the session sweep: a session with a request in
 * flight is not idle, however long the request runs (the TTL counts from
 * its end); a session whose client process has exited (Request.client_pid
 * and client_start) ends within a sweep or two, as a close would, while a
 * live process's session, and one whose pid the daemon cannot see (another
 * pid namespace), keep theirs. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "shm_owner.h"
#include "test_assert.h"

#define CLIENT_A 0xA001
#define CLIENT_DEAD 0xD00D
#define CLIENT_ALIEN 0xA11E
#define CLIENT_STATUS 0x5005

/* Models present in a status reply: bit i set when names[i] is there. */
static unsigned models_present(int s, const char *const *names, int n, int *clients) {
  Pe__Request rq = dh_req(CLIENT_STATUS);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  unsigned bits = 0;
  for (size_t i = 0; i < rep->status->n_models; i++)
    for (int k = 0; k < n; k++)
      if (!strcmp(rep->status->models[i]->name, names[k])) bits |= 1u << k;
  if (clients) *clients = rep->status->clients;
  pe__reply__free_unpacked(rep, NULL);
  return bits;
}

/* A ping of client telling the daemon its process (pid, start). */
static void ping_as(int s, uint64_t client, long pid, uint64_t start) {
  Pe__Request rq = dh_req(client);
  rq.body_case = PE__REQUEST__BODY_PING;
  rq.ping = 1;
  rq.client_pid = (uint32_t)pid;
  rq.client_start = start;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
}

/* ttl = 1 and one run of ~4 s: the session and its model outlive the run;
 * idle afterwards, the session expires. The old daemon expired it while
 * the run was in flight and freed the model under it. */
START_TEST(test_in_flight_request_is_not_idle) {
  dh_daemon d = {0};
  dh_start(&d, "[sessions]\nttl = 1\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT_A, &mlp, "busy", 7, false, NULL);
  dh_batch b;
  dh_batch_make(&b, 64, 3);
  /* Steps for about 4 s on this machine (after a warm-up). */
  dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 20);
  double t0 = dh_now();
  dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 100);
  double per_step = (dh_now() - t0) / 100;
  uint32_t steps = (uint32_t)(4.0 / (per_step > 1e-6 ? per_step : 1e-6));
  if (steps > 1000000) steps = 1000000;
  const char *names[] = {"busy"};
  /* Over 2 s: a sweep (every second) came more than 1 s into the run; on a
   * loaded machine the calibration may be off: longer, then. */
  double took = 0;
  for (int round = 0; round < 4 && took <= 2.0; round++, steps *= 2) {
    t0 = dh_now();
    dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, steps);
    took = dh_now() - t0;
    ck_assert_msg(models_present(s, names, 1, NULL) == 1,
                  "model 'busy' gone after a %.1f s run with ttl = 1", took);
  }
  ck_assert_msg(took > 2.0, "the long run took %.2f s: too short to test a 1 s TTL", took);
  dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 1); /* the program is still there */
  /* Idle now: the TTL still ends the session (the sweep runs every second). */
  double until = dh_now() + 6;
  while (models_present(s, names, 1, NULL) && dh_now() < until) dh_sleep_ms(200);
  ck_assert_msg(!models_present(s, names, 1, NULL), "idle session not expired within 6 s");
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* A child process stands for a client (it sends nothing itself: its pid and
 * start time go with the requests made here). Killed with SIGKILL, its
 * session ends within seconds although the TTL is 600 s: its
 * non-persistent model goes and the name starts afresh; its persistent
 * model stays. Sessions of a live process, and of a pid not visible to the
 * daemon, stay. */
START_TEST(test_dead_client_process_ends_session) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    long pid;
    uint64_t start;
    pe_shm_owner_self(&pid, &start);
    if (write(fds[1], &start, sizeof start) != (ssize_t)sizeof start) _exit(1);
    for (;;) pause();
  }
  close(fds[1]);
  uint64_t child_start = 0;
  ck_assert_int_eq(read(fds[0], &child_start, sizeof child_start), (ssize_t)sizeof child_start);
  close(fds[0]);

  dh_daemon d = {0};
  dh_start(&d, "[sessions]\nttl = 600\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 5);
  ping_as(s, CLIENT_DEAD, child, child_start);
  uint64_t h = dh_setup_model(s, CLIENT_DEAD, &mlp, "orphan", 7, false, NULL);
  float fresh_loss = dh_run_loss(s, CLIENT_DEAD, h, &b, mlp.loss, 1);
  dh_run_loss(s, CLIENT_DEAD, h, &b, mlp.loss, 20); /* trained a little */
  dh_setup_model(s, CLIENT_DEAD, &mlp, "kept", 7, true, NULL);
  long self;
  uint64_t self_start;
  pe_shm_owner_self(&self, &self_start);
  ping_as(s, CLIENT_A, self, self_start);
  dh_setup_model(s, CLIENT_A, &mlp, "alive", 7, false, NULL);
  /* The child's pid with another start time: not this namespace's process. */
  ping_as(s, CLIENT_ALIEN, child, child_start + 1);
  dh_setup_model(s, CLIENT_ALIEN, &mlp, "alien", 7, false, NULL);
  const char *names[] = {"orphan", "kept", "alive", "alien"};
  int clients;
  ck_assert_uint_eq(models_present(s, names, 4, &clients), 0xf);

  ck_assert_int_eq(kill(child, SIGKILL), 0);
  ck_assert_int_eq(waitpid(child, NULL, 0), child);
  double until = dh_now() + 5;
  while ((models_present(s, names, 4, NULL) & 1) && dh_now() < until) dh_sleep_ms(100);
  int after;
  ck_assert_msg(models_present(s, names, 4, &after) == 0xe,
                "after the client process's SIGKILL: models %#x (want kept, alive, alien)",
                models_present(s, names, 4, NULL));
  ck_assert_int_eq(after, clients - 1);
  /* Two more sweeps: the live and the unseen processes keep their sessions. */
  dh_sleep_ms(2200);
  ck_assert_uint_eq(models_present(s, names, 4, NULL), 0xe);
  /* The name starts afresh: the first step's loss is a fresh model's. */
  Pe__Reply *reg;
  uint64_t h2 = dh_register(s, CLIENT_A, &mlp, "orphan", 7, false, NULL, &reg);
  ck_assert(!reg->register_->has_values);
  pe__reply__free_unpacked(reg, NULL);
  ck_assert(dh_init_ok(s, CLIENT_A, h2));
  float again = dh_run_loss(s, CLIENT_A, h2, &b, mlp.loss, 1);
  ck_assert_msg(again == fresh_loss, "first loss %.6f after the restart of the name, fresh %.6f",
                again, fresh_loss);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("session_sweep");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_in_flight_request_is_not_idle);
  tcase_add_test(tc, test_dead_client_process_ends_session);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
