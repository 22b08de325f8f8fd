/* libpeclient across daemon restarts: a request whose program the daemon
 * lost registers the program (and the handle's shared-memory regions)
 * again and is sent once more, applied at most once (client_recover.c).
 * The real pe-executord is stopped (SIGTERM) or killed (SIGKILL) and
 * started again on the same state directory, also while a run is in
 * flight (nanomsg then replays it to the new daemon). After pe_client_close
 * nothing is recovered. */
#include <pthread.h>

#include "check_main.h"
#include "ckpt_watch.h"
#include "client_daemon.h"
#include "daemon_harness.h"
#include "pe_client.h"
#include "test_assert.h"

#define MODEL "rec"
#define NO_AUTOSAVE "[state]\ncheckpoint_interval = 0\n"
#define AUTOSAVE "[state]\ncheckpoint_interval = 0.2\n"

typedef struct rig {
  dh_daemon d;
  const char *conf;
  pe_client *c;
  pe_model_spec mlp;
  bool persistent;
  uint64_t h;
  char *w; /* a weight's name */
  dh_batch b;
  pe_client_tensor feeds[2];
} rig;

static void rig_register(rig *x, pe_client *c, uint64_t *handle) {
  pe_client_register_args a = {.program = x->mlp.bytes,
                               .program_len = x->mlp.len,
                               .model = MODEL,
                               .seed = 5,
                               .persistent = x->persistent};
  pe_client_program p;
  CD_OK(c, pe_client_register(c, &a, &p));
  *handle = p.handle;
  for (size_t i = 0; !x->w && i < p.n_params; i++)
    if (p.params[i].ndim == 2 && p.params[i].shape[0] > 1) x->w = strdup(p.params[i].name);
}

static pe_client *rig_client(const rig *x, bool no_recover) {
  pe_client *c = pe_client_new();
  ck_assert_ptr_nonnull(c);
  pe_client_opts o = {.address = x->d.addr, .timeout_ms = 30000, .no_recover = no_recover};
  CD_OK(c, pe_client_connect(c, &o));
  return c;
}

static void rig_start(rig *x, const char *conf, bool persistent) {
  memset(x, 0, sizeof *x);
  x->conf = conf;
  x->persistent = persistent;
  dh_start(&x->d, conf);
  x->c = rig_client(x, false);
  x->mlp = dh_mlp();
  dh_batch_make(&x->b, 16, 3);
  pe_client_tensor_set(&x->feeds[0], "image", PE_B_F32, 2, x->b.image_shape, x->b.image);
  pe_client_tensor_set(&x->feeds[1], "label", PE_B_I64, 2, x->b.label_shape, x->b.label);
  rig_register(x, x->c, &x->h);
  CD_OK(x->c, pe_client_init(x->c, x->h, false, NULL));
}

static void rig_stop(rig *x) {
  pe_client_free(x->c);
  ck_assert_int_eq(dh_stop(&x->d, SIGTERM), 0);
  free(x->w);
  dh_batch_free(&x->b);
  pe_model_spec_release(&x->mlp);
  dh_cleanup(&x->d);
}

/* Stop the daemon with sig and start it again on the same state. */
static void rig_restart(rig *x, int sig) {
  int st = dh_stop(&x->d, sig);
  ck_assert(sig == SIGKILL ? WIFSIGNALED(st) : st == 0);
  dh_start(&x->d, x->conf);
}

static int rig_run(rig *x, uint32_t steps, pe_client_run_result *res) {
  pe_client_run_opts o = {.steps = steps};
  return pe_client_run(x->c, x->h, x->feeds, 2, NULL, 0, &o, res);
}

/* Steps for a run of about `seconds` in this build on this machine (a
 * sanitizer build is many times slower), timed on 200 steps. */
static uint32_t steps_lasting(rig *x, double seconds) {
  double t0 = dh_now();
  CD_OK(x->c, rig_run(x, 200, NULL));
  double per_step = (dh_now() - t0) / 200;
  double n = seconds / (per_step > 1e-6 ? per_step : 1e-6);
  return n < 1000 ? 1000 : n > 1e6 ? 1000000 : (uint32_t)n;
}

/* A malloc'd copy of the weight's bytes, through x->c. */
static uint8_t *rig_weight(rig *x, size_t *n) {
  const char *names[] = {x->w};
  const pe_client_tensor *v;
  size_t nv;
  CD_OK(x->c, pe_client_get_params(x->c, MODEL, names, 1, &v, &nv));
  ck_assert_int_eq((int)nv, 1);
  uint8_t *out = malloc(v[0].nbytes);
  memcpy(out, v[0].data, v[0].nbytes);
  *n = v[0].nbytes;
  return out;
}

static pe_client_recovery recovery(const rig *x) {
  pe_client_recovery r;
  pe_client_recovery_info(x->c, &r);
  return r;
}

static void copy_file(const char *from, const char *to) {
  uint8_t *buf;
  size_t len;
  pe_status *st = pe_read_file(from, (size_t)1 << 30, &buf, &len);
  ck_assert_msg(!st, "%s", st ? pe_status_msg(st) : "");
  FILE *f = fopen(to, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
  free(buf);
}

/* SIGTERM and a restart between two requests: the first request after it
 * (a GetParams by model name) registers the shm region and the program
 * again; the values are the ones before the restart, the restored record
 * includes the last run (nothing rolled back), and a run with feeds in the
 * region (its id from before the restart) trains on. */
START_TEST(test_recover_after_sigterm) {
  rig x;
  rig_start(&x, NO_AUTOSAVE, true);
  pe_client_shm shm;
  size_t isz = x.feeds[0].nbytes, lsz = x.feeds[1].nbytes;
  CD_OK(x.c, pe_client_shm_create(x.c, isz + lsz, &shm));
  memcpy(shm.base, x.b.image, isz);
  memcpy((char *)shm.base + isz, x.b.label, lsz);
  for (int i = 0; i < 3; i++) CD_OK(x.c, rig_run(&x, 2, NULL));
  uint64_t last_run = pe_client_last_request_id(x.c);
  size_t n;
  uint8_t *w1 = rig_weight(&x, &n);
  rig_restart(&x, SIGTERM);

  uint8_t *w2 = rig_weight(&x, &n);
  ck_assert_msg(memcmp(w1, w2, n) == 0, "%s not as before the restart", x.w);
  pe_client_recovery r = recovery(&x);
  ck_assert_uint_eq(r.recoveries, 1);
  ck_assert_uint_eq(r.handle, x.h);
  ck_assert_uint_eq(r.applied_request, last_run);
  ck_assert_uint_eq(r.applied_steps, 2);
  ck_assert_uint_eq(r.rolled_back_runs, 0);
  ck_assert_uint_eq(r.rolled_back_steps, 0);

  pe_client_tensor sf[2] = {x.feeds[0], x.feeds[1]};
  for (int k = 0; k < 2; k++) {
    sf[k].data = NULL;
    sf[k].shm_region = shm.region;
  }
  sf[1].shm_offset = isz;
  pe_client_run_result res;
  CD_OK(x.c, pe_client_run(x.c, x.h, sf, 2, NULL, 0, NULL, &res));
  ck_assert_uint_eq(res.steps, 1);
  uint8_t *w3 = rig_weight(&x, &n);
  ck_assert_msg(memcmp(w1, w3, n) != 0, "the run after the restart did not train %s", x.w);
  ck_assert_uint_eq(recovery(&x).recoveries, 1);
  pe_client_shm_close(x.c, &shm);
  free(w1);
  free(w2);
  free(w3);
  rig_stop(&x);
}
END_TEST

/* kill -9 after an autosave, with two answered runs after it: the restore
 * rolls them back; the recovery counts them (2 runs, 2 + 3 steps), and
 * the values are the autosave's. The autosaved file is put back after the
 * runs, as if the daemon had died before the next autosave. */
START_TEST(test_recover_rolled_back) {
  rig x;
  rig_start(&x, AUTOSAVE, true);
  CD_OK(x.c, rig_run(&x, 1, NULL));
  uint64_t r1 = pe_client_last_request_id(x.c);
  size_t n;
  uint8_t *w1 = rig_weight(&x, &n);
  cw_wait_autosaved(&x.d, MODEL, pe_client_id(x.c), r1);
  char path[512], kept[600];
  cw_path(&x.d, MODEL, path, sizeof path);
  snprintf(kept, sizeof kept, "%s.kept", path);
  copy_file(path, kept);
  CD_OK(x.c, rig_run(&x, 2, NULL));
  CD_OK(x.c, rig_run(&x, 3, NULL));
  ck_assert(WIFSIGNALED(dh_stop(&x.d, SIGKILL)));
  ck_assert_int_eq(rename(kept, path), 0);
  dh_start(&x.d, x.conf);

  uint8_t *w2 = rig_weight(&x, &n);
  ck_assert_msg(memcmp(w1, w2, n) == 0, "%s is not the autosaved value", x.w);
  pe_client_recovery r = recovery(&x);
  ck_assert_uint_eq(r.recoveries, 1);
  ck_assert_uint_eq(r.applied_request, r1);
  ck_assert_uint_eq(r.applied_steps, 1);
  ck_assert_uint_eq(r.rolled_back_runs, 2);
  ck_assert_uint_eq(r.rolled_back_steps, 5);
  CD_OK(x.c, rig_run(&x, 1, NULL));
  free(w2);
  w2 = rig_weight(&x, &n);
  ck_assert_msg(memcmp(w1, w2, n) != 0, "%s did not train after the recovery", x.w);
  free(w1);
  free(w2);
  rig_stop(&x);
}
END_TEST

/* The daemon is killed while a long run is in flight, before any
 * checkpoint includes it: nanomsg replays the run to the new daemon, which
 * lacks the program; the recovery sends it again and it runs in full. */
typedef struct killer {
  rig *x;
  int delay_ms;
  uint64_t client, request; /* request != 0: kill once an autosave has it */
  pe_run_origin seen;
} killer;

static void *kill_and_restart(void *arg) {
  killer *k = arg;
  if (k->request)
    k->seen = cw_wait_autosaved(&k->x->d, MODEL, k->client, k->request);
  else
    dh_sleep_ms(k->delay_ms);
  rig_restart(k->x, SIGKILL);
  return NULL;
}

START_TEST(test_recover_in_flight_resent) {
  rig x;
  rig_start(&x, NO_AUTOSAVE, true);
  uint32_t long_steps = steps_lasting(&x, 2.0);
  uint64_t r1 = pe_client_last_request_id(x.c);
  rig_restart(&x, SIGTERM); /* the restart checkpoint holds r1 */
  size_t n;
  free(rig_weight(&x, &n));              /* recovery 1 */
  killer k = {.x = &x, .delay_ms = 300}; /* a seventh of the run */
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, kill_and_restart, &k), 0);
  pe_client_run_result res;
  int rc = rig_run(&x, long_steps, &res);
  pthread_join(th, NULL);
  ck_assert_msg(rc == 0, "the long run: %s (%s)", pe_client_error(x.c), pe_client_code_name(rc));
  ck_assert_uint_eq(res.steps, long_steps);
  pe_client_recovery r = recovery(&x);
  ck_assert_msg(r.recoveries == 2, "%llu recoveries: the kill missed the long run",
                (unsigned long long)r.recoveries);
  ck_assert_uint_eq(r.applied_request, r1);
  ck_assert_uint_eq(r.rolled_back_runs, 0);
  rig_stop(&x);
}
END_TEST

/* Killed while the long run is in flight, after an autosave caught part
 * of it: the recovery finds the run in the restored parameters and does
 * not send it again (ALREADY_APPLIED); the values are the autosave's. */
START_TEST(test_recover_in_flight_already_applied) {
  rig x;
  rig_start(&x, AUTOSAVE, true);
  uint32_t long_steps = steps_lasting(&x, 4.0);
  killer k = {.x = &x, .client = pe_client_id(x.c)};
  k.request = pe_client_last_request_id(x.c) + 1; /* the long run's id */
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, kill_and_restart, &k), 0);
  int rc = rig_run(&x, long_steps, NULL);
  pthread_join(th, NULL);
  ck_assert_msg(rc == PE_C_EALREADY, "the long run: %s (%s)", pe_client_error(x.c),
                pe_client_code_name(rc));
  ck_assert_msg(strstr(pe_client_error(x.c), "is not applied again"), "%s", pe_client_error(x.c));
  pe_client_recovery r = recovery(&x);
  ck_assert_uint_eq(r.recoveries, 1);
  ck_assert_uint_eq(r.applied_request, k.request);
  ck_assert_uint_ge(r.applied_steps, k.seen.steps);
  ck_assert_uint_lt(r.applied_steps, long_steps);
  /* The values are the restored file's: the run was not applied again. */
  pe_run_origin o;
  uint8_t *file_w = NULL, *w;
  size_t fn = 0, n;
  ck_assert(cw_read(&x.d, MODEL, k.client, &o, x.w, &file_w, &fn));
  w = rig_weight(&x, &n);
  ck_assert_uint_eq(fn, n);
  ck_assert_msg(memcmp(file_w, w, n) == 0, "%s differs from the restored checkpoint's", x.w);
  CD_OK(x.c, rig_run(&x, 1, NULL)); /* the next request trains */
  free(file_w);
  free(w);
  rig_stop(&x);
}
END_TEST

/* A model that is not persistent does not come back: the recovery
 * registers the program again but does not run it on missing values, and
 * says so. A handle made with no_recover gets the daemon's NOT_FOUND. */
START_TEST(test_recover_not_persistent_and_off) {
  rig x;
  rig_start(&x, NO_AUTOSAVE, false);
  pe_client *plain = rig_client(&x, true);
  uint64_t h2;
  rig_register(&x, plain, &h2);
  ck_assert_uint_eq(h2, x.h);
  CD_OK(x.c, rig_run(&x, 1, NULL));
  rig_restart(&x, SIGTERM);

  int rc = pe_client_run(plain, h2, x.feeds, 2, NULL, 0, NULL, NULL);
  ck_assert_int_eq(rc, PE_C_ENOTFOUND);
  ck_assert_msg(strstr(pe_client_error(plain), "no such program"), "%s", pe_client_error(plain));
  pe_client_recovery r;
  pe_client_recovery_info(plain, &r);
  ck_assert_uint_eq(r.recoveries, 0);

  rc = rig_run(&x, 1, NULL);
  ck_assert_int_eq(rc, PE_C_ENOTFOUND);
  ck_assert_msg(strstr(pe_client_error(x.c),
                       "came back without parameters (the model is not "
                       "persistent); register and init it again"),
                "%s", pe_client_error(x.c));
  ck_assert_uint_eq(recovery(&x).recoveries, 1);
  /* Init through the recovered handle starts it afresh; runs work again. */
  CD_OK(x.c, pe_client_init(x.c, x.h, false, NULL));
  CD_OK(x.c, rig_run(&x, 1, NULL));
  pe_client_free(plain);
  rig_stop(&x);
}
END_TEST

/* pe_client_close ends the session: the daemon drops the handle's programs
 * (the non-persistent model with them) and the handle forgets them, so a
 * later run is not recovered (NOT_FOUND, no re-register); the handle is
 * usable again after a register and init (a fresh model). Twice is fine. */
START_TEST(test_close_forgets_programs) {
  rig x;
  rig_start(&x, NO_AUTOSAVE, false);
  CD_OK(x.c, rig_run(&x, 3, NULL));
  size_t n;
  uint8_t *trained = rig_weight(&x, &n);
  CD_OK(x.c, pe_client_close(x.c));
  CD_OK(x.c, pe_client_close(x.c));
  int rc = rig_run(&x, 1, NULL);
  ck_assert_int_eq(rc, PE_C_ENOTFOUND);
  ck_assert_msg(strstr(pe_client_error(x.c), "no such program"), "%s", pe_client_error(x.c));
  ck_assert_uint_eq(recovery(&x).recoveries, 0);
  pe_client_status st;
  CD_OK(x.c, pe_client_get_status(x.c, &st));
  ck_assert_int_eq(st.programs, 0);
  ck_assert_uint_eq(st.n_models, 0);

  uint64_t h;
  rig_register(&x, x.c, &h);
  ck_assert_uint_eq(h, x.h);
  bool initialized = false;
  CD_OK(x.c, pe_client_init(x.c, h, false, &initialized));
  ck_assert(initialized);
  uint8_t *fresh = rig_weight(&x, &n);
  ck_assert_msg(memcmp(fresh, trained, n) != 0, "the closed model's weights came back");
  CD_OK(x.c, rig_run(&x, 1, NULL));
  free(trained);
  free(fresh);
  rig_stop(&x);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_recover");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_recover_after_sigterm);
  tcase_add_test(tc, test_recover_rolled_back);
  tcase_add_test(tc, test_recover_in_flight_resent);
  tcase_add_test(tc, test_recover_in_flight_already_applied);
  tcase_add_test(tc, test_recover_not_persistent_and_off);
  tcase_add_test(tc, test_close_forgets_programs);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
