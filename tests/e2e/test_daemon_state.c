/* pe-executord end to end, state: resends applied once, get/set params,
 * save/load (bitwise, names validated), kill -9 + restart + load, SIGTERM
 * checkpoints persistent models, two clients at once, session expiry,
 * shared-memory feeds. */
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT 0x2002

static Pe__Reply *checkpoint(int s, bool save, const char *model, const char *name) {
  return dh_checkpoint(s, CLIENT, save, model, name);
}

/* Resend: the same (client, request) id twice, sequentially and while the
 * first is in flight: one reply, applied once. */
START_TEST(test_resend_applied_once) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  char *w;
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "m", 3, false, &w);
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  size_t n;
  uint8_t *w0 = dh_get_param(s, CLIENT, "m", w, &n);

  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fl, 1, 1);
  Pe__Reply *r1 = dh_call(s, &rq);
  dh_ok(r1);
  uint8_t *w1 = dh_get_param(s, CLIENT, "m", w, &n);
  ck_assert_msg(memcmp(w0, w1, n) != 0, "the run did not change %s", w);
  Pe__Reply *r2 = dh_call(s, &rq); /* resend */
  dh_ok(r2);
  ck_assert_int_eq(memcmp(r1->run->fetched[0]->data.data, r2->run->fetched[0]->data.data, 4), 0);
  uint8_t *w2 = dh_get_param(s, CLIENT, "m", w, &n);
  ck_assert_msg(memcmp(w1, w2, n) == 0, "the resend was applied again to %s", w);
  pe__reply__free_unpacked(r1, NULL);
  pe__reply__free_unpacked(r2, NULL);

  /* In flight: two connections send the same id of a longer run. */
  int s2 = dh_connect(&d, 30000);
  rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fl, 1, 20);
  size_t len = pe__request__get_packed_size(&rq);
  uint8_t *buf = malloc(len);
  pe__request__pack(&rq, buf);
  ck_assert_int_ge(nn_send(s, buf, len, 0), 0);
  ck_assert_int_ge(nn_send(s2, buf, len, 0), 0);
  void *a = NULL, *c = NULL;
  int na = nn_recv(s, &a, NN_MSG, 0), nc = nn_recv(s2, &c, NN_MSG, 0);
  ck_assert_int_gt(na, 0);
  ck_assert_int_eq(na, nc);
  ck_assert_msg(memcmp(a, c, (size_t)na) == 0, "the two copies got different replies");
  Pe__Reply *ra = pe__reply__unpack(NULL, (size_t)na, a);
  dh_ok(ra);
  ck_assert_uint_eq(ra->run->steps, 20);
  pe__reply__free_unpacked(ra, NULL);
  nn_freemsg(a);
  nn_freemsg(c);
  free(buf);
  /* Applied once: 20 steps, not 40, on top of the 1 + 0 before. */
  rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *st = dh_call(s, &rq);
  dh_ok(st);
  ck_assert_uint_eq(st->status->runs_total, 21);
  /* Its counters: the sequential resend was answered from the cache; the
   * second in-flight copy was parked behind the first (or, had the first
   * finished before it was looked at, answered from the cache). */
  ck_assert_uint_ge(st->status->resends_answered, 1);
  ck_assert_uint_eq(st->status->resends_answered + st->status->resends_waited, 2);
  ck_assert_uint_eq(st->status->resends_stale, 0);
  ck_assert_uint_ge(st->status->reply_cache_entries, 3);
  ck_assert_uint_gt(st->status->reply_cache_bytes, 0);
  pe__reply__free_unpacked(st, NULL);

  free(w0);
  free(w1);
  free(w2);
  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  nn_close(s2);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

START_TEST(test_params_and_checkpoints) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  char *w;
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "m", 5, false, &w);
  dh_batch b;
  dh_batch_make(&b, 16, 5);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 2);
  size_t n;
  uint8_t *w0 = dh_get_param(s, CLIENT, "m", w, &n);

  Pe__Reply *rep = checkpoint(s, true, "m", "ck-1");
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_CHECKPOINT);
  ck_assert_msg(strstr(rep->checkpoint->path, d.state) == rep->checkpoint->path, "%s",
                rep->checkpoint->path);
  ck_assert_uint_gt(rep->checkpoint->bytes, n);
  pe__reply__free_unpacked(rep, NULL);

  /* SetParams: zeros, read back. */
  Pe__Request rq = dh_req(CLIENT);
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  Pe__Tensor t = PE__TENSOR__INIT;
  uint8_t *zeros = calloc(1, n);
  t.name = w;
  t.dtype = PE__DATA_TYPE__F32;
  int64_t shape[2] = {784, 256};
  t.n_shape = 2;
  t.shape = shape;
  t.data.data = zeros;
  t.data.len = n;
  ck_assert_uint_eq(n, 784 * 256 * 4);
  Pe__Tensor *vals[] = {&t};
  pr.model = (char *)"m";
  pr.n_values = 1;
  pr.values = vals;
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *wz = dh_get_param(s, CLIENT, "m", w, &n);
  ck_assert_int_eq(memcmp(wz, zeros, n), 0);
  /* A wrong shape is refused, naming the variable. */
  int64_t bad[2] = {256, 784};
  t.shape = bad;
  rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ESHAPE, w);
  pe__reply__free_unpacked(rep, NULL);

  /* Load restores the saved bits. */
  rep = checkpoint(s, false, "m", "ck-1");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *wl = dh_get_param(s, CLIENT, "m", w, &n);
  ck_assert_msg(memcmp(wl, w0, n) == 0, "load did not restore %s bitwise", w);

  /* Load is all or nothing: a file whose second tensor does not fit the
   * model leaves the first one (which would fit) unapplied. */
  {
    pe_ckpt_entry e[2] = {{0}};
    e[0].name = w;
    pe_shape ws = PE_SHAPE(784, 256), ls = PE_SHAPE(2);
    PE_CK_OK(pe_tensor_resize(&e[0].t, PE_F32, &ws, w));
    pe_tensor_zero(&e[0].t);
    e[1].name = (char *)"learning_rate"; /* sorts after fc_*: written second */
    PE_CK_OK(pe_tensor_resize(&e[1].t, PE_F32, &ls, "learning_rate"));
    pe_tensor_zero(&e[1].t);
    uint8_t *fb;
    size_t fl;
    PE_CK_OK(pe_ckpt_encode(e, 2, NULL, &fb, &fl));
    char dir[400];
    snprintf(dir, sizeof dir, "%s/models/m", d.state);
    PE_CK_OK(pe_write_atomic(dir, "mismatch.ckpt", fb, fl));
    free(fb);
    pe_tensor_release(&e[0].t);
    pe_tensor_release(&e[1].t);
    rep = checkpoint(s, false, "m", "mismatch");
    dh_err(rep, PE_ESHAPE, "learning_rate");
    pe__reply__free_unpacked(rep, NULL);
    uint8_t *wm = dh_get_param(s, CLIENT, "m", w, &n);
    ck_assert_msg(memcmp(wm, w0, n) == 0, "a failed load changed %s", w);
    free(wm);
  }

  /* Names are validated: nothing outside the state dir, no hidden files. */
  const char *bad_names[] = {
      "../x",
      "..",
      ".hidden",
      "a/b",
      "",
      "x y",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
  for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
    rep = checkpoint(s, true, "m", bad_names[i]);
    dh_err(rep, PE_EINVAL, "checkpoint name");
    pe__reply__free_unpacked(rep, NULL);
  }
  char path[512];
  snprintf(path, sizeof path, "%s/models/x.ckpt", d.state);
  ck_assert_int_ne(access(path, F_OK), 0);
  /* Unknown checkpoint and unknown model. */
  rep = checkpoint(s, false, "m", "never-saved");
  dh_err(rep, PE_ENOTFOUND, "never-saved");
  pe__reply__free_unpacked(rep, NULL);
  rep = checkpoint(s, true, "nosuchmodel", "x");
  dh_err(rep, PE_ENOTFOUND, "nosuchmodel");
  pe__reply__free_unpacked(rep, NULL);
  /* A corrupt file is refused and changes nothing. */
  snprintf(path, sizeof path, "%s/models/m/ck-1.ckpt", d.state);
  FILE *f = fopen(path, "r+b");
  ck_assert(f != NULL);
  fseek(f, 1000, SEEK_SET);
  fputc(0x5a, f);
  fclose(f);
  rep = checkpoint(s, false, "m", "ck-1");
  dh_err(rep, PE_ECORRUPT, "CRC");
  pe__reply__free_unpacked(rep, NULL);

  free(zeros);
  free(w0);
  free(wz);
  free(wl);
  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* Save, kill -9, restart on the same state dir, load: bit-identical. Then
 * SIGTERM writes the persistent model's shutdown checkpoint and exits 0. */
/* The model trains with a step schedule (sgd 0.1, halved every 2 steps), so
 * its position in the schedule is model state that must survive too. */
START_TEST(test_restart_and_sigterm) {
  Pe__OptimizerDesc od;
  Pe__LrSchedule ls;
  dh_step_schedule(&od, &ls);
  dh_optimizer = &od;
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  char *w;
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "pm", 9, true, &w);
  dh_batch b;
  dh_batch_make(&b, 16, 9);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 3);
  dh_expect_schedule(s, CLIENT, "pm", 3, 0.05f, "steps 0-2");
  size_t n;
  uint8_t *w0 = dh_get_param(s, CLIENT, "pm", w, &n);
  Pe__Reply *rep = checkpoint(s, true, "pm", "before-crash");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  int st = dh_stop(&d, SIGKILL);
  ck_assert(WIFSIGNALED(st));

  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  h = dh_setup_model(s, CLIENT, &mlp, "pm", 9, true, NULL);
  rep = checkpoint(s, false, "pm", "before-crash");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w1 = dh_get_param(s, CLIENT, "pm", w, &n);
  ck_assert_msg(memcmp(w0, w1, n) == 0, "%s differs after kill -9, restart and load", w);
  dh_expect_schedule(s, CLIENT, "pm", 3, 0.05f, "kill -9, restart and load");
  /* Train on, then SIGTERM: the shutdown checkpoint holds the latest values. */
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 2);
  dh_expect_schedule(s, CLIENT, "pm", 5, 0.025f, "steps 3-4");
  uint8_t *w2 = dh_get_param(s, CLIENT, "pm", w, &n);
  nn_close(s);
  st = dh_stop(&d, SIGTERM);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: wait status %d", st);
  char path[512];
  snprintf(path, sizeof path, "%s/models/pm/shutdown.ckpt", d.state);
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_read_file(path, (size_t)1 << 30, &buf, &len));
  pe_ckpt_entry *e;
  int ne;
  PE_CK_OK(pe_ckpt_decode(buf, len, path, &e, &ne, NULL));
  bool found = false;
  for (int i = 0; i < ne; i++)
    if (!strcmp(e[i].name, w)) {
      found = true;
      ck_assert_uint_eq(pe_tensor_bytes(&e[i].t), n);
      ck_assert_msg(memcmp(e[i].t.data, w2, n) == 0, "shutdown checkpoint of %s is stale", w);
    }
  ck_assert_msg(found, "%s not in the shutdown checkpoint", w);
  pe_ckpt_entries_free(e, ne);
  free(buf);
  /* Restart: the persistent model starts from its shutdown checkpoint, and
   * Init has nothing to do. */
  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  h = dh_register(s, CLIENT, &mlp, "pm", 9, true, NULL, NULL);
  rep = dh_init(s, CLIENT, h);
  dh_ok(rep);
  ck_assert(!rep->init->initialized);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w3 = dh_get_param(s, CLIENT, "pm", w, &n);
  ck_assert_msg(memcmp(w3, w2, n) == 0, "%s not restored after SIGTERM and restart", w);
  free(w3);
  /* The schedule goes on from step 5 (0.1 * 0.5^2), not from step 0 (0.1). */
  dh_expect_schedule(s, CLIENT, "pm", 5, 0.025f, "SIGTERM and restart");
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  dh_expect_schedule(s, CLIENT, "pm", 6, 0.025f, "step 5 after the restart");
  dh_optimizer = NULL;
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  free(w0);
  free(w1);
  free(w2);
  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* Two clients, two models, runs in flight at the same time; both right. */
/* A persistent model whose shutdown checkpoint cannot be written (a
 * non-empty directory where the file goes: refused even to root) makes
 * SIGTERM's exit status 1, so a supervisor sees the loss; the socket is
 * still removed. */
START_TEST(test_unsaved_model_fails_the_exit) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "blocked", 9, true, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 9);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  char path[512];
  snprintf(path, sizeof path, "%s/models/blocked/shutdown.ckpt/keep", d.state);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s/models/blocked/shutdown.ckpt' && touch '%s'", d.state,
           path);
  ck_assert_int_eq(system(cmd), 0);
  nn_close(s);
  int st = dh_stop(&d, SIGTERM);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "SIGTERM: wait status %d", st);
  snprintf(path, sizeof path, "%s/d.sock", d.dir);
  ck_assert_msg(access(path, F_OK) != 0, "socket %s left behind", path);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

START_TEST(test_two_clients) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int sa = dh_connect(&d, 30000), sb = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t ha = dh_setup_model(sa, CLIENT, &mlp, "ma", 11, false, NULL);
  uint64_t hb = dh_setup_model(sb, CLIENT, &mlp, "mb", 12, false, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 4);
  /* Reference: the first loss of each model alone (a fresh model per seed). */
  uint64_t ra = dh_setup_model(sa, CLIENT, &mlp, "ra", 11, false, NULL);
  uint64_t rb = dh_setup_model(sb, CLIENT, &mlp, "rb", 12, false, NULL);
  float want_a = dh_run_loss(sa, CLIENT, ra, &b, mlp.loss, 4);
  float want_b = dh_run_loss(sb, CLIENT, rb, &b, mlp.loss, 4);
  ck_assert_float_ne(want_a, want_b);

  Pe__RunRequest runa, runb;
  char *fl[] = {mlp.loss};
  Pe__Request qa = dh_run_req(CLIENT, &runa, ha, b.feeds, 2, fl, 1, 4);
  Pe__Request qb = dh_run_req(CLIENT + 1, &runb, hb, b.feeds, 2, fl, 1, 4);
  size_t la = pe__request__get_packed_size(&qa), lb = pe__request__get_packed_size(&qb);
  uint8_t *ba = malloc(la), *bb = malloc(lb);
  pe__request__pack(&qa, ba);
  pe__request__pack(&qb, bb);
  ck_assert_int_ge(nn_send(sa, ba, la, 0), 0);
  ck_assert_int_ge(nn_send(sb, bb, lb, 0), 0);
  void *x = NULL, *y = NULL;
  int nx = nn_recv(sa, &x, NN_MSG, 0), ny = nn_recv(sb, &y, NN_MSG, 0);
  ck_assert_int_gt(nx, 0);
  ck_assert_int_gt(ny, 0);
  Pe__Reply *rx = pe__reply__unpack(NULL, (size_t)nx, x),
            *ry = pe__reply__unpack(NULL, (size_t)ny, y);
  dh_ok(rx);
  dh_ok(ry);
  float got_a, got_b;
  memcpy(&got_a, rx->run->fetched[0]->data.data, 4);
  memcpy(&got_b, ry->run->fetched[0]->data.data, 4);
  ck_assert_msg(got_a == want_a && got_b == want_b, "concurrent %g %g, alone %g %g", got_a, got_b,
                want_a, want_b);
  pe__reply__free_unpacked(rx, NULL);
  pe__reply__free_unpacked(ry, NULL);
  nn_freemsg(x);
  nn_freemsg(y);
  free(ba);
  free(bb);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(sa);
  nn_close(sb);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* An idle client's programs go after the TTL; a persistent model stays.
 * The TTL comes from a SIGHUP reload of the config file. */
START_TEST(test_session_ttl_after_sighup) {
  dh_daemon d = {0};
  dh_start(&d, "[sessions]\nttl = 600\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "eph", 1, false, NULL);
  uint64_t hp = dh_setup_model(s, CLIENT, &mlp, "keep", 2, true, NULL);
  (void)hp;
  FILE *f = fopen(d.conf, "w");
  ck_assert(f != NULL);
  fputs("[sessions]\nttl = 1\n", f);
  fclose(f);
  ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
  dh_sleep_ms(2600);
  ck_assert(dh_alive(&d));
  dh_batch b;
  dh_batch_make(&b, 4, 1);
  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fl, 1, 1);
  Pe__Reply *rep = dh_call(s, &rq);
  dh_err(rep, PE_ENOTFOUND, "no such program");
  pe__reply__free_unpacked(rep, NULL);
  /* The persistent model's parameters are still there. */
  rep = checkpoint(s, true, "keep", "after-ttl");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  rep = checkpoint(s, true, "eph", "after-ttl");
  dh_err(rep, PE_ENOTFOUND, "eph");
  pe__reply__free_unpacked(rep, NULL);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* Feeds from a registered shared-memory region give the same loss as
 * inline feeds; out-of-bounds references are refused. */
START_TEST(test_shm_feeds) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h1 = dh_setup_model(s, CLIENT, &mlp, "inline", 21, false, NULL);
  uint64_t h2 = dh_setup_model(s, CLIENT, &mlp, "shm", 21, false, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 21);
  float want = dh_run_loss(s, CLIENT, h1, &b, mlp.loss, 1);

  char name[64];
  snprintf(name, sizeof name, "/pe-e2e-%d", (int)getpid());
  int fd = shm_open(name, O_CREAT | O_RDWR | O_EXCL, 0600);
  ck_assert_int_ge(fd, 0);
  size_t isz = b.t_image.data.len, lsz = b.t_label.data.len, size = isz + lsz;
  ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
  uint8_t *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ck_assert(map != MAP_FAILED);
  Pe__ShmRequest sr = PE__SHM_REQUEST__INIT;
  uint8_t token[PE_SHM_TOKEN_LEN];
  dh_shm_seal(fd, size, token, &sr);
  close(fd);
  memcpy(map, b.image, isz);
  memcpy(map + isz, b.label, lsz);

  Pe__Request rq = dh_req(CLIENT);
  sr.name = name;
  sr.size = size;
  rq.body_case = PE__REQUEST__BODY_REGISTER_SHM;
  rq.register_shm = &sr;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  uint64_t region = rep->shm->region;
  pe__reply__free_unpacked(rep, NULL);
  /* Ids are random, not counted (a restarted daemon must not hand out the
   * old numbers); the same name, size and token again is the same region.
   * Another size: the trailer is read at that byte, where there is none:
   * not found, as a name that does not exist. */
  ck_assert_uint_ne(region, 0);
  ck_assert_uint_ne(region, 1);
  rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_REGISTER_SHM;
  rq.register_shm = &sr;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert_uint_eq(rep->shm->region, region);
  pe__reply__free_unpacked(rep, NULL);
  sr.size = size - 8;
  rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_REGISTER_SHM;
  rq.register_shm = &sr;
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ENOTFOUND, "no such region with");
  pe__reply__free_unpacked(rep, NULL);
  sr.size = size;

  Pe__ShmRef ri = PE__SHM_REF__INIT, rl = PE__SHM_REF__INIT;
  ri.region = rl.region = region;
  ri.offset = 0;
  ri.length = isz;
  rl.offset = isz;
  rl.length = lsz;
  Pe__Tensor ti = b.t_image, tl = b.t_label;
  ti.data.data = tl.data.data = NULL;
  ti.data.len = tl.data.len = 0;
  ti.shm = &ri;
  tl.shm = &rl;
  Pe__Tensor *feeds[] = {&ti, &tl};
  dh_batch sb = b;
  sb.feeds[0] = feeds[0];
  sb.feeds[1] = feeds[1];
  float got = dh_run_loss(s, CLIENT, h2, &sb, mlp.loss, 1);
  ck_assert_msg(got == want, "shm loss %g, inline %g", got, want);

  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  /* Row indices (ShmRef.rows) the daemon refuses, naming the tensor: one
   * fewer than dim 0, one outside the array, an array that is not whole
   * rows, more rows than the array holds. None of them runs a step. */
  int64_t *idx = malloc(sizeof *idx * (size_t)b.n);
  for (int i = 0; i < b.n; i++) idx[i] = b.n - 1 - i;
  ri.rows = idx;
  ri.n_rows = (size_t)b.n - 1;
  rq = dh_run_req(CLIENT, &run, h2, feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ESHAPE, "row indices, not one per index of dim 0");
  pe__reply__free_unpacked(rep, NULL);
  ri.n_rows = (size_t)b.n;
  idx[3] = b.n;
  rq = dh_run_req(CLIENT, &run, h2, feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "row index 3 is");
  pe__reply__free_unpacked(rep, NULL);
  idx[3] = b.n - 4;
  ri.length = isz - 4;
  rq = dh_run_req(CLIENT, &run, h2, feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ESHAPE, "is not whole rows");
  pe__reply__free_unpacked(rep, NULL);
  /* Repeated indices may not gather more than the array holds. */
  for (int i = 0; i < b.n; i++) idx[i] = 0;
  ri.length = isz / (size_t)b.n * 2;
  rq = dh_run_req(CLIENT, &run, h2, feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ESHAPE, "are more than the");
  pe__reply__free_unpacked(rep, NULL);
  ri.length = isz;
  ri.rows = NULL;
  ri.n_rows = 0;
  free(idx);

  /* Out of bounds. */
  rl.offset = size - 8;
  rq = dh_run_req(CLIENT, &run, h2, feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "outside");
  pe__reply__free_unpacked(rep, NULL);
  /* The client truncates the object under the daemon: that run fails with
   * an error naming the region, the daemon stays up and serves the rest. */
  rl.offset = isz;
  int tfd = shm_open(name, O_RDWR, 0);
  ck_assert_int_ge(tfd, 0);
  ck_assert_int_eq(ftruncate(tfd, 0), 0);
  rq = dh_run_req(CLIENT, &run, h2, feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EIO, "truncated");
  pe__reply__free_unpacked(rep, NULL);
  /* Grown back and refilled, the region works again, and the failed run
   * left h2 as it was: its second step equals h1's second step. */
  ck_assert_int_eq(ftruncate(tfd, (off_t)size), 0);
  close(tfd);
  memcpy(map, b.image, isz);
  memcpy(map + isz, b.label, lsz);
  float got2 = dh_run_loss(s, CLIENT, h2, &sb, mlp.loss, 1);
  float want2 = dh_run_loss(s, CLIENT, h1, &b, mlp.loss, 1);
  ck_assert_msg(got2 == want2 && got2 != want,
                "after truncation: shm loss %g, inline %g (first %g)", got2, want2, want);
  /* Unregister, then a reference is unknown. */
  rq = dh_req(CLIENT);
  Pe__ShmRequest ur = PE__SHM_REQUEST__INIT;
  ur.region = region;
  rq.body_case = PE__REQUEST__BODY_UNREGISTER_SHM;
  rq.unregister_shm = &ur;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  rl.offset = isz;
  rq = dh_run_req(CLIENT, &run, h2, feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ENOTFOUND, "not registered");
  pe__reply__free_unpacked(rep, NULL);
  /* A bad shm name. */
  rq = dh_req(CLIENT);
  sr.name = (char *)"/../etc/passwd";
  rq.body_case = PE__REQUEST__BODY_REGISTER_SHM;
  rq.register_shm = &sr;
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "name");
  pe__reply__free_unpacked(rep, NULL);

  munmap(map, size);
  shm_unlink(name);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* A client killed with SIGKILL in the middle of a long run: the daemon
 * finishes the run, drops the reply, keeps serving, and reclaims the
 * session after the TTL. The killed client is a forked process that makes
 * its nanomsg socket after the fork (nanomsg does not survive one), so it
 * is forked before this process touches nanomsg. */
START_TEST(test_client_killed_mid_run) {
  int go[2], sent[2];
  ck_assert_int_eq(pipe(go), 0);
  ck_assert_int_eq(pipe(sent), 0);
  dh_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "/tmp/pe-e2e-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d.dir));
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    char c;
    if (read(go[0], &c, 1) != 1) _exit(2);
    snprintf(d.addr, sizeof d.addr, "ipc://%s/d.sock", d.dir);
    int s = nn_socket(AF_SP, NN_REQ);
    nn_connect(s, d.addr);
    pe_model_spec mlp;
    char err[128];
    if (pe_model_spec_build("mlp", &mlp, err, sizeof err)) _exit(3);
    Pe__Request rq = PE__REQUEST__INIT;
    rq.client_id = 0x7777;
    rq.request_id = 1;
    Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
    reg.program.data = mlp.bytes;
    reg.program.len = mlp.len;
    reg.model = (char *)"victim";
    rq.body_case = PE__REQUEST__BODY_REGISTER;
    rq.register_ = &reg;
    uint8_t buf[1 << 16];
    size_t len = pe__request__pack(&rq, buf);
    void *r = NULL;
    nn_send(s, buf, len, 0);
    int n = nn_recv(s, &r, NN_MSG, 0);
    Pe__Reply *rep = n > 0 ? pe__reply__unpack(NULL, (size_t)n, r) : NULL;
    if (!rep || rep->code) _exit(4);
    uint64_t h = rep->register_->handle;
    Pe__InitRequest in = PE__INIT_REQUEST__INIT;
    in.handle = h;
    rq.request_id = 2;
    rq.body_case = PE__REQUEST__BODY_INIT;
    rq.init = &in;
    len = pe__request__pack(&rq, buf);
    nn_send(s, buf, len, 0);
    if (nn_recv(s, &r, NN_MSG, 0) <= 0) _exit(5);
    dh_batch b;
    dh_batch_make(&b, 16, 1);
    Pe__RunRequest run;
    char *fl[] = {mlp.loss};
    Pe__Request rr = dh_run_req(0x7777, &run, h, b.feeds, 2, fl, 1, 300);
    rr.request_id = 3;
    size_t rl = pe__request__get_packed_size(&rr);
    uint8_t *rb = malloc(rl);
    pe__request__pack(&rr, rb);
    nn_send(s, rb, rl, 0);
    if (write(sent[1], "s", 1) != 1) _exit(6);
    pause();
    _exit(0);
  }
  dh_start(&d, "[sessions]\nttl = 1\n");
  ck_assert_int_eq(write(go[1], "g", 1), 1);
  char c;
  ck_assert_int_eq(read(sent[0], &c, 1), 1);
  dh_sleep_ms(100); /* the run is under way */
  kill(child, SIGKILL);
  int wst;
  waitpid(child, &wst, 0);
  int s = dh_connect(&d, 30000);
  ck_assert(dh_ping(s));
  /* Others are served meanwhile, and after the TTL the victim's program is
   * gone (its run finished, its reply dropped). */
  int programs = -1;
  double t0 = dh_now();
  while (dh_now() - t0 < 15) {
    dh_sleep_ms(250);
    Pe__Request rq = dh_req(CLIENT);
    rq.body_case = PE__REQUEST__BODY_STATUS;
    rq.status = 1;
    Pe__Reply *rep = dh_call(s, &rq);
    dh_ok(rep);
    programs = rep->status->programs;
    bool victim_model = false;
    for (size_t i = 0; i < rep->status->n_models; i++)
      victim_model |= !strcmp(rep->status->models[i]->name, "victim");
    pe__reply__free_unpacked(rep, NULL);
    if (programs == 0 && !victim_model) break;
  }
  ck_assert_int_eq(programs, 0);
  ck_assert(dh_alive(&d));
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_state");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_resend_applied_once);
  tcase_add_test(tc, test_params_and_checkpoints);
  tcase_add_test(tc, test_restart_and_sigterm);
  tcase_add_test(tc, test_unsaved_model_fails_the_exit);
  tcase_add_test(tc, test_two_clients);
  tcase_add_test(tc, test_session_ttl_after_sighup);
  tcase_add_test(tc, test_shm_feeds);
  tcase_add_test(tc, test_client_killed_mid_run);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
