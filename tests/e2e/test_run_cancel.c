/* pe-executord end to end: a run of many steps (RunRequest.steps, or one
 * step per mini-batch: RunRequest.batches) stops between two steps when the
 * daemon is stopped (SIGTERM: it exits 0 within seconds with the shutdown
 * checkpoint written, holding the steps done, and a resend of the run after
 * the restart is ALREADY_APPLIED naming them), when its program is
 * force-deregistered by another client, or when its client drops the
 * model; the reply says "run cancelled after N of M steps: <reason>", the
 * daemon stays up and other clients' runs go on. The N steps stay applied:
 * the model (when it outlives the cancel) holds the values of a model that
 * ran N steps on the same batch, a register names N steps of the request,
 * and Status counts N more steps run. Uncancelled, such a run would go on
 * to its millionth step (minutes) with SIGTERM waiting for it. While it runs,
 * Status (and pe-client status, text and --json) lists it: client, model,
 * program, steps done of STEPS (growing), age. */
#include <ctype.h>
#include <fcntl.h>
#include <sys/mman.h>

#include "async_call.h"
#include "check_main.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define CLIENT_A 0xca01
#define CLIENT_B 0xca02
#define CLIENT_C 0xca03
#define STEPS 1000000u

/* The long run, sent from its own thread and socket (async_call.h). */
typedef dh_async runner;

/* A batched run's feeds: STEPS mini-batches of one row of zeros, in a
 * shared-memory region of CLIENT_A (labels, then images: 3 GB of sparse
 * file, of which only the rows read before the cancel get pages), so that
 * the run, uncancelled, would last minutes like the STEPS-step one. */
typedef struct shm_feed {
  int64_t shape[2];
  Pe__ShmRef ref;
  Pe__Tensor t;
} shm_feed;

typedef struct shm_feeds {
  char name[64];
  shm_feed image, label;
  Pe__Tensor *feeds[2];
} shm_feeds;

/* Feed `name` [STEPS, cols] of dtype dt at bytes [offset, offset + length)
 * of the region. */
static void shm_feed_set(shm_feed *x, const char *name, Pe__DataType dt, int64_t cols,
                         uint64_t region, uint64_t offset, uint64_t length) {
  x->shape[0] = STEPS;
  x->shape[1] = cols;
  pe__shm_ref__init(&x->ref);
  x->ref.region = region;
  x->ref.offset = offset;
  x->ref.length = length;
  pe__tensor__init(&x->t);
  x->t.name = (char *)name;
  x->t.dtype = dt;
  x->t.n_shape = 2;
  x->t.shape = x->shape;
  x->t.shm = &x->ref;
}

static void shm_feeds_make(shm_feeds *f, int s) {
  memset(f, 0, sizeof *f);
  snprintf(f->name, sizeof f->name, "/pe-e2e-rc-%ld", (long)getpid());
  const uint64_t labels = (uint64_t)STEPS * sizeof(int64_t),
                 images = (uint64_t)STEPS * 784 * sizeof(float);
  int fd = shm_open(f->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  ck_assert_msg(fd >= 0, "shm_open %s: %s", f->name, strerror(errno));
  Pe__ShmRequest sr = PE__SHM_REQUEST__INIT;
  uint8_t token[PE_SHM_TOKEN_LEN];
  dh_shm_seal(fd, labels + images, token, &sr);
  close(fd);
  Pe__Request rq = dh_req(CLIENT_A);
  sr.name = f->name;
  sr.size = labels + images;
  rq.body_case = PE__REQUEST__BODY_REGISTER_SHM;
  rq.register_shm = &sr;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  uint64_t region = rep->shm->region;
  pe__reply__free_unpacked(rep, NULL);
  shm_unlink(f->name); /* the daemon's mapping stays; a failed test leaves no file */
  shm_feed_set(&f->image, "image", PE__DATA_TYPE__F32, 784, region, labels, images);
  shm_feed_set(&f->label, "label", PE__DATA_TYPE__I64, 1, region, 0, labels);
  f->feeds[0] = &f->image.t;
  f->feeds[1] = &f->label.t;
}

/* One mini-batch of the region's: one row of zeros. */
static void zero_batch(dh_batch *b) {
  dh_batch_make(b, 1, 0);
  memset(b->image, 0, sizeof(float) * 784);
  b->label[0] = 0;
}

/* Start a run of STEPS steps of handle h for CLIENT_A: on feeds STEPS
 * times (a batch), or, batched, one step per mini-batch of feeds (a
 * shm_feeds'). */
static void runner_start(runner *r, const dh_daemon *d, uint64_t h, Pe__Tensor **feeds,
                         bool batched, const char *loss) {
  Pe__RunRequest run;
  char *f[] = {(char *)loss};
  Pe__Request rq = dh_run_req(CLIENT_A, &run, h, feeds, 2, f, 1, batched ? 0 : STEPS);
  run.batches = batched ? STEPS : 0;
  dh_async_start(r, d, &rq);
}

/* Wait up to limit_s for the run's reply. */
static void runner_wait(runner *r, double limit_s) {
  ck_assert_msg(dh_async_wait(r, limit_s), "no reply to the long run within %.0f s of its cancel",
                limit_s);
  ck_assert_msg(r->rep != NULL, "the long run got no reply");
}

/* The reply says the run was cancelled for `why`; returns the steps done. */
static unsigned cancelled_steps(const Pe__Reply *rep, int code, const char *why) {
  dh_err(rep, code, "run cancelled after ");
  ck_assert_msg(strstr(rep->message, why), "'%s' not in: %s", why, rep->message);
  unsigned n = 0, m = 0;
  const char *p = strstr(rep->message, "run cancelled after ");
  ck_assert_int_eq(sscanf(p, "run cancelled after %u of %u steps", &n, &m), 2);
  ck_assert_uint_eq(m, STEPS);
  ck_assert_msg(n >= 1 && n < STEPS, "steps done %u", n);
  return n;
}

static Pe__Reply *status(int s) {
  Pe__Request rq = dh_req(CLIENT_C);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  return rep;
}

/* Status: the runs in flight, (runs_total) the steps run so far. */
static int runs_in_flight(int s, uint64_t *runs_total) {
  Pe__Reply *rep = status(s);
  int n = rep->status->runs_in_flight;
  ck_assert_int_eq((int)rep->status->n_runs, n);
  if (runs_total) *runs_total = rep->status->runs_total;
  pe__reply__free_unpacked(rep, NULL);
  return n;
}

/* Whether tag is a client tag: "c-" and 8 hex digits. */
static bool is_tag(const char *tag) {
  if (!tag || strncmp(tag, "c-", 2) || strlen(tag) != 10) return false;
  for (int i = 2; i < 10; i++)
    if (!isxdigit((unsigned char)tag[i])) return false;
  return true;
}

/* Status lists the one run in flight, CLIENT_A's of program h on model
 * "rc", STEPS steps asked for: *done of them, at *age s. CLIENT_C asks:
 * A's id is not shown (a bearer credential), its tag is; A itself gets its
 * id. */
static void the_run(int s, uint64_t h, uint32_t *done, double *age) {
  Pe__Reply *rep = status(s);
  const Pe__StatusReply *st = rep->status;
  ck_assert_int_eq(st->runs_in_flight, 1);
  ck_assert_int_eq((int)st->n_runs, 1);
  /* The run is in the queue depth too, which leaves out the Status itself. */
  ck_assert_int_eq(st->queue_depth, 1);
  const Pe__RunStatus *r = st->runs[0];
  ck_assert_uint_eq(r->client_id, 0);
  ck_assert_msg(is_tag(r->client), "client '%s'", r->client);
  ck_assert_str_eq(r->model, "rc");
  ck_assert_uint_eq(r->handle, h);
  ck_assert_uint_eq(r->steps_total, STEPS);
  ck_assert_msg(r->steps_done < STEPS && r->age_s > 0 && r->age_s < 10, "steps done %u, age %g s",
                r->steps_done, r->age_s);
  *done = r->steps_done;
  *age = r->age_s;
  pe__reply__free_unpacked(rep, NULL);
  Pe__Request rq = dh_req(CLIENT_A);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert_int_eq((int)rep->status->n_runs, 1);
  ck_assert_uint_eq(rep->status->runs[0]->client_id, CLIENT_A);
  pe__reply__free_unpacked(rep, NULL);
}

/* Status shows the run in flight within 5 s of its send; 200 ms later it
 * has done more steps and is older. */
static void wait_running(int s, uint64_t h) {
  double t0 = dh_now();
  while (runs_in_flight(s, NULL) != 1) {
    ck_assert_msg(dh_now() - t0 < 5, "status shows no run in flight");
    dh_sleep_ms(10);
  }
  uint32_t done0, done1;
  double age0, age1;
  the_run(s, h, &done0, &age0);
  dh_sleep_ms(200);
  the_run(s, h, &done1, &age1);
  ck_assert_msg(done1 > done0 && age1 >= age0 + 0.19, "steps done %u -> %u, age %g -> %g s", done0,
                done1, age0, age1);
}

/* pe-client status (text and --json) shows the run of program h. */
static void cli_shows_run(const dh_daemon *d, uint64_t h) {
  char want[160];
  for (int json = 0; json < 2; json++) {
    static char out[1 << 16];
    dh_cli(d, json ? "--json status" : "status", out, sizeof out);
    const char *key = json ? "\"runs\":[{\"client\":\"" : "  run of client ";
    const char *at = strstr(out, key);
    ck_assert_msg(at, "no run in: %s", out);
    char t[11]; /* the tag: CLIENT_A's id is not shown to another client */
    snprintf(t, sizeof t, "%s", at + strlen(key));
    ck_assert_msg(is_tag(t), "no client tag in: %s", out);
    if (json)
      snprintf(want, sizeof want,
               "\"runs\":[{\"client\":\"%s\",\"model\":\"rc\",\"handle\":\"0x%016llx\","
               "\"steps_done\":",
               t, (unsigned long long)h);
    else
      snprintf(want, sizeof want, "  run of client %s on model rc (program 0x%016llx): ", t,
               (unsigned long long)h);
    ck_assert_msg(strstr(out, want), "'%s' not in: %s", want, out);
    if (!json) {
      char of[32];
      snprintf(of, sizeof of, " of %u steps, ", STEPS);
      ck_assert_msg(strstr(strstr(out, want), of), "'%s' not in: %s", of, out);
    }
  }
}

/* Model `model` holds the values of a model of the same seed (3) that ran
 * n steps on batch b: the steps before a cancel stayed applied, no more. */
static void holds_steps(int s, const pe_model_spec *mlp, const char *model, unsigned n,
                        dh_batch *b) {
  uint64_t h = dh_setup_model(s, CLIENT_C, mlp, "ref", 3, false, NULL);
  dh_run_loss(s, CLIENT_C, h, b, mlp->loss, n);
  Pe__Reply *got = dh_get_all(s, CLIENT_C, model), *want = dh_get_all(s, CLIENT_C, "ref");
  const char *diff = dh_params_differ(want, got);
  ck_assert_msg(
      !diff, "model %s after a run cancelled after %u steps: '%s' differs from a model that ran %u",
      model, n, diff, n);
  pe__reply__free_unpacked(got, NULL);
  pe__reply__free_unpacked(want, NULL);
}

/* CLIENT_A registers model "rc" again: its values are there, and the
 * register names n steps of run r's request. */
static void reregister_names_steps(int s, const pe_model_spec *mlp, unsigned n) {
  Pe__Reply *reg;
  dh_register(s, CLIENT_A, mlp, "rc", 3, true, NULL, &reg);
  ck_assert(reg->register_->has_values);
  ck_assert_uint_eq(reg->register_->applied_steps, n);
  pe__reply__free_unpacked(reg, NULL);
}

/* A resend of run r: answered with `code` and a message naming `want`. */
static void resend(int s, const runner *r, int code, const char *want) {
  Pe__Reply *rep = dh_call_raw(s, r->buf, r->len);
  ck_assert(rep != NULL);
  dh_err(rep, code, want);
  pe__reply__free_unpacked(rep, NULL);
}

static void sigterm_case(bool batched) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT_A, &mlp, "rc", 3, true, NULL);
  dh_batch b;
  shm_feeds sf;
  if (batched) {
    zero_batch(&b);
    shm_feeds_make(&sf, s);
  } else {
    dh_batch_make(&b, 16, 3);
  }
  runner r;
  runner_start(&r, &d, h, batched ? sf.feeds : b.feeds, batched, mlp.loss);
  wait_running(s, h);
  nn_close(s);
  double t0 = dh_now();
  int ws = dh_stop(&d, SIGTERM);
  double took = dh_now() - t0;
  ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "daemon wait status %d", ws);
  ck_assert_msg(took < 5, "SIGTERM took %.1f s with a long run in flight", took);
  runner_wait(&r, 5);
  unsigned n = cancelled_steps(r.rep, PE_ESHUTDOWN, "the daemon is shutting down");
  pe__reply__free_unpacked(r.rep, NULL);
  char restart[512];
  snprintf(restart, sizeof restart, "%s/models/rc/shutdown.ckpt", d.state);
  ck_assert_msg(access(restart, F_OK) == 0, "%s not written", restart);

  /* The restart has the steps done, no more. */
  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  reregister_names_steps(s, &mlp, n);
  char want[64];
  snprintf(want, sizeof want, "(%u step(s) of it", n);
  resend(s, &r, PE_EALREADY, want); /* not applied again */
  holds_steps(s, &mlp, "rc", n, &b);
  free(r.buf);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}

START_TEST(sigterm_cancels_and_checkpoints) {
  sigterm_case(false);
}
END_TEST

START_TEST(sigterm_cancels_batches) {
  sigterm_case(true);
}
END_TEST

/* Another client's run on another model goes through. */
static void other_client_runs(int s, const pe_model_spec *mlp, dh_batch *b) {
  uint64_t h = dh_setup_model(s, CLIENT_C, mlp, "other", 5, false, NULL);
  float loss = dh_run_loss(s, CLIENT_C, h, b, mlp->loss, 3);
  ck_assert_msg(loss > 0 && loss < 100, "loss %g", loss);
}

/* A daemon running a long run (batched or not) of persistent model "rc"
 * for CLIENT_A; cancel_fx_cancel checks what any cancel by request must
 * leave. */
typedef struct cancel_fx {
  dh_daemon d;
  int s;
  pe_model_spec mlp;
  dh_batch b; /* the run's batch, or the region's mini-batch */
  shm_feeds sf;
  runner r;
  uint64_t h;
  uint64_t runs_total; /* before the run */
} cancel_fx;

static void cancel_fx_start(cancel_fx *f, bool batched) {
  memset(f, 0, sizeof *f);
  dh_start(&f->d, NULL);
  f->s = dh_connect(&f->d, 30000);
  f->mlp = dh_mlp();
  f->h = dh_setup_model(f->s, CLIENT_A, &f->mlp, "rc", 3, true, NULL);
  if (batched) {
    zero_batch(&f->b);
    shm_feeds_make(&f->sf, f->s);
  } else {
    dh_batch_make(&f->b, 16, 3);
  }
  runs_in_flight(f->s, &f->runs_total);
  runner_start(&f->r, &f->d, f->h, batched ? f->sf.feeds : f->b.feeds, batched, f->mlp.loss);
  wait_running(f->s, f->h);
  cli_shows_run(&f->d, f->h);
}

/* Send rq (a cancelling request) and expect it answered OK, then the run's
 * reply within 5 s: IO_ERROR naming `why`; the daemon stays up, no run is
 * left in flight, Status counts the steps done, and another client's run
 * goes through. Returns the steps done. */
static unsigned cancel_fx_cancel(cancel_fx *f, Pe__Request *rq, const char *why) {
  Pe__Reply *rep = dh_call(f->s, rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  runner_wait(&f->r, 5);
  unsigned n = cancelled_steps(f->r.rep, PE_EIO, why);
  pe__reply__free_unpacked(f->r.rep, NULL);
  ck_assert(dh_alive(&f->d));
  uint64_t total;
  ck_assert_int_eq(runs_in_flight(f->s, &total), 0);
  ck_assert_msg(total == f->runs_total + n, "Status runs_total %llu -> %llu after %u steps",
                (unsigned long long)f->runs_total, (unsigned long long)total, n);
  other_client_runs(f->s, &f->mlp, &f->b);
  return n;
}

static void cancel_fx_end(cancel_fx *f) {
  free(f->r.buf);
  nn_close(f->s);
  ck_assert_int_eq(dh_stop(&f->d, SIGTERM), 0);
  dh_batch_free(&f->b);
  pe_model_spec_release(&f->mlp);
  dh_cleanup(&f->d);
}

/* Another client force-deregisters the run's program: the persistent
 * model stays, with the steps done. */
static void deregister_case(bool batched) {
  cancel_fx f;
  cancel_fx_start(&f, batched);
  Pe__Request rq = dh_req(CLIENT_B);
  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  dr.handle = f.h;
  dr.force = true;
  rq.body_case = PE__REQUEST__BODY_DEREGISTER;
  rq.deregister = &dr;
  char why[64];
  snprintf(why, sizeof why, "program 0x%016llx was deregistered", (unsigned long long)f.h);
  unsigned n = cancel_fx_cancel(&f, &rq, why);
  reregister_names_steps(f.s, &f.mlp, n);
  /* The reply cache answers a resend with the cancel's reply. */
  resend(f.s, &f.r, PE_EIO, why);
  holds_steps(f.s, &f.mlp, "rc", n, &f.b);
  cancel_fx_end(&f);
}

START_TEST(force_deregister_cancels) {
  deregister_case(false);
}
END_TEST

START_TEST(force_deregister_cancels_batches) {
  deregister_case(true);
}
END_TEST

/* Its client drops the model (the model goes: the steps done show in
 * Status' count only). */
static void drop_case(bool batched) {
  cancel_fx f;
  cancel_fx_start(&f, batched);
  Pe__Request rq = dh_req(CLIENT_A);
  Pe__DropModelRequest dr = PE__DROP_MODEL_REQUEST__INIT;
  dr.model = (char *)"rc";
  rq.body_case = PE__REQUEST__BODY_DROP_MODEL;
  rq.drop_model = &dr;
  cancel_fx_cancel(&f, &rq, "model 'rc' is being dropped");
  cancel_fx_end(&f);
}

START_TEST(drop_model_cancels) {
  drop_case(false);
}
END_TEST

START_TEST(drop_model_cancels_batches) {
  drop_case(true);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("run_cancel");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, sigterm_cancels_and_checkpoints);
  tcase_add_test(tc, sigterm_cancels_batches);
  tcase_add_test(tc, force_deregister_cancels);
  tcase_add_test(tc, force_deregister_cancels_batches);
  tcase_add_test(tc, drop_model_cancels);
  tcase_add_test(tc, drop_model_cancels_batches);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
