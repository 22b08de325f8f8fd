/* libpeclient against the real daemon: register/init/run a few MLP steps
 * (the loss falls), the daemon's evaluation loss equals an in-process run
 * on the parameters it reports, get/set params, save/load restores the
 * parameters bit for bit, shared-memory feeds equal inline ones, daemon
 * errors come back with their code, deregister drops the handle (its
 * owners' only, unless forced).
 *
 * Data: a fixed synthetic batch (no dataset needed); the MLP of
 * pe_models.h. Skipped (77) when pe-executord is not built. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_daemon.h"
#include "compiler/pass.h"
#include "core/scope.h"
#include "engine/seq_executor.h"
#include "ir/program.h"
#include "pe_client.h"
#include "pe_model_file.h"
#include "pe_models.h"
#include "test_assert.h"

#define BATCH 32

/* A deterministic batch: pixels from a small LCG, label i % 10. */
typedef struct batch {
  float x[BATCH * 784];
  int64_t y[BATCH];
} batch;

static void batch_fill(batch *b, uint32_t seed) {
  uint32_t s = seed;
  for (int i = 0; i < BATCH * 784; i++) {
    s = s * 1664525u + 1013904223u;
    b->x[i] = (float)(s >> 8) / (float)(1u << 24);
  }
  for (int i = 0; i < BATCH; i++) b->y[i] = i % 10;
}

static void feeds_of(const pe_model_spec *m, const batch *b, pe_client_tensor f[2]) {
  pe_client_tensor_set(&f[0], m->image, PE_B_F32, 2, (int64_t[]){BATCH, 784}, b->x);
  pe_client_tensor_set(&f[1], m->label, PE_B_I64, 2, (int64_t[]){BATCH, 1}, b->y);
}

typedef struct fixture {
  cd_daemon d;
  pe_client *c;
  pe_model_spec m;
  batch b;
  uint64_t train_h, eval_h;
} fixture;

/* Register the model (text: a model file, NULL: the built-in mlp; either
 * way 784-256-... so the checks below hold) under namespace ns, init it. */
static void setup_model_from(fixture *f, const char *ns, const char *text) {
  char err[256];
  if (text)
    ck_assert_msg(pe_model_file_parse(text, strlen(text), ns, &f->m, err, sizeof err) == 0, "%s",
                  err);
  else
    ck_assert_msg(pe_model_spec_build("mlp", &f->m, err, sizeof err) == 0, "%s", err);
  batch_fill(&f->b, 7);
  cd_start(&f->d);
  f->c = cd_connect(&f->d);
  const char *keep[] = {f->m.loss, f->m.accuracy, f->m.correct};
  pe_client_register_args a = {.program = f->m.bytes,
                               .program_len = f->m.len,
                               .model = ns,
                               .places = "cpu:1",
                               .seed = 5,
                               .keep = keep,
                               .n_keep = 3};
  pe_client_program p;
  CD_OK(f->c, pe_client_register(f->c, &a, &p));
  f->train_h = p.handle;
  ck_assert(!p.existed);
  /* 6 weights and biases, plus the optimizer's persistables (velocities,
   * learning rate) */
  ck_assert_uint_ge(p.n_params, 6);
  /* Parameters by name with their shapes (builder names, pe_builder.h). */
  bool saw_w0 = false;
  for (size_t i = 0; i < p.n_params; i++)
    if (!strcmp(p.params[i].name, "fc_0.w")) {
      saw_w0 = true;
      ck_assert_int_eq(p.params[i].ndim, 2);
      ck_assert_int_eq(p.params[i].shape[0], 784);
      ck_assert_int_eq(p.params[i].shape[1], 256);
    }
  ck_assert(saw_w0);
  /* The same program again: same handle, existed. */
  CD_OK(f->c, pe_client_register(f->c, &a, &p));
  ck_assert_uint_eq(p.handle, f->train_h);
  ck_assert(p.existed);
  a.for_test = true;
  CD_OK(f->c, pe_client_register(f->c, &a, &p));
  f->eval_h = p.handle;
  ck_assert_uint_ne(f->eval_h, f->train_h);
  bool inited = false;
  CD_OK(f->c, pe_client_init(f->c, f->train_h, false, &inited));
  ck_assert(inited);
  CD_OK(f->c, pe_client_init(f->c, f->eval_h, false, &inited));
  ck_assert(!inited); /* the model's parameters exist: shared with the eval program */
}

static void setup_model(fixture *f, const char *ns) {
  setup_model_from(f, ns, NULL);
}

static void teardown_model(fixture *f) {
  pe_client_free(f->c);
  cd_stop(&f->d);
  pe_model_spec_release(&f->m);
}

/* One train step; returns the loss. */
static float train_step(fixture *f, uint32_t steps) {
  pe_client_tensor feeds[2];
  feeds_of(&f->m, &f->b, feeds);
  const char *fetch[] = {f->m.loss};
  pe_client_run_opts o = {.steps = steps};
  pe_client_run_result r;
  CD_OK(f->c, pe_client_run(f->c, f->train_h, feeds, 2, fetch, 1, &o, &r));
  ck_assert_uint_eq(r.n_fetched, 1);
  ck_assert_str_eq(r.fetched[0].name, f->m.loss);
  ck_assert_int_eq(r.fetched[0].dtype, PE_B_F32);
  ck_assert_uint_eq(r.steps, steps ? steps : 1);
  ck_assert(r.run_ms >= 0);
  return ((const float *)r.fetched[0].data)[0];
}

static float eval_loss(fixture *f) {
  pe_client_tensor feeds[2];
  feeds_of(&f->m, &f->b, feeds);
  const char *fetch[] = {f->m.loss};
  pe_client_run_result r;
  CD_OK(f->c, pe_client_run(f->c, f->eval_h, feeds, 2, fetch, 1, NULL, &r));
  return ((const float *)r.fetched[0].data)[0];
}

/* A copy of all parameters (name order as returned). */
typedef struct params_copy {
  size_t n;
  char names[32][64];
  size_t nbytes[32];
  void *data[32];
  pe_client_tensor t[32]; /* the same, as set_params takes them */
} params_copy;

static void params_get(fixture *f, const char *ns, params_copy *pc) {
  const pe_client_tensor *v;
  size_t n;
  CD_OK(f->c, pe_client_get_params(f->c, ns, NULL, 0, &v, &n));
  ck_assert_uint_ge(n, 6);
  ck_assert_uint_le(n, 32);
  pc->n = n;
  for (size_t i = 0; i < n; i++) {
    snprintf(pc->names[i], sizeof pc->names[i], "%s", v[i].name);
    pc->nbytes[i] = v[i].nbytes;
    pc->data[i] = malloc(v[i].nbytes);
    memcpy(pc->data[i], v[i].data, v[i].nbytes);
    pe_client_tensor_set(&pc->t[i], pc->names[i], v[i].dtype, v[i].ndim, v[i].shape, pc->data[i]);
  }
}

static void params_free(params_copy *pc) {
  for (size_t i = 0; i < pc->n; i++) free(pc->data[i]);
}

static bool params_equal(const params_copy *a, const params_copy *b) {
  if (a->n != b->n) return false;
  for (size_t i = 0; i < a->n; i++)
    if (strcmp(a->names[i], b->names[i]) || a->nbytes[i] != b->nbytes[i] ||
        memcmp(a->data[i], b->data[i], a->nbytes[i]))
      return false;
  return true;
}

START_TEST(train_steps_lower_the_loss) {
  fixture f;
  setup_model(&f, "mlp-a");
  float first = train_step(&f, 1);
  ck_assert(isfinite(first) && first > 1.5f); /* ~ln 10 for fresh weights */
  float last = first;
  for (int i = 0; i < 8; i++) last = train_step(&f, 1);
  /* steps=5: five updates in one request */
  last = train_step(&f, 5);
  ck_assert_msg(last < 0.5f * first, "loss %g -> %g: did not fall by half", first, last);
  pe_client_status s;
  CD_OK(f.c, pe_client_get_status(f.c, &s));
  ck_assert_uint_ge(s.runs_total, 10);
  /* --places cpu:1, worker_threads unset: one pool worker, whose kernels
   * get every core (parallel/runtime.c). */
  ck_assert_int_eq(s.worker_threads, 1);
  /* Captured CUDA graphs: only for cuda places, and said why not. */
  ck_assert(!s.cuda_graph);
  ck_assert_str_eq(s.cuda_graph_reason, "no cuda place");
  bool saw = false;
  for (size_t i = 0; i < s.n_models; i++) saw |= !strcmp(s.models[i].name, "mlp-a");
  ck_assert(saw);
  teardown_model(&f);
}
END_TEST

/* The daemon's eval loss equals an in-process forward pass (libpe's
 * sequential executor) on the parameters the daemon reports. */
START_TEST(eval_matches_in_process) {
  fixture f;
  setup_model(&f, "mlp-b");
  for (int i = 0; i < 3; i++) train_step(&f, 1);
  float remote = eval_loss(&f);
  const pe_client_tensor *v;
  size_t n;
  CD_OK(f.c, pe_client_get_params(f.c, "mlp-b", NULL, 0, &v, &n));
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(f.m.bytes, f.m.len, &p));
  PE_CK_OK(pe_program_compile(p, true));
  pe_scope *scope = pe_scope_new(NULL);
  for (size_t i = 0; i < n; i++) {
    pe_var *var;
    PE_CK_OK(pe_scope_var(scope, v[i].name, &var));
    pe_shape sh = pe_shape_make(v[i].ndim, v[i].shape);
    PE_CK_OK(pe_tensor_resize(&var->t, (pe_dtype)v[i].dtype, &sh, v[i].name));
    ck_assert_uint_eq(pe_tensor_bytes(&var->t), v[i].nbytes);
    memcpy(var->t.data, v[i].data, v[i].nbytes);
  }
  pe_exec_opts eo = {.seed = 5, .threads = 1};
  pe_seq_exec *e;
  PE_CK_OK(pe_seq_exec_new(p, p->main_block, scope, &eo, &e));
  pe_shape xs = PE_SHAPE(BATCH, 784), ys = PE_SHAPE(BATCH, 1);
  pe_tensor xt, yt;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_view(&xt, PE_F32, &xs, f.b.x);
  pe_tensor_view(&yt, PE_I64, &ys, f.b.y);
  pe_feed feeds[2] = {{f.m.image, &xt}, {f.m.label, &yt}};
  const char *fetch[] = {f.m.loss};
  const pe_tensor *out[1];
  PE_CK_OK(pe_seq_exec_run(e, feeds, 2, fetch, 1, out));
  float local = pe_f32(out[0])[0];
  ck_assert_msg(fabsf(local - remote) <= 1e-5f * fmaxf(1.0f, fabsf(local)),
                "eval loss: daemon %.9g, in-process %.9g", remote, local);
  pe_seq_exec_free(e);
  pe_scope_free(scope);
  pe_program_free(p);
  teardown_model(&f);
}
END_TEST

START_TEST(get_and_set_params) {
  fixture f;
  setup_model(&f, "mlp-c");
  const char *names[] = {"fc_2.b"};
  const pe_client_tensor *v;
  size_t n;
  CD_OK(f.c, pe_client_get_params(f.c, "mlp-c", names, 1, &v, &n));
  ck_assert_uint_eq(n, 1);
  ck_assert_str_eq(v[0].name, "fc_2.b");
  ck_assert_int_eq(v[0].ndim, 1);
  ck_assert_int_eq(v[0].shape[0], 10);
  float want[10];
  for (int i = 0; i < 10; i++) want[i] = 0.25f * (float)i - 1.0f;
  pe_client_tensor t;
  pe_client_tensor_set(&t, "fc_2.b", PE_B_F32, 1, (int64_t[]){10}, want);
  CD_OK(f.c, pe_client_set_params(f.c, "mlp-c", &t, 1));
  CD_OK(f.c, pe_client_get_params(f.c, "mlp-c", names, 1, &v, &n));
  ck_assert_uint_eq(n, 1);
  ck_assert_mem_eq(v[0].data, want, sizeof want);
  /* A wrong shape is the daemon's error, naming the parameter; each
   * context once (not "set_params: set_params of model 'mlp-c': model
   * 'mlp-c': ..." nor "get_params: get_params: ..."). */
  pe_client_tensor_set(&t, "fc_2.b", PE_B_F32, 1, (int64_t[]){9}, want);
  int rc = pe_client_set_params(f.c, "mlp-c", &t, 1);
  ck_assert_int_eq(rc, PE_C_ESHAPE);
  ck_assert_str_eq(pe_client_error(f.c),
                   "set_params: model 'mlp-c': 'fc_2.b' has shape [10], the value has [9]");
  names[0] = "zz";
  ck_assert_int_eq(pe_client_get_params(f.c, "mlp-c", names, 1, &v, &n), PE_C_EUNKNOWN_VAR);
  ck_assert_str_eq(pe_client_error(f.c), "get_params: model 'mlp-c' has no parameter 'zz'");
  pe_client_tensor_set(&t, "fc_2.b", PE_B_F32, 1, (int64_t[]){10}, want);
  t.shm_region = 1; /* the daemon's wire check, before the region is looked up */
  t.shm_offset = 3;
  ck_assert_int_eq(pe_client_set_params(f.c, "mlp-c", &t, 1), PE_C_EINVAL);
  ck_assert_str_eq(pe_client_error(f.c),
                   "set_params: tensor 'fc_2.b': shm offset 3 is not a multiple of 4");
  /* An unknown model. */
  rc = pe_client_get_params(f.c, "no-such-model", NULL, 0, &v, &n);
  ck_assert_int_eq(rc, PE_C_ENOTFOUND);
  teardown_model(&f);
}
END_TEST

START_TEST(save_then_load_restores_bits) {
  fixture f;
  setup_model(&f, "mlp-d");
  train_step(&f, 2);
  const char *path;
  uint64_t bytes;
  CD_OK(f.c, pe_client_save(f.c, "mlp-d", "ck1", &path, &bytes));
  ck_assert_uint_gt(bytes, (784 * 256 + 256 * 128) * 4); /* at least the weights */
  ck_assert_msg(path && strstr(path, f.d.state), "checkpoint path %s not under %s",
                path ? path : "(null)", f.d.state);
  params_copy saved, changed, loaded;
  params_get(&f, "mlp-d", &saved);
  train_step(&f, 3);
  params_get(&f, "mlp-d", &changed);
  ck_assert(!params_equal(&saved, &changed));
  CD_OK(f.c, pe_client_load(f.c, "mlp-d", "ck1", NULL, NULL));
  params_get(&f, "mlp-d", &loaded);
  ck_assert(params_equal(&saved, &loaded));
  /* A name that tries to leave the state directory. */
  int rc = pe_client_save(f.c, "mlp-d", "../escape", NULL, NULL);
  ck_assert_msg(rc == PE_C_EINVAL, "rc %d: %s", rc, pe_client_error(f.c));
  rc = pe_client_load(f.c, "mlp-d", "never-saved", NULL, NULL);
  ck_assert_msg(rc != 0 && rc < PE_C_CLIENT_BASE, "rc %d: %s", rc, pe_client_error(f.c));
  params_free(&saved);
  params_free(&changed);
  params_free(&loaded);
  teardown_model(&f);
}
END_TEST

/* The MLP with a dropout after its first layer: every training step draws
 * a mask from the model's generator. */
static const char dropout_mlp[] =
    "batch 32\n"
    "input image 784\n"
    "label label\n"
    "fc 256 act=relu\n"
    "dropout 0.5\n"
    "fc 10\n"
    "loss softmax_with_cross_entropy\n"
    "accuracy\n"
    "optimizer momentum lr=0.1 mu=0.9\n";

/* Train 2 steps, save, train 3 more (*straight); load, train 3 (resumed):
 * the resumed parameters equal the straight ones bit for bit. *saved: the
 * parameters at the save. Trains through f->train_h. */
static void check_resume(fixture *f, const char *ns, params_copy *saved, params_copy *straight) {
  train_step(f, 2);
  CD_OK(f->c, pe_client_save(f->c, ns, "ck", NULL, NULL));
  params_get(f, ns, saved);
  train_step(f, 3);
  params_get(f, ns, straight);
  CD_OK(f->c, pe_client_load(f->c, ns, "ck", NULL, NULL));
  train_step(f, 3);
  params_copy resumed;
  params_get(f, ns, &resumed);
  ck_assert_msg(params_equal(straight, &resumed),
                "%s: training resumed from the checkpoint differs", ns);
  params_free(&resumed);
}

/* A checkpoint carries the model's random generator: the steps after a
 * Load draw the dropout masks the steps after the Save drew, so training
 * resumed from a checkpoint ends bit for bit where the uninterrupted run
 * did. The control: the same parameters put back with set_params (which
 * leaves the generator where it is) train on other masks to other values,
 * so the masks do change the result. */
START_TEST(load_resumes_the_random_stream) {
  fixture f;
  setup_model_from(&f, "mlp-drop", dropout_mlp);
  params_copy saved, straight, reset;
  check_resume(&f, "mlp-drop", &saved, &straight);
  CD_OK(f.c, pe_client_set_params(f.c, "mlp-drop", saved.t, saved.n));
  train_step(&f, 3);
  params_get(&f, "mlp-drop", &reset);
  ck_assert(!params_equal(&straight, &reset));
  params_free(&saved);
  params_free(&straight);
  params_free(&reset);
  teardown_model(&f);
}
END_TEST

START_TEST(shm_feeds_equal_inline_feeds) {
  fixture f;
  setup_model(&f, "mlp-e");
  float inline_loss = eval_loss(&f);
  pe_client_shm shm;
  int rc = pe_client_shm_create(f.c, sizeof f.b, &shm);
  ck_assert_msg(rc == 0, "shm: %s", pe_client_error(f.c));
  memcpy(shm.base, &f.b, sizeof f.b);
  pe_client_tensor feeds[2];
  feeds_of(&f.m, &f.b, feeds);
  feeds[0].shm_region = feeds[1].shm_region = shm.region;
  feeds[0].shm_offset = offsetof(batch, x);
  feeds[1].shm_offset = offsetof(batch, y);
  const char *fetch[] = {f.m.loss};
  pe_client_run_result r;
  CD_OK(f.c, pe_client_run(f.c, f.eval_h, feeds, 2, fetch, 1, NULL, &r));
  ck_assert_float_eq(((const float *)r.fetched[0].data)[0], inline_loss);
  /* Past the region's end: the daemon's error. */
  feeds[1].shm_offset = sizeof f.b;
  rc = pe_client_run(f.c, f.eval_h, feeds, 2, fetch, 1, NULL, &r);
  ck_assert_msg(rc != 0 && rc < PE_C_CLIENT_BASE, "rc %d: %s", rc, pe_client_error(f.c));
  pe_client_shm_close(f.c, &shm);
  teardown_model(&f);
}
END_TEST

/* Only a program's owners deregister it: another client (same handle, it
 * is a content hash) is refused with PERMISSION_DENIED naming the model and
 * what dropping it would do, and the owner keeps training; registering the
 * program makes that client an owner whose deregister drops only its own
 * share; force drops it for everyone. */
START_TEST(deregister_needs_ownership) {
  fixture f;
  setup_model(&f, "mlp-own");
  float before = train_step(&f, 1);
  CD_OK(f.c, pe_client_deregister(f.c, f.eval_h)); /* the train program: the model's last */
  pe_client *other = cd_connect(&f.d);
  int rc = pe_client_deregister(other, f.train_h);
  const char *e = pe_client_error(other);
  ck_assert_msg(rc == PE_C_EPERM && strstr(e, "model 'mlp-own'") &&
                    strstr(e, "belongs to 1 other client") && strstr(e, "free the model's values"),
                "rc %d: %s", rc, e);
  ck_assert_str_eq(pe_client_code_name(rc), "PERMISSION_DENIED");
  ck_assert(train_step(&f, 1) < before); /* the owner's model is intact and still trains */
  /* The other client registers the same program: an owner now. */
  const char *keep[] = {f.m.loss, f.m.accuracy, f.m.correct};
  pe_client_register_args a = {.program = f.m.bytes,
                               .program_len = f.m.len,
                               .model = "mlp-own",
                               .places = "cpu:1",
                               .seed = 5,
                               .keep = keep,
                               .n_keep = 3};
  pe_client_program p;
  CD_OK(other, pe_client_register(other, &a, &p));
  ck_assert_uint_eq(p.handle, f.train_h);
  CD_OK(other, pe_client_deregister(other, f.train_h)); /* its own share only */
  train_step(&f, 1);
  /* Not an owner any more: refused again; force drops it for the owner too. */
  ck_assert_int_eq(pe_client_deregister(other, f.train_h), PE_C_EPERM);
  CD_OK(other, pe_client_deregister_force(other, f.train_h));
  pe_client_tensor feeds[2];
  feeds_of(&f.m, &f.b, feeds);
  const char *fetch[] = {f.m.loss};
  pe_client_run_result r;
  rc = pe_client_run(f.c, f.train_h, feeds, 2, fetch, 1, NULL, &r);
  ck_assert_msg(rc == PE_C_ENOTFOUND, "rc %d: %s", rc, pe_client_error(f.c));
  pe_client_free(other);
  teardown_model(&f);
}
END_TEST

START_TEST(run_errors_and_deregister) {
  fixture f;
  setup_model(&f, "mlp-f");
  pe_client_tensor feeds[2];
  feeds_of(&f.m, &f.b, feeds);
  const char *fetch[] = {f.m.loss};
  pe_client_run_result r;
  /* unknown feed name */
  feeds[1].name = "labels";
  int rc = pe_client_run(f.c, f.train_h, feeds, 2, fetch, 1, NULL, &r);
  ck_assert_msg(rc != 0 && rc < PE_C_CLIENT_BASE && strstr(pe_client_error(f.c), "labels"),
                "rc %d: %s", rc, pe_client_error(f.c));
  /* wrong dtype for the label */
  feeds_of(&f.m, &f.b, feeds);
  feeds[1].dtype = PE_B_F64; /* same byte count as i64 */
  rc = pe_client_run(f.c, f.train_h, feeds, 2, fetch, 1, NULL, &r);
  ck_assert_msg(rc != 0 && rc < PE_C_CLIENT_BASE && strstr(pe_client_error(f.c), "label"),
                "rc %d: %s", rc, pe_client_error(f.c));
  /* the daemon is still fine */
  feeds_of(&f.m, &f.b, feeds);
  CD_OK(f.c, pe_client_run(f.c, f.train_h, feeds, 2, fetch, 1, NULL, &r));
  /* A daemon-side timeout: DEADLINE_EXCEEDED, the steps applied counted. */
  pe_client_run_opts to = {.steps = 100000, .timeout_ms = 1};
  rc = pe_client_run(f.c, f.train_h, feeds, 2, fetch, 1, &to, &r);
  ck_assert_msg(rc == PE_C_EDEADLINE && r.steps > 0 && r.n_fetched == 0 &&
                    strstr(pe_client_error(f.c), "timeout of 1 ms"),
                "rc %d, steps %u: %s", rc, r.steps, pe_client_error(f.c));
  ck_assert_str_eq(pe_client_code_name(rc), "DEADLINE_EXCEEDED");
  CD_OK(f.c, pe_client_deregister(f.c, f.train_h));
  rc = pe_client_run(f.c, f.train_h, feeds, 2, fetch, 1, NULL, &r);
  ck_assert_msg(rc == PE_C_ENOTFOUND, "rc %d: %s", rc, pe_client_error(f.c));
  /* A region that does not exist: the daemon's reason, named once. */
  char name[64], want[160];
  snprintf(name, sizeof name, "/pe-test-none-%d", (int)getpid());
  uint64_t region;
  rc = pe_client_register_shm(f.c, name, 4096, &region);
  snprintf(want, sizeof want, "register_shm: %s: no such region with 4096 bytes", name);
  ck_assert_msg(rc == PE_C_ENOTFOUND && strstr(pe_client_error(f.c), want) &&
                    !strstr(strstr(pe_client_error(f.c), "register_shm") + 1, "register_shm"),
                "rc %d: %s", rc, pe_client_error(f.c));
  CD_OK(f.c, pe_client_ping(f.c));
  teardown_model(&f);
}
END_TEST

/* The default strategy is the daemon's choice: sharded on cpu and sim
 * places, reported in the register reply, and it trains bit for bit like
 * an explicit all-reduce. A strategy value outside the enum is refused. */
static uint64_t register_on(pe_client *c, const pe_model_spec *m, const char *ns,
                            const char *places, pe_client_strategy s, pe_client_strategy want) {
  const char *keep[] = {m->loss};
  pe_client_register_args a = {.program = m->bytes,
                               .program_len = m->len,
                               .model = ns,
                               .places = places,
                               .strategy = s,
                               .seed = 3,
                               .keep = keep,
                               .n_keep = 1};
  pe_client_program p;
  CD_OK(c, pe_client_register(c, &a, &p));
  ck_assert_msg(p.strategy == want, "%s on %s: strategy %s, expected %s", ns, places,
                pe_client_strategy_name(p.strategy), pe_client_strategy_name(want));
  CD_OK(c, pe_client_init(c, p.handle, false, NULL));
  return p.handle;
}

START_TEST(auto_strategy_is_sharded_on_cpu_and_trains_alike) {
  fixture f;
  setup_model(&f, "mlp-s");
  uint64_t ha = register_on(f.c, &f.m, "auto", "cpu:2", PE_C_STRATEGY_AUTO, PE_C_SHARDED);
  uint64_t hr = register_on(f.c, &f.m, "ar", "cpu:2", PE_C_ALLREDUCE, PE_C_ALLREDUCE);
  register_on(f.c, &f.m, "sim", "sim:2", PE_C_STRATEGY_AUTO, PE_C_SHARDED);
  pe_client_tensor feeds[2];
  feeds_of(&f.m, &f.b, feeds);
  const char *fetch[] = {f.m.loss};
  pe_client_run_result r;
  float la = 0, lr = 0;
  for (int step = 0; step < 3; step++) {
    CD_OK(f.c, pe_client_run(f.c, ha, feeds, 2, fetch, 1, NULL, &r));
    la = ((const float *)r.fetched[0].data)[0];
    CD_OK(f.c, pe_client_run(f.c, hr, feeds, 2, fetch, 1, NULL, &r));
    lr = ((const float *)r.fetched[0].data)[0];
    ck_assert_msg(la == lr, "step %d: loss %.9g (auto) vs %.9g (allreduce)", step, la, lr);
  }
  const char *w[] = {"fc_0.w"};
  const pe_client_tensor *v;
  size_t nv;
  CD_OK(f.c, pe_client_get_params(f.c, "auto", w, 1, &v, &nv));
  size_t bytes = (size_t)pe_client_tensor_numel(&v[0]) * sizeof(float);
  float *wa = malloc(bytes);
  memcpy(wa, v[0].data, bytes);
  CD_OK(f.c, pe_client_get_params(f.c, "ar", w, 1, &v, &nv));
  ck_assert_mem_eq(wa, v[0].data, bytes);
  free(wa);
  const char *keep[] = {f.m.loss};
  pe_client_register_args bad = {.program = f.m.bytes,
                                 .program_len = f.m.len,
                                 .model = "bad",
                                 .strategy = (pe_client_strategy)9,
                                 .keep = keep,
                                 .n_keep = 1};
  pe_client_program p;
  ck_assert_int_eq(pe_client_register(f.c, &bad, &p), PE_C_EARG);
  ck_assert_str_eq(pe_client_error(f.c), "register: strategy 9 unknown");
  bad.strategy = PE_C_STRATEGY_AUTO;
  bad.cuda_graph = (pe_client_cuda_graph)7;
  ck_assert_int_eq(pe_client_register(f.c, &bad, &p), PE_C_EARG);
  ck_assert_str_eq(pe_client_error(f.c), "register: cuda_graph 7 unknown");
  /* A valid mode registers on cpu places (where it changes nothing). */
  bad.cuda_graph = PE_C_CUDA_GRAPH_ON;
  CD_OK(f.c, pe_client_register(f.c, &bad, &p));
  teardown_model(&f);
}
END_TEST

/* Under the reduce strategy a parameter's optimizer state is updated on its
 * owner place only (the other replica keeps its startup value): get_params
 * and checkpoints take it from the owner, so training resumed from a
 * checkpoint goes on bit for bit. And one strategy trains a model: a
 * training program of another is refused, naming both; an evaluation
 * program of any strategy is not. */
START_TEST(reduce_state_is_read_from_its_owner) {
  fixture f;
  setup_model(&f, "mlp-r0");
  f.train_h = register_on(f.c, &f.m, "red", "cpu:2", PE_C_REDUCE, PE_C_REDUCE);
  params_copy saved, straight;
  check_resume(&f, "red", &saved, &straight);
  params_free(&saved);
  params_free(&straight);
  const char *keep[] = {f.m.loss};
  pe_client_register_args a = {.program = f.m.bytes,
                               .program_len = f.m.len,
                               .model = "red",
                               .places = "cpu:2",
                               .strategy = PE_C_ALLREDUCE,
                               .seed = 3,
                               .keep = keep,
                               .n_keep = 1};
  pe_client_program p;
  int rc = pe_client_register(f.c, &a, &p);
  ck_assert_msg(rc == PE_C_EINVAL &&
                    strstr(pe_client_error(f.c),
                           "model 'red' is trained with the reduce strategy on cpu:2") &&
                    strstr(pe_client_error(f.c), "asks for allreduce"),
                "rc %d: %s", rc, pe_client_error(f.c));
  a.for_test = true;
  CD_OK(f.c, pe_client_register(f.c, &a, &p));
  teardown_model(&f);
}
END_TEST

/* One handle per thread: two threads train two models (same program, seed
 * and data, different namespaces) at the same time; their losses agree
 * step for step, as two separate single-client runs would. */
typedef struct thread_run {
  const cd_daemon *d;
  const pe_model_spec *m;
  const batch *b;
  const char *ns;
  float loss[6];
  int rc;
  char err[512];
} thread_run;

static void *thread_train(void *arg) {
  thread_run *t = arg;
  pe_client *c = pe_client_new();
  pe_client_opts o = {.address = t->d->addr, .timeout_ms = 60000};
  pe_client_program p;
  const char *keep[] = {t->m->loss};
  pe_client_register_args a = {.program = t->m->bytes,
                               .program_len = t->m->len,
                               .model = t->ns,
                               .places = "cpu:1",
                               .seed = 9,
                               .keep = keep,
                               .n_keep = 1};
  t->rc = pe_client_connect(c, &o);
  if (!t->rc) t->rc = pe_client_register(c, &a, &p);
  if (!t->rc) t->rc = pe_client_init(c, p.handle, false, NULL);
  for (int i = 0; i < 6 && !t->rc; i++) {
    pe_client_tensor feeds[2];
    feeds_of(t->m, t->b, feeds);
    const char *fetch[] = {t->m->loss};
    pe_client_run_result r;
    t->rc = pe_client_run(c, p.handle, feeds, 2, fetch, 1, NULL, &r);
    if (!t->rc) t->loss[i] = ((const float *)r.fetched[0].data)[0];
  }
  snprintf(t->err, sizeof t->err, "%s", pe_client_error(c));
  pe_client_free(c);
  return NULL;
}

START_TEST(two_threads_two_handles) {
  cd_daemon d;
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  static batch b;
  batch_fill(&b, 11);
  cd_start(&d);
  thread_run runs[2] = {{.d = &d, .m = &m, .b = &b, .ns = "thread-a"},
                        {.d = &d, .m = &m, .b = &b, .ns = "thread-b"}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_train, &runs[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) ck_assert_msg(runs[i].rc == 0, "%s: %s", runs[i].ns, runs[i].err);
  for (int i = 0; i < 6; i++)
    ck_assert_msg(runs[0].loss[i] == runs[1].loss[i], "step %d: %.9g vs %.9g", i, runs[0].loss[i],
                  runs[1].loss[i]);
  ck_assert(runs[0].loss[5] < runs[0].loss[0]);
  cd_stop(&d);
  pe_model_spec_release(&m);
}
END_TEST

/* A resend interval of 5 ms: the client sends every run again and again
 * while the daemon works on it (same client and request ids). The daemon
 * must apply each run once: the parameters end bit-identical to the same
 * runs from a client that never resends, and the daemon's request counter
 * shows the resends arrived. (Such a handle keeps its socket open: see the
 * note on nanomsg 1.1.5 in client/lib/client.c.) */
/* Returns how many requests the daemon received meanwhile (resends count). */
/* The daemon's status, from a connection of its own (scalars only: the
 * place and model lists die with the connection). */
static pe_client_status daemon_status(const cd_daemon *d) {
  pe_client *c = cd_connect(d);
  pe_client_status st;
  CD_OK(c, pe_client_get_status(c, &st));
  st.places = NULL;
  st.models = NULL;
  st.n_places = st.n_models = 0;
  st.version = NULL;
  pe_client_free(c);
  return st;
}

static uint64_t requests_total(const cd_daemon *d) {
  return daemon_status(d).requests_total; /* includes this status request */
}

/* Copies of a request beyond its first that the reply cache looked at. */
static uint64_t resends_seen(const cd_daemon *d) {
  pe_client_status st = daemon_status(d);
  return st.resends_answered + st.resends_waited + st.resends_stale;
}

static uint64_t train_with_resend(const cd_daemon *d, const pe_model_spec *m, const batch *b,
                                  const char *ns, int resend_ivl_ms, params_copy *out) {
  uint64_t before = requests_total(d);
  pe_client *c = pe_client_new();
  pe_client_opts o = {.address = d->addr, .timeout_ms = 60000, .resend_ivl_ms = resend_ivl_ms};
  CD_OK(c, pe_client_connect(c, &o));
  const char *keep[] = {m->loss};
  pe_client_register_args a = {.program = m->bytes,
                               .program_len = m->len,
                               .model = ns,
                               .places = "cpu:1",
                               .seed = 3,
                               .keep = keep,
                               .n_keep = 1};
  pe_client_program p;
  CD_OK(c, pe_client_register(c, &a, &p));
  CD_OK(c, pe_client_init(c, p.handle, false, NULL));
  pe_client_tensor feeds[2];
  feeds_of(m, b, feeds);
  const char *fetch[] = {m->loss};
  pe_client_run_opts ro = {.steps = 50}; /* runs of ~10+ ms: resent at 5 ms */
  for (int i = 0; i < 3; i++) {
    pe_client_run_result r;
    CD_OK(c, pe_client_run(c, p.handle, feeds, 2, fetch, 1, &ro, &r));
    ck_assert_uint_eq(r.steps, 50);
  }
  fixture f = {.c = c};
  params_get(&f, ns, out);
  pe_client_free(c);
  return requests_total(d) - before - 1;
}

START_TEST(resent_runs_apply_once) {
  cd_daemon d;
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  static batch b;
  batch_fill(&b, 13);
  cd_start(&d);
  params_copy once, resent;
  /* register, init, 3 runs, get_params: 6 requests */
  ck_assert_uint_eq(train_with_resend(&d, &m, &b, "no-resend", 0, &once), 6);
  ck_assert_uint_eq(resends_seen(&d), 0);
  uint64_t received = train_with_resend(&d, &m, &b, "resend-5ms", 5, &resent);
  ck_assert_msg(received > 6, "no resend reached the daemon (%llu requests)",
                (unsigned long long)received);
  /* Counted by the reply cache as answered, waited or stale (a copy still
   * being handled may not be counted yet: at least one, at most all). */
  uint64_t seen = resends_seen(&d);
  ck_assert_msg(seen >= 1 && seen <= received - 6, "%llu resends seen of %llu extra requests",
                (unsigned long long)seen, (unsigned long long)(received - 6));
  ck_assert(params_equal(&once, &resent));
  params_free(&once);
  params_free(&resent);
  cd_stop(&d);
  pe_model_spec_release(&m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_lib");
  TCase *tc = tcase_create("client_lib");
  tcase_add_test(tc, train_steps_lower_the_loss);
  tcase_add_test(tc, eval_matches_in_process);
  tcase_add_test(tc, get_and_set_params);
  tcase_add_test(tc, save_then_load_restores_bits);
  tcase_add_test(tc, load_resumes_the_random_stream);
  tcase_add_test(tc, reduce_state_is_read_from_its_owner);
  tcase_add_test(tc, shm_feeds_equal_inline_feeds);
  tcase_add_test(tc, run_errors_and_deregister);
  tcase_add_test(tc, deregister_needs_ownership);
  tcase_add_test(tc, auto_strategy_is_sharded_on_cpu_and_trains_alike);
  tcase_add_test(tc, two_threads_two_handles);
  tcase_add_test(tc, resent_runs_apply_once);
  suite_add_tcase(s, tc);
  return s;
}

/* LeakSanitizer (ASan builds): with resends, nanomsg 1.1.5's REQ socket
 * can overwrite a stored reply without freeing it (nn_req_in), and a
 * resent handle's socket is never closed (client.c), so chunks inside
 * libnanomsg that resent_runs_apply_once allocates stay unfreed; not ours
 * to fix, so it is suppressed for this suite only. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:nn_chunk_alloc\n";
}

int main(void) {
  cd_require_binary("pe-executord");
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
