/* End-to-end harness: start the real pe-executord ($PE_BUILD_DIR) on a
 * private ipc:// socket with a temporary state directory, and speak the
 * protocol with a plain nanomsg REQ socket and protobuf-c (no client
 * library: these tests pin the wire contract).
 *
 * Header-only; every function runs inside a Check test body (CK_FORK:
 * nanomsg does not survive a fork, so sockets are made in the child). */
#ifndef PE_TESTS_DAEMON_HARNESS_H
#define PE_TESTS_DAEMON_HARNESS_H

#include <check.h>
#include <errno.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "pe_model_file.h"
#include "pe_models.h"
#include "service.pb-c.h"
#include "shm_token.h"

typedef struct dh_daemon {
  char dir[256];    /* temp dir: socket, state, log, conf */
  char addr[320];   /* ipc://<dir>/d.sock */
  char state[320];  /* <dir>/state */
  char log[320];    /* <dir>/daemon.log (stderr) */
  char conf[320];   /* <dir>/d.conf ("" when none) */
  char notify[320]; /* when set: NOTIFY_SOCKET for the daemon, WATCHDOG_USEC 200 ms */
  /* More command-line options (up to a NULL). */
  const char *args[4];
  pid_t pid;
} dh_daemon;

static inline double dh_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void dh_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A REQ socket to the daemon; timeout_ms for send and receive. */
static inline int dh_connect(const dh_daemon *d, int timeout_ms) {
  int s = nn_socket(AF_SP, NN_REQ);
  ck_assert_int_ge(s, 0);
  int unlimited = -1;
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &unlimited, sizeof unlimited);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
  ck_assert_msg(nn_connect(s, d->addr) >= 0, "connect %s: %s", d->addr, nn_strerror(nn_errno()));
  return s;
}

/* Send raw bytes, receive one reply (NULL on timeout). */
static inline Pe__Reply *dh_call_raw(int sock, const void *buf, size_t len) {
  if (nn_send(sock, buf, len, 0) < 0) return NULL;
  void *rbuf = NULL;
  int n = nn_recv(sock, &rbuf, NN_MSG, 0);
  if (n < 0) return NULL;
  Pe__Reply *rep = pe__reply__unpack(NULL, (size_t)n, rbuf);
  nn_freemsg(rbuf);
  ck_assert_msg(rep != NULL, "reply of %d bytes does not decode", n);
  return rep;
}

static inline Pe__Reply *dh_call(int sock, const Pe__Request *rq) {
  size_t len = pe__request__get_packed_size(rq);
  uint8_t *buf = malloc(len ? len : 1);
  pe__request__pack(rq, buf);
  Pe__Reply *rep = dh_call_raw(sock, buf, len);
  free(buf);
  ck_assert_msg(rep != NULL, "no reply to request %llu (%s)", (unsigned long long)rq->request_id,
                nn_strerror(nn_errno()));
  ck_assert_msg(rep->client_id == rq->client_id && rep->request_id == rq->request_id,
                "reply ids %llu/%llu, want %llu/%llu", (unsigned long long)rep->client_id,
                (unsigned long long)rep->request_id, (unsigned long long)rq->client_id,
                (unsigned long long)rq->request_id);
  return rep;
}

/* The reply succeeded (prints the daemon's message otherwise). */
static inline void dh_ok(const Pe__Reply *rep) {
  ck_assert_msg(rep->code == 0, "reply code %d: %s", rep->code, rep->message);
}

/* The reply failed with code and its message contains needle. */
static inline void dh_err(const Pe__Reply *rep, int code, const char *needle) {
  ck_assert_msg(rep->code == code, "reply code %d (want %d): %s", rep->code, code, rep->message);
  ck_assert_msg(strstr(rep->message, needle), "'%s' not in: %s", needle, rep->message);
}

static _Atomic uint64_t dh_next_id = 1; /* tests may send from several threads */

/* Give the shm object fd, whose data is `size` bytes, the trailer
 * RegisterShm checks (common/shm_token.h: it grows to size + 64), and put
 * its token, kept in token, into sr. */
static inline void dh_shm_seal(int fd, uint64_t size, uint8_t token[PE_SHM_TOKEN_LEN],
                               Pe__ShmRequest *sr) {
  uint8_t trailer[PE_SHM_TRAILER];
  ck_assert_int_eq(pe_shm_token_new(token), 0);
  pe_shm_trailer_make(trailer, token);
  ck_assert_int_eq(ftruncate(fd, (off_t)(size + PE_SHM_TRAILER)), 0);
  ck_assert_int_eq(pwrite(fd, trailer, sizeof trailer, (off_t)size), (ssize_t)sizeof trailer);
  sr->token.data = token;
  sr->token.len = PE_SHM_TOKEN_LEN;
}

static inline Pe__Request dh_req(uint64_t client) {
  Pe__Request rq = PE__REQUEST__INIT;
  rq.client_id = client;
  rq.request_id = atomic_fetch_add(&dh_next_id, 1);
  return rq;
}

static inline bool dh_ping(int sock) {
  Pe__Request rq = dh_req(1);
  rq.body_case = PE__REQUEST__BODY_PING;
  rq.ping = 1;
  size_t len = pe__request__get_packed_size(&rq);
  uint8_t buf[64];
  pe__request__pack(&rq, buf);
  Pe__Reply *rep = dh_call_raw(sock, buf, len);
  bool ok = rep && rep->code == 0;
  if (rep) pe__reply__free_unpacked(rep, NULL);
  return ok;
}

/* Start the daemon; conf_text (may be NULL) becomes its --config file.
 * Reuses d->dir when already set (restart on the same state). */
static inline void dh_start(dh_daemon *d, const char *conf_text) {
  if (!d->dir[0]) {
    snprintf(d->dir, sizeof d->dir, "/tmp/pe-e2e-XXXXXX");
    ck_assert_msg(mkdtemp(d->dir) != NULL, "mkdtemp: %s", strerror(errno));
  }
  snprintf(d->addr, sizeof d->addr, "ipc://%s/d.sock", d->dir);
  snprintf(d->state, sizeof d->state, "%s/state", d->dir);
  snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
  d->conf[0] = 0;
  if (conf_text) {
    snprintf(d->conf, sizeof d->conf, "%s/d.conf", d->dir);
    FILE *f = fopen(d->conf, "w");
    ck_assert(f != NULL);
    fputs(conf_text, f);
    fclose(f);
  }
  const char *bd = getenv("PE_BUILD_DIR");
  ck_assert_msg(bd != NULL, "PE_BUILD_DIR not set (run through ctest)");
  char exe[512];
  snprintf(exe, sizeof exe, "%s/pe-executord", bd);
  ck_assert_msg(access(exe, X_OK) == 0, "%s not built", exe);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    FILE *lf = freopen(d->log, "a", stderr);
    (void)lf;
    char *argv[16];
    int a = 0;
    argv[a++] = exe;
    argv[a++] = (char *)"--socket";
    argv[a++] = d->addr;
    argv[a++] = (char *)"--state-dir";
    argv[a++] = d->state;
    argv[a++] = (char *)"--places";
    argv[a++] = (char *)"cpu:1";
    if (d->conf[0]) {
      argv[a++] = (char *)"--config";
      argv[a++] = d->conf;
    }
    for (int i = 0; i < 4 && d->args[i]; i++) argv[a++] = (char *)d->args[i];
    argv[a] = NULL;
    setenv("PE_LOG", "info", 0);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    if (d->notify[0]) {
      setenv("NOTIFY_SOCKET", d->notify, 1);
      setenv("WATCHDOG_USEC", "200000", 1);
    }
    execv(exe, argv);
    _exit(127);
  }
  d->pid = pid;
  /* Ready when a ping is answered (10 s). */
  double t0 = dh_now();
  for (;;) {
    int st;
    ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "daemon exited during startup (log %s)", d->log);
    char path[400];
    snprintf(path, sizeof path, "%s/d.sock", d->dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
      int s = dh_connect(d, 1000);
      bool ok = dh_ping(s);
      nn_close(s);
      if (ok) return;
    }
    ck_assert_msg(dh_now() - t0 < 10, "daemon not ready after 10 s (log %s)", d->log);
    dh_sleep_ms(20);
  }
}

/* Run the daemon in the foreground with conf_text (may be NULL) as its
 * --config file, for a start that must fail: its stderr and stdout into
 * out (cap bytes, NUL-terminated); returns the wait status. */
static inline int dh_run_to_exit(dh_daemon *d, const char *conf_text, char *out, size_t cap) {
  if (!d->dir[0]) {
    snprintf(d->dir, sizeof d->dir, "/tmp/pe-e2e-XXXXXX");
    ck_assert_msg(mkdtemp(d->dir) != NULL, "mkdtemp: %s", strerror(errno));
  }
  char conf[400] = "", cmd[1400];
  if (conf_text) {
    snprintf(conf, sizeof conf, "%s/d.conf", d->dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs(conf_text, f);
    fclose(f);
  }
  snprintf(cmd, sizeof cmd,
           "'%s/pe-executord' %s%s%s--places cpu:1 --socket 'ipc://%s/d.sock' "
           "--state-dir '%s/state' 2>&1",
           getenv("PE_BUILD_DIR"), conf[0] ? "--config '" : "", conf, conf[0] ? "' " : "", d->dir,
           d->dir);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  return pclose(p);
}

/* Signal the daemon and wait for it; returns the wait status. */
static inline int dh_stop(dh_daemon *d, int sig) {
  if (d->pid <= 0) return 0;
  kill(d->pid, sig);
  int st = 0;
  double t0 = dh_now();
  while (waitpid(d->pid, &st, WNOHANG) == 0) {
    if (dh_now() - t0 > 20) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &st, 0);
      ck_abort_msg("daemon did not exit within 20 s of signal %d", sig);
    }
    dh_sleep_ms(10);
  }
  d->pid = 0;
  return st;
}

/* The daemon's resident size (VmRSS of /proc/PID/status), kB. */
static inline long dh_rss_kb(const dh_daemon *d) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)d->pid);
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  fclose(f);
  ck_assert_int_gt(kb, 0);
  return kb;
}

/* Whether the daemon's log (so far) contains needle. */
static inline bool dh_log_has(const dh_daemon *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  if (!f) return false;
  char line[4096];
  bool has = false;
  while (!has && fgets(line, sizeof line, f)) has = strstr(line, needle) != NULL;
  fclose(f);
  return has;
}

static inline bool dh_alive(const dh_daemon *d) {
  int st;
  return d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == 0;
}

static inline void dh_cleanup(dh_daemon *d) {
  if (d->pid > 0) dh_stop(d, SIGKILL);
  if (d->dir[0] && !getenv("PE_KEEP_TMP")) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", d->dir);
  }
}

/* --- protocol helpers ----------------------------------------------------------- */
/* Places asked for by dh_register (NULL: the daemon's, cpu:1). */
static const char *dh_places = NULL;
/* Strategy asked for by dh_register. */
static Pe__Strategy dh_strategy = PE__STRATEGY__ALLREDUCE;
/* Register's optimizer override sent by dh_register (NULL: none). */
static Pe__OptimizerDesc *dh_optimizer = NULL;
/* RegisterOptions.no_op_fusion sent by dh_register. */
static bool dh_no_op_fusion = false;
/* RegisterOptions.for_test sent by dh_register (an evaluation program). */
static bool dh_for_test = false;
/* RegisterOptions.fuse_allreduce and batch_hint sent by dh_register. */
static bool dh_fuse = false;
static int64_t dh_batch_hint = 0;

/* A Register of spec under model name; the reply, whatever its code. */
static inline Pe__Reply *dh_register_call(int sock, uint64_t client, const pe_model_spec *spec,
                                          const char *model, uint64_t seed, bool persistent) {
  Pe__Request rq = dh_req(client);
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  Pe__RegisterOptions opts = PE__REGISTER_OPTIONS__INIT;
  char *keep[] = {(char *)spec->accuracy};
  opts.seed = seed;
  opts.persistent = persistent;
  opts.n_keep = 1;
  opts.keep = keep;
  if (dh_places) opts.places = (char *)dh_places;
  opts.strategy = dh_strategy;
  opts.optimizer = dh_optimizer;
  opts.no_op_fusion = dh_no_op_fusion;
  opts.for_test = dh_for_test;
  opts.fuse_allreduce = dh_fuse;
  opts.batch_hint = dh_batch_hint;
  reg.program.data = spec->bytes;
  reg.program.len = spec->len;
  reg.model = (char *)model;
  reg.options = &opts;
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  return dh_call(sock, &rq);
}

/* A packed ProgramDesc of one root block of n_ops ops of `type` (NULL:
 * none), each with n_attrs INT attributes "attr_K" = K: a program for the
 * decode's limits, not one that compiles (*len: its length; free it). */
static inline uint8_t *dh_program_of_attrs(const char *type, size_t n_ops, size_t n_attrs,
                                           size_t *len) {
  size_t na = n_attrs ? n_attrs : 1;
  Pe__Attr *at = calloc(na, sizeof *at), **atp = calloc(na, sizeof *atp);
  char(*names)[24] = calloc(na, sizeof *names);
  Pe__OpDesc op = PE__OP_DESC__INIT, **ops = calloc(n_ops ? n_ops : 1, sizeof *ops);
  ck_assert(at && atp && names && ops);
  for (size_t i = 0; i < n_attrs; i++) {
    at[i] = (Pe__Attr)PE__ATTR__INIT;
    snprintf(names[i], sizeof names[i], "attr_%zu", i);
    at[i].name = names[i];
    at[i].i = (int64_t)i;
    atp[i] = &at[i];
  }
  if (type) op.type = (char *)type;
  op.n_attrs = n_attrs;
  op.attrs = atp;
  for (size_t i = 0; i < n_ops; i++) ops[i] = &op;
  Pe__BlockDesc blk = PE__BLOCK_DESC__INIT, *blocks[] = {&blk};
  blk.parent_idx = -1;
  blk.n_ops = n_ops;
  blk.ops = ops;
  Pe__ProgramDesc pd = PE__PROGRAM_DESC__INIT;
  pd.n_blocks = 1;
  pd.blocks = blocks;
  pd.startup_block = -1;
  *len = pe__program_desc__get_packed_size(&pd);
  uint8_t *buf = malloc(*len ? *len : 1);
  ck_assert_ptr_nonnull(buf);
  pe__program_desc__pack(&pd, buf);
  free(ops);
  free(names);
  free(atp);
  free(at);
  return buf;
}

/* A Register request (not sent) of program bytes under model name (*reg
 * holds its body, borrowing prog). */
static inline Pe__Request dh_register_req(uint64_t client, Pe__RegisterRequest *reg,
                                          const uint8_t *prog, size_t len, const char *model) {
  Pe__Request rq = dh_req(client);
  pe__register_request__init(reg);
  reg->program.data = (uint8_t *)prog;
  reg->program.len = len;
  reg->model = (char *)model;
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = reg;
  return rq;
}

/* Register model spec `spec` ("mlp") under model name; returns the handle. */
static inline uint64_t dh_register(int sock, uint64_t client, const pe_model_spec *spec,
                                   const char *model, uint64_t seed, bool persistent, bool *existed,
                                   Pe__Reply **rep_out) {
  Pe__Reply *rep = dh_register_call(sock, client, spec, model, seed, persistent);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_REGISTER);
  uint64_t h = rep->register_->handle;
  if (existed) *existed = rep->register_->existed;
  if (rep_out)
    *rep_out = rep;
  else
    pe__reply__free_unpacked(rep, NULL);
  return h;
}

/* A Register of program bytes (an evaluation program: for_test) under
 * model name; the reply, whatever its code. */
static inline Pe__Reply *dh_register_eval_call(int sock, uint64_t client, const uint8_t *bytes,
                                               size_t len, const char *model) {
  Pe__Request rq = dh_req(client);
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  Pe__RegisterOptions opts = PE__REGISTER_OPTIONS__INIT;
  opts.for_test = true;
  reg.program.data = (uint8_t *)bytes;
  reg.program.len = len;
  reg.model = (char *)model;
  reg.options = &opts;
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  return dh_call(sock, &rq);
}

/* Deregister handle as client; must succeed. */
static inline void dh_deregister(int sock, uint64_t client, uint64_t handle) {
  Pe__Request rq = dh_req(client);
  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  dr.handle = handle;
  rq.body_case = PE__REQUEST__BODY_DEREGISTER;
  rq.deregister = &dr;
  Pe__Reply *rep = dh_call(sock, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
}

/* A Save (save) or Load request of checkpoint `name` of model (*cr holds
 * its body). */
static inline Pe__Request dh_checkpoint_req(uint64_t client, Pe__CheckpointRequest *cr, bool save,
                                            const char *model, const char *name) {
  Pe__Request rq = dh_req(client);
  pe__checkpoint_request__init(cr);
  cr->model = (char *)model;
  cr->name = (char *)name;
  rq.body_case = save ? PE__REQUEST__BODY_SAVE : PE__REQUEST__BODY_LOAD;
  if (save)
    rq.save = cr;
  else
    rq.load = cr;
  return rq;
}

/* Save (save) or Load a checkpoint `name` of model; the reply. */
static inline Pe__Reply *dh_checkpoint(int sock, uint64_t client, bool save, const char *model,
                                       const char *name) {
  Pe__CheckpointRequest cr;
  Pe__Request rq = dh_checkpoint_req(client, &cr, save, model, name);
  return dh_call(sock, &rq);
}

static inline Pe__Reply *dh_init(int sock, uint64_t client, uint64_t handle) {
  Pe__Request rq = dh_req(client);
  Pe__InitRequest in = PE__INIT_REQUEST__INIT;
  in.handle = handle;
  rq.body_case = PE__REQUEST__BODY_INIT;
  rq.init = &in;
  return dh_call(sock, &rq);
}

/* Init that must succeed; returns whether the startup ran. */
static inline bool dh_init_ok(int sock, uint64_t client, uint64_t handle) {
  Pe__Reply *rep = dh_init(sock, client, handle);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_INIT);
  bool ran = rep->init->initialized;
  pe__reply__free_unpacked(rep, NULL);
  return ran;
}

/* A deterministic batch of n MLP samples. */
typedef struct dh_batch {
  int n;
  float *image;   /* [n, 784] */
  int64_t *label; /* [n, 1] */
  int64_t image_shape[2], label_shape[2];
  Pe__Tensor t_image, t_label;
  Pe__Tensor *feeds[2];
} dh_batch;

static inline void dh_batch_make(dh_batch *b, int n, unsigned seed) {
  memset(b, 0, sizeof *b);
  b->n = n;
  b->image = malloc(sizeof(float) * (size_t)n * 784);
  b->label = malloc(sizeof(int64_t) * (size_t)n);
  uint32_t x = seed * 2654435761u + 1;
  for (int i = 0; i < n * 784; i++) {
    x = x * 1664525u + 1013904223u;
    b->image[i] = (float)(x >> 8) / (float)(1u << 24);
  }
  for (int i = 0; i < n; i++) b->label[i] = (i * 7 + (int)seed) % 10;
  b->image_shape[0] = n;
  b->image_shape[1] = 784;
  b->label_shape[0] = n;
  b->label_shape[1] = 1;
  pe__tensor__init(&b->t_image);
  b->t_image.name = (char *)"image";
  b->t_image.dtype = PE__DATA_TYPE__F32;
  b->t_image.n_shape = 2;
  b->t_image.shape = b->image_shape;
  b->t_image.data.data = (uint8_t *)b->image;
  b->t_image.data.len = sizeof(float) * (size_t)n * 784;
  pe__tensor__init(&b->t_label);
  b->t_label.name = (char *)"label";
  b->t_label.dtype = PE__DATA_TYPE__I64;
  b->t_label.n_shape = 2;
  b->t_label.shape = b->label_shape;
  b->t_label.data.data = (uint8_t *)b->label;
  b->t_label.data.len = sizeof(int64_t) * (size_t)n;
  b->feeds[0] = &b->t_image;
  b->feeds[1] = &b->t_label;
}

static inline void dh_batch_free(dh_batch *b) {
  free(b->image);
  free(b->label);
}

/* A Run request (not sent): feeds as given, one fetch. */
static inline Pe__Request dh_run_req(uint64_t client, Pe__RunRequest *run, uint64_t handle,
                                     Pe__Tensor **feeds, int n_feeds, char **fetch, int n_fetch,
                                     uint32_t steps) {
  Pe__Request rq = dh_req(client);
  pe__run_request__init(run);
  run->handle = handle;
  run->n_feeds = (size_t)n_feeds;
  run->feeds = feeds;
  run->n_fetch = (size_t)n_fetch;
  run->fetch = fetch;
  run->steps = steps;
  rq.body_case = PE__REQUEST__BODY_RUN;
  rq.run = run;
  return rq;
}

/* A run of b on handle h fetching `fetch`, `batches` mini-batches (0: one
 * step on the whole batch); the reply, whatever its code. */
static inline Pe__Reply *dh_run_batches(int sock, uint64_t client, uint64_t handle, dh_batch *b,
                                        const char *fetch, uint32_t batches) {
  Pe__RunRequest run;
  char *f[] = {(char *)fetch};
  Pe__Request rq = dh_run_req(client, &run, handle, b->feeds, 2, f, 1, 0);
  run.batches = batches;
  return dh_call(sock, &rq);
}

/* Run and return the fetched f32 scalar `fetch` (e.g. the loss). */
static inline float dh_run_loss(int sock, uint64_t client, uint64_t handle, dh_batch *b,
                                const char *fetch, uint32_t steps) {
  Pe__RunRequest run;
  char *f[] = {(char *)fetch};
  Pe__Request rq = dh_run_req(client, &run, handle, b->feeds, 2, f, 1, steps);
  Pe__Reply *rep = dh_call(sock, &rq);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_RUN);
  ck_assert_int_eq((int)rep->run->n_fetched, 1);
  Pe__Tensor *t = rep->run->fetched[0];
  ck_assert_int_eq(t->dtype, PE__DATA_TYPE__F32);
  ck_assert_msg(t->data.len >= 4, "fetched %s has %zu bytes", fetch, t->data.len);
  float v;
  memcpy(&v, t->data.data, 4);
  pe__reply__free_unpacked(rep, NULL);
  return v;
}

/* GetParams of one name: a malloc'd copy of its bytes. */
static inline uint8_t *dh_get_param(int sock, uint64_t client, const char *model, const char *name,
                                    size_t *len) {
  Pe__Request rq = dh_req(client);
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  char *names[] = {(char *)name};
  pr.model = (char *)model;
  pr.n_names = 1;
  pr.names = names;
  rq.body_case = PE__REQUEST__BODY_GET_PARAMS;
  rq.get_params = &pr;
  Pe__Reply *rep = dh_call(sock, &rq);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_PARAMS);
  ck_assert_int_eq((int)rep->params->n_values, 1);
  Pe__Tensor *t = rep->params->values[0];
  ck_assert_str_eq(t->name, name);
  uint8_t *out = malloc(t->data.len ? t->data.len : 1);
  memcpy(out, t->data.data, t->data.len);
  *len = t->data.len;
  pe__reply__free_unpacked(rep, NULL);
  return out;
}

/* A GetParams request with no names: every persistable of the model (*pr
 * holds its body). */
static inline Pe__Request dh_get_all_req(uint64_t client, Pe__ParamsRequest *pr,
                                         const char *model) {
  Pe__Request rq = dh_req(client);
  pe__params_request__init(pr);
  pr->model = (char *)model;
  rq.body_case = PE__REQUEST__BODY_GET_PARAMS;
  rq.get_params = pr;
  return rq;
}

/* GetParams with no names: every persistable of the model (the reply). */
static inline Pe__Reply *dh_get_all(int sock, uint64_t client, const char *model) {
  Pe__ParamsRequest pr;
  Pe__Request rq = dh_get_all_req(client, &pr, model);
  Pe__Reply *rep = dh_call(sock, &rq);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_PARAMS);
  ck_assert_int_gt((int)rep->params->n_values, 0);
  return rep;
}

/* NULL when GetParams replies a and b hold the same names with bitwise
 * equal values, else the name of the first that differs (or is missing
 * from b). */
static inline const char *dh_params_differ(const Pe__Reply *a, const Pe__Reply *b) {
  if (a->params->n_values != b->params->n_values) return "(the number of parameters)";
  for (size_t i = 0; i < a->params->n_values; i++) {
    const Pe__Tensor *x = a->params->values[i], *y = NULL;
    for (size_t j = 0; j < b->params->n_values && !y; j++)
      if (!strcmp(b->params->values[j]->name, x->name)) y = b->params->values[j];
    if (!y || x->dtype != y->dtype || x->data.len != y->data.len ||
        memcmp(x->data.data, y->data.data, x->data.len) != 0)
      return x->name;
  }
  return NULL;
}

/* The name of the first 2-D parameter listed by a Register reply (a weight). */
static inline char *dh_first_weight(const Pe__Reply *reg_rep) {
  for (size_t i = 0; i < reg_rep->register_->n_params; i++) {
    Pe__ParamInfo *p = reg_rep->register_->params[i];
    if (p->n_shape == 2 && p->shape[0] > 1 && p->shape[1] > 1) return strdup(p->name);
  }
  ck_abort_msg("no 2-D parameter in the register reply");
  return NULL;
}

/* Register spec under `model` and Init it; *w (may be NULL) gets a weight's
 * name (malloc'd). Returns the handle. */
static inline uint64_t dh_setup_model(int sock, uint64_t client, const pe_model_spec *spec,
                                      const char *model, uint64_t seed, bool persistent, char **w) {
  Pe__Reply *reg;
  uint64_t h = dh_register(sock, client, spec, model, seed, persistent, NULL, &reg);
  if (w) *w = dh_first_weight(reg);
  pe__reply__free_unpacked(reg, NULL);
  dh_init_ok(sock, client, h);
  return h;
}

/* *od: sgd 0.1 with a step schedule halving it every 2 steps (ls holds the
 * schedule); rate of step s = 0.1 * 0.5^floor(s / 2). */
static inline void dh_step_schedule(Pe__OptimizerDesc *od, Pe__LrSchedule *ls) {
  pe__optimizer_desc__init(od);
  pe__lr_schedule__init(ls);
  od->type = "sgd";
  od->learning_rate = 0.1f;
  ls->type = "step";
  ls->decay_steps = 2;
  ls->gamma = 0.5f;
  od->lr_schedule = ls;
}

/* The model's position in its learning-rate schedule: the step counter and
 * the rate of the last step must be `count` and `rate`. */
static inline void dh_expect_schedule(int s, uint64_t client, const char *model, int64_t count,
                                      float rate, const char *when) {
  size_t n;
  uint8_t *c = dh_get_param(s, client, model, "@LR_DECAY_COUNTER@", &n);
  ck_assert_uint_eq(n, sizeof(int64_t));
  int64_t got;
  memcpy(&got, c, sizeof got);
  free(c);
  uint8_t *r = dh_get_param(s, client, model, "learning_rate", &n);
  ck_assert_uint_eq(n, sizeof(float));
  float lr;
  memcpy(&lr, r, sizeof lr);
  free(r);
  ck_assert_msg(got == count && lr == rate, "%s: counter %lld, learning_rate %g; want %lld, %g",
                when, (long long)got, lr, (long long)count, rate);
}

static inline pe_model_spec dh_mlp(void) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "mlp: %s", err);
  return m;
}

/* A model from the text of a model file (conf/models/README.md). */
static inline pe_model_spec dh_model_text(const char *name, const char *text) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_file_parse(text, strlen(text), name, &m, err, sizeof err) == 0, "%s: %s",
                name, err);
  return m;
}

/* The mlp with a first layer of 512 (fc_0.w [784,512], fc_0.b [512]): the
 * same names, other shapes. */
static inline pe_model_spec dh_mlp_wide(void) {
  return dh_model_text("wide",
                       "input image 784\n"
                       "label label\n"
                       "fc 512 act=relu\n"
                       "fc 128 act=relu\n"
                       "fc 10\n"
                       "loss softmax_with_cross_entropy\n"
                       "accuracy top=1\n"
                       "optimizer momentum lr=0.1 mu=0.9\n");
}

/* Run `pe-client --socket <d's> ARGS` ($PE_BUILD_DIR), which must exit 0;
 * its stdout, NUL-terminated, into out (cap bytes). */
static inline void dh_cli(const dh_daemon *d, const char *args, char *out, size_t cap) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s/pe-client' --socket '%s' %s", getenv("PE_BUILD_DIR"), d->addr,
           args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  ck_assert_msg(st == 0, "%s: wait status 0x%x, output: %s", cmd, st, out);
}

#endif
