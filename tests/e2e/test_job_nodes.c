/* Jobs across nodes, end to end on loopback: 2 and 3 daemons (each with
 * its own socket and state directory) train the MLP data-parallel through
 * libpeclient, each node on its contiguous shard of the global batch.
 *  - every node's parameters are bit-identical after every step;
 *  - they equal one daemon training the global batch on cpu:N, within
 *    summation order, also with shards of 12 and 13 rows;
 *  - both daemons killed, the job formed again from rank 0's checkpoint
 *    trains on as the uninterrupted job, bit for bit; so does a persistent
 *    job whose daemons were stopped and started again;
 *  - kill -9 of one daemon mid-run: the other's run fails naming the peer,
 *    its parameters stay as of the last completed step, it answers ping,
 *    and the job forms again once the node is back; with batch norm, Adam
 *    and a schedule, every persistable (statistics, moments, power
 *    accumulators, the schedule's counter) stays as well;
 *  - a node with another program is refused at rendezvous, naming the
 *    node and the variable; a rank taken twice is refused, and so is, at
 *    once and failing nobody else, a node that comes after the job formed.
 * The job's timeout is 5 s here ([job] timeout). */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_daemon.h"
#include "free_port.h"
#include "pe_client.h"
#include "pe_model_file.h"
#include "pe_models.h"
#include "test_assert.h"

#define GLOBAL 24  /* global batch rows: 12 per node of 2, 8 per node of 3 */
#define MAXROWS 25 /* the uneven global batch: 12 and 13 rows on 2 nodes */
#define STEPS 3
#define MAXN 3
#define CONF "[job]\nhost = 127.0.0.1\ntimeout = 5\n"

typedef struct batch {
  int rows; /* the global batch: GLOBAL unless a test says otherwise */
  float x[MAXROWS * 784];
  int64_t y[MAXROWS];
} batch;

static void batch_fill(batch *b) {
  uint32_t s = 11;
  b->rows = GLOBAL;
  for (int i = 0; i < MAXROWS * 784; i++) {
    s = s * 1664525u + 1013904223u;
    b->x[i] = (float)(s >> 8) / (float)(1u << 24);
  }
  for (int i = 0; i < MAXROWS; i++) b->y[i] = (i * 7) % 10;
}

static batch *batch_new(void) {
  batch *b = malloc(sizeof *b);
  batch_fill(b);
  return b;
}

/* All of a model's values, concatenated in the daemon's name order, and
 * where each one starts. */
typedef struct snap {
  size_t n;
  float *v;
  size_t k;     /* variables */
  char **names; /* [k] */
  size_t *at;   /* [k + 1] byte offsets into v */
} snap;

static void snap_take(pe_client *c, const char *model, snap *s) {
  const pe_client_tensor *v;
  size_t n;
  CD_OK(c, pe_client_get_params(c, model, NULL, 0, &v, &n));
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += v[i].nbytes;
  s->v = malloc(total);
  s->n = total / sizeof(float);
  s->k = n;
  s->names = calloc(n, sizeof *s->names);
  s->at = calloc(n + 1, sizeof *s->at);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy((char *)s->v + at, v[i].data, v[i].nbytes);
    s->names[i] = strdup(v[i].name);
    s->at[i] = at;
    at += v[i].nbytes;
  }
  s->at[n] = at;
}

static void snap_free(snap *s) {
  for (size_t i = 0; i < s->k; i++) free(s->names[i]);
  free(s->names);
  free(s->at);
  free(s->v);
}

/* Batch norm's running statistics: each node's own (of its shard). */
static bool node_own(const char *name) {
  size_t n = strlen(name);
  return (n > 5 && !strcmp(name + n - 5, ".mean")) || (n > 9 && !strcmp(name + n - 9, ".variance"));
}

/* The first variable whose name or bytes differ between a and b, or NULL;
 * but_own: batch norm's statistics left out. */
static const char *snap_diff_but(const snap *a, const snap *b, bool but_own) {
  if (a->k != b->k) return "(the number of variables)";
  for (size_t i = 0; i < a->k; i++) {
    if (but_own && node_own(a->names[i]) && !strcmp(a->names[i], b->names[i])) continue;
    if (strcmp(a->names[i], b->names[i]) || a->at[i + 1] - a->at[i] != b->at[i + 1] - b->at[i] ||
        memcmp((char *)a->v + a->at[i], (char *)b->v + b->at[i], a->at[i + 1] - a->at[i]))
      return a->names[i];
  }
  return NULL;
}

static const char *snap_diff(const snap *a, const snap *b) {
  return snap_diff_but(a, b, false);
}

/* Whether a holds a variable whose name contains part. */
static bool snap_has(const snap *a, const char *part) {
  for (size_t i = 0; i < a->k; i++)
    if (strstr(a->names[i], part)) return true;
  return false;
}

/* One node: its daemon, client, job spec, and what it saw. */
typedef struct node {
  cd_daemon *d;
  pe_client *c;
  const pe_model_spec *m;
  const batch *b;
  int rank, world;
  bool persistent; /* the register's */
  char rendezvous[64];
  uint64_t h;
  int rc;
  char err[1024];
  snap after[STEPS];
} node;

static void node_error(node *n) {
  snprintf(n->err, sizeof n->err, "%s", pe_client_error(n->c));
}

static void *node_register(void *arg) {
  node *n = arg;
  const char *keep[] = {n->m->loss};
  pe_client_register_args a = {.program = n->m->bytes,
                               .program_len = n->m->len,
                               .model = "job-mlp",
                               .places = "cpu:1",
                               .seed = 3,
                               .keep = keep,
                               .n_keep = 1,
                               .job = "j",
                               .job_world = n->world,
                               .job_rank = n->rank,
                               .job_rendezvous = n->rendezvous,
                               .job_token = "secret",
                               .persistent = n->persistent};
  pe_client_program p;
  n->rc = pe_client_register(n->c, &a, &p);
  if (n->rc) {
    node_error(n);
    return NULL;
  }
  n->h = p.handle;
  bool inited;
  n->rc = pe_client_init(n->c, n->h, false, &inited);
  if (n->rc) node_error(n);
  return NULL;
}

/* Node r's shard: rows [r * G / world, (r + 1) * G / world). */
static int node_step(node *n) {
  /* Shards differ by at most one row when the global batch does not divide. */
  int row0 = n->rank * n->b->rows / n->world;
  int rows = (n->rank + 1) * n->b->rows / n->world - row0;
  pe_client_tensor f[2];
  int64_t dims[4] = {rows}; /* the model's image dims ([-1, 784] or [-1, 1, 28, 28]) */
  for (int i = 1; i < n->m->image_ndim; i++) dims[i] = n->m->image_dims[i];
  pe_client_tensor_set(&f[0], n->m->image, PE_B_F32, n->m->image_ndim, dims,
                       n->b->x + (size_t)row0 * 784);
  pe_client_tensor_set(&f[1], n->m->label, PE_B_I64, 2, (int64_t[]){rows, 1}, n->b->y + row0);
  const char *fetch[] = {n->m->loss};
  pe_client_run_result r;
  n->rc = pe_client_run(n->c, n->h, f, 2, fetch, 1, NULL, &r);
  if (n->rc) node_error(n);
  return n->rc;
}

static void *node_train(void *arg) {
  node *n = arg;
  for (int s = 0; s < STEPS; s++) {
    if (node_step(n)) return NULL;
    snap_take(n->c, "job-mlp", &n->after[s]);
  }
  return NULL;
}

static void *node_one_step(void *arg) {
  node_step(arg);
  return NULL;
}

/* fn on every node at once (registers and runs meet in the job). */
static void all(node *ns, int world, void *(*fn)(void *)) {
  pthread_t t[MAXN];
  for (int r = 0; r < world; r++) ck_assert_int_eq(pthread_create(&t[r], NULL, fn, &ns[r]), 0);
  for (int r = 0; r < world; r++) pthread_join(t[r], NULL);
}

static void nodes_start(cd_daemon *d, node *ns, int world, const pe_model_spec *m, const batch *b) {
  int port = free_port();
  for (int r = 0; r < world; r++) {
    cd_start_conf(&d[r], CONF);
    ns[r] = (node){.d = &d[r], .m = m, .b = b, .rank = r, .world = world};
    ns[r].c = cd_connect(&d[r]);
    snprintf(ns[r].rendezvous, sizeof ns[r].rendezvous, "127.0.0.1:%d", port);
  }
}

/* Every node's daemon still answers ping; then all are stopped. */
static void nodes_stop(cd_daemon *d, node *ns, int n) {
  for (int r = 0; r < n; r++) {
    ck_assert_int_eq(pe_client_ping(ns[r].c), 0);
    pe_client_free(ns[r].c);
    cd_stop(&d[r]);
  }
}

/* Two nodes of one job, formed (registered and initialised). */
static void two_nodes_formed(cd_daemon *d, node *ns, const pe_model_spec *m, const batch *b) {
  nodes_start(d, ns, 2, m, b);
  all(ns, 2, node_register);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "register: %s / %s", ns[0].err, ns[1].err);
}

/* Rank 1's daemon dies; rank 0's next step fails naming it. */
static void kill_rank1_then_step_fails(cd_daemon *d, node *ns) {
  kill(d[1].pid, SIGKILL);
  int st;
  ck_assert_int_eq(waitpid(d[1].pid, &st, 0), d[1].pid);
  ck_assert_int_ne(node_step(&ns[0]), 0);
  ck_assert_msg(strstr(ns[0].err, "rank 1"), "error does not name the peer: %s", ns[0].err);
}

/* One daemon on cpu:world trains the global batch for STEPS steps. */
static void single_reference(const pe_model_spec *m, const batch *b, int world, snap *ref) {
  cd_daemon d;
  cd_start(&d);
  pe_client *c = cd_connect(&d);
  char places[16];
  snprintf(places, sizeof places, "cpu:%d", world);
  const char *keep[] = {m->loss};
  pe_client_register_args a = {.program = m->bytes,
                               .program_len = m->len,
                               .model = "one",
                               .places = places,
                               .seed = 3,
                               .keep = keep,
                               .n_keep = 1};
  pe_client_program p;
  CD_OK(c, pe_client_register(c, &a, &p));
  bool inited;
  CD_OK(c, pe_client_init(c, p.handle, false, &inited));
  pe_client_tensor f[2];
  pe_client_tensor_set(&f[0], m->image, PE_B_F32, 2, (int64_t[]){b->rows, 784}, b->x);
  pe_client_tensor_set(&f[1], m->label, PE_B_I64, 2, (int64_t[]){b->rows, 1}, b->y);
  const char *fetch[] = {m->loss};
  for (int s = 0; s < STEPS; s++) {
    pe_client_run_result r;
    CD_OK(c, pe_client_run(c, p.handle, f, 2, fetch, 1, NULL, &r));
    snap_take(c, "one", &ref[s]);
  }
  pe_client_free(c);
  cd_stop(&d);
}

/* world nodes train a global batch of rows rows. */
static void train_job(int world, int rows) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  batch *b = malloc(sizeof *b);
  batch_fill(b);
  b->rows = rows;
  cd_daemon d[MAXN];
  node ns[MAXN];
  nodes_start(d, ns, world, &m, b);
  all(ns, world, node_register);
  for (int r = 0; r < world; r++) {
    if (ns[r].rc) cd_dump_log(&d[r]);
    ck_assert_msg(ns[r].rc == 0, "rank %d: register/init: %s", r, ns[r].err);
  }
  all(ns, world, node_train);
  for (int r = 0; r < world; r++) {
    if (ns[r].rc) cd_dump_log(&d[r]);
    ck_assert_msg(ns[r].rc == 0, "rank %d: train: %s", r, ns[r].err);
  }
  snap ref[STEPS];
  single_reference(&m, b, world, ref);
  for (int s = 0; s < STEPS; s++) {
    snap *s0 = &ns[0].after[s];
    ck_assert_uint_eq(s0->n, ref[s].n);
    for (int r = 1; r < world; r++) {
      ck_assert_uint_eq(ns[r].after[s].n, s0->n);
      ck_assert_msg(!memcmp(ns[r].after[s].v, s0->v, s0->n * sizeof(float)),
                    "step %d: rank %d's parameters differ from rank 0's", s, r);
    }
    /* One daemon on cpu:N sums the places in place order, the job sums
     * the nodes in Gloo's: equal within summation order. */
    double worst = 0, moved = 0;
    for (size_t i = 0; i < s0->n; i++) {
      double dv = fabs((double)s0->v[i] - (double)ref[s].v[i]);
      if (dv > worst) worst = dv;
      if (s == STEPS - 1) moved += fabs((double)s0->v[i] - (double)ns[0].after[0].v[i]);
    }
    ck_assert_msg(worst <= 1e-5, "step %d: the job is %g from one daemon on cpu:%d", s, worst,
                  world);
    if (s == STEPS - 1) ck_assert_msg(moved > 0, "training did not change the parameters");
  }
  for (int r = 0; r < world; r++)
    for (int s = 0; s < STEPS; s++) snap_free(&ns[r].after[s]);
  nodes_stop(d, ns, world);
  for (int s = 0; s < STEPS; s++) snap_free(&ref[s]);
  free(b);
  pe_model_spec_release(&m);
}

START_TEST(test_two_nodes_train_as_one_daemon_on_cpu2) {
  train_job(2, GLOBAL);
}
END_TEST

/* 25 rows on 2 nodes: 12 and 13. The gradients are weighted by the rows
 * (each place's loss gradient is its rows over the global batch's), so the
 * job equals one daemon on the global batch within summation order. */
START_TEST(test_uneven_shards_train_as_one_daemon_on_the_global_batch) {
  train_job(2, MAXROWS);
}
END_TEST

START_TEST(test_three_nodes_train_as_one_daemon_on_cpu3) {
  train_job(3, GLOBAL);
}
END_TEST

START_TEST(test_killed_peer_fails_the_step_and_the_job_forms_again) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  batch *b = malloc(sizeof *b);
  batch_fill(b);
  cd_daemon d[2];
  node ns[2];
  two_nodes_formed(d, ns, &m, b);
  all(ns, 2, node_one_step);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "step: %s / %s", ns[0].err, ns[1].err);
  snap before;
  snap_take(ns[0].c, "job-mlp", &before);

  kill_rank1_then_step_fails(d, ns);
  ck_assert_int_eq(pe_client_ping(ns[0].c), 0);
  snap now;
  snap_take(ns[0].c, "job-mlp", &now);
  ck_assert_uint_eq(now.n, before.n);
  ck_assert_msg(!memcmp(now.v, before.v, now.n * sizeof(float)),
                "the failed step changed rank 0's parameters");
  snap_free(&now);
  /* The broken job refuses further steps until it is formed again. */
  ck_assert_int_ne(node_step(&ns[0]), 0);
  ck_assert_msg(strstr(ns[0].err, "register the program again"), "%s", ns[0].err);

  /* Rank 1 back (its daemon restarted, fresh model): formed again, rank
   * 0's values reach it, and both train on, bit-identical. */
  pe_client_free(ns[1].c);
  cd_spawn(&d[1], (uid_t)-1, (gid_t)-1);
  ns[1].c = cd_connect(&d[1]);
  all(ns, 2, node_register);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "re-form: %s / %s", ns[0].err, ns[1].err);
  snap s1;
  snap_take(ns[1].c, "job-mlp", &s1);
  ck_assert_msg(!memcmp(s1.v, before.v, s1.n * sizeof(float)),
                "the re-formed job did not hand rank 0's values to rank 1");
  snap_free(&s1);
  all(ns, 2, node_one_step);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "step: %s / %s", ns[0].err, ns[1].err);
  snap a0, a1;
  snap_take(ns[0].c, "job-mlp", &a0);
  snap_take(ns[1].c, "job-mlp", &a1);
  ck_assert(!memcmp(a0.v, a1.v, a0.n * sizeof(float)));
  snap_free(&a0);
  snap_free(&a1);
  snap_free(&before);
  nodes_stop(d, ns, 2);
  free(b);
  pe_model_spec_release(&m);
}
END_TEST

/* A model with the state a step changes besides its parameters: batch
 * norm's running statistics, Adam's moments and power accumulators, a
 * learning-rate schedule's step counter. */
#define STATEFUL_LAYERS        \
  "input image 1 28 28\n"      \
  "label label\n"              \
  "conv2d 4 3 pad=1 no_bias\n" \
  "batch_norm act=relu\n"      \
  "pool2d avg global\n"
#define STATEFUL_TAIL                 \
  "fc 10\n"                           \
  "loss softmax_with_cross_entropy\n" \
  "accuracy\n"                        \
  "optimizer adam lr=0.01\n"          \
  "schedule step decay_steps=1 gamma=0.5\n"
static const char STATEFUL_MODEL[] = "name stateful\n" STATEFUL_LAYERS STATEFUL_TAIL;

static void model_from_text(const char *text, pe_model_spec *m) {
  char path[] = "/tmp/pe-job-model-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  char err[256];
  int rc = pe_model_file_load(path, m, err, sizeof err);
  unlink(path);
  ck_assert_msg(rc == 0, "%s", err);
}

/* Two nodes formed on the model of text; returns their batch. */
static batch *job_of_text(const char *text, pe_model_spec *m, cd_daemon *d, node *ns) {
  model_from_text(text, m);
  batch *b = batch_new();
  two_nodes_formed(d, ns, m, b);
  return b;
}

/* The step that fails on the survivor has run its forward pass (batch
 * norm's statistics), its schedule's counter and whatever reads no
 * gradient; every persistable is still as of the last completed step,
 * whether the peer's step failed or the peer died. */
START_TEST(test_failed_step_keeps_every_persistable_as_of_the_last_step) {
  pe_model_spec m;
  cd_daemon d[2];
  node ns[2];
  batch *b = job_of_text(STATEFUL_MODEL, &m, d, ns);
  snap init, before;
  snap_take(ns[0].c, "job-mlp", &init);
  all(ns, 2, node_one_step);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "step: %s / %s", ns[0].err, ns[1].err);
  snap_take(ns[0].c, "job-mlp", &before);
  /* A completed step changes every kind of state named above. */
  ck_assert_msg(snap_has(&before, "mean") && snap_has(&before, "variance") &&
                    snap_has(&before, "BETA1POW") && snap_has(&before, "COUNTER"),
                "the model lacks a kind of state");
  for (size_t i = 0; i < before.k; i++)
    if (strstr(before.names[i], "mean") || strstr(before.names[i], "variance") ||
        strstr(before.names[i], "POW") || strstr(before.names[i], "COUNTER"))
      ck_assert_msg(memcmp((char *)before.v + before.at[i], (char *)init.v + init.at[i],
                           before.at[i + 1] - before.at[i]),
                    "a completed step left '%s' as it was", before.names[i]);

  /* Rank 1's step fails in its forward pass (labels out of range) after
   * both counted the step's rows: rank 0 runs its forward pass, then its
   * exchange fails naming rank 1. */
  batch *bad = malloc(sizeof *bad);
  *bad = *b;
  for (int i = 0; i < MAXROWS; i++) bad->y[i] = 99;
  ns[1].b = bad;
  all(ns, 2, node_one_step);
  ck_assert_msg(ns[0].rc != 0 && ns[1].rc != 0, "a step with bad labels passed");
  ck_assert_msg(strstr(ns[0].err, "rank 1"), "error does not name the peer: %s", ns[0].err);
  snap now;
  snap_take(ns[0].c, "job-mlp", &now);
  const char *diff = snap_diff(&now, &before);
  ck_assert_msg(!diff, "the failed step changed '%s' on rank 0", diff);
  snap_free(&now);
  /* Then (the job formed again) rank 1's daemon dies. */
  ns[1].b = b;
  all(ns, 2, node_register);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "re-form: %s / %s", ns[0].err, ns[1].err);
  kill_rank1_then_step_fails(d, ns);
  snap_take(ns[0].c, "job-mlp", &now);
  diff = snap_diff(&now, &before);
  ck_assert_msg(!diff, "the step that lost its peer changed '%s' on rank 0", diff);
  free(bad);
  snap_free(&init);
  snap_free(&before);
  snap_free(&now);
  pe_client_free(ns[1].c);
  cd_spawn(&d[1], (uid_t)-1, (gid_t)-1);
  ns[1].c = cd_connect(&d[1]);
  nodes_stop(d, ns, 2);
  free(b);
  pe_model_spec_release(&m);
}
END_TEST

/* STATEFUL_MODEL with dropout: the generator's offset is state too. */
static const char DROPOUT_MODEL[] = "name dropout\n" STATEFUL_LAYERS "dropout 0.5\n" STATEFUL_TAIL;

static void steps_on_both(node *ns, int k) {
  for (int s = 0; s < k; s++) {
    all(ns, 2, node_one_step);
    ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "step: %s / %s", ns[0].err, ns[1].err);
  }
}

static void save_on_both(node *ns, const char *name) {
  for (int r = 0; r < 2; r++) CD_OK(ns[r].c, pe_client_save(ns[r].c, "job-mlp", name, NULL, NULL));
}

/* The node's model, outside any job, from its checkpoint `name`. */
static void node_load(node *n, const char *name) {
  pe_client_register_args a = {.program = n->m->bytes,
                               .program_len = n->m->len,
                               .model = "job-mlp",
                               .places = "cpu:1",
                               .seed = 3};
  pe_client_program p;
  CD_OK(n->c, pe_client_register(n->c, &a, &p));
  CD_OK(n->c, pe_client_load(n->c, "job-mlp", name, NULL, NULL));
}

#define BEFORE 2 /* steps before the daemons die */
#define AFTER 2  /* steps after the job formed again */

/* The job forms again, trains AFTER steps, and ends as the uninterrupted
 * job did (ref, rank 0's; freed): rank 0 bit for bit, rank 1 as rank 0
 * but its batch-norm statistics. Then both nodes stop. */
static void reform_and_expect_uninterrupted(cd_daemon *d, node *ns, snap *ref) {
  all(ns, 2, node_register);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "re-form: %s / %s", ns[0].err, ns[1].err);
  steps_on_both(ns, AFTER);
  snap s0, s1;
  snap_take(ns[0].c, "job-mlp", &s0);
  snap_take(ns[1].c, "job-mlp", &s1);
  const char *diff = snap_diff(&s0, ref);
  ck_assert_msg(!diff, "'%s' on rank 0 differs from the uninterrupted job's", diff);
  diff = snap_diff_but(&s1, &s0, true);
  ck_assert_msg(!diff, "'%s' on rank 1 differs from rank 0's", diff);
  snap_free(ref);
  snap_free(&s0);
  snap_free(&s1);
  nodes_stop(d, ns, 2);
}

/* Both daemons die after BEFORE steps (each saved its checkpoint, rank 1
 * one a step older as well); they start again, rank 0 loads its newest,
 * rank 1 its older one, and the job forms: every node takes rank 0's
 * values and generator offset, and AFTER more steps give, bit for bit, the
 * persistables of BEFORE + AFTER steps without interruption on rank 0,
 * and the same on rank 1 (but batch norm's statistics, each node's own). */
START_TEST(test_job_resumes_from_rank0s_checkpoint_as_if_uninterrupted) {
  pe_model_spec m;
  cd_daemon d[2];
  node ns[2];
  batch *b = job_of_text(DROPOUT_MODEL, &m, d, ns);
  steps_on_both(ns, BEFORE + AFTER);
  snap ref;
  snap_take(ns[0].c, "job-mlp", &ref);
  nodes_stop(d, ns, 2);

  two_nodes_formed(d, ns, &m, b);
  steps_on_both(ns, BEFORE - 1);
  save_on_both(ns, "older");
  steps_on_both(ns, 1);
  save_on_both(ns, "newest");
  for (int r = 0; r < 2; r++) {
    kill(d[r].pid, SIGKILL);
    int st;
    ck_assert_int_eq(waitpid(d[r].pid, &st, 0), d[r].pid);
    pe_client_free(ns[r].c);
    cd_spawn(&d[r], (uid_t)-1, (gid_t)-1);
    ns[r].c = cd_connect(&d[r]);
  }
  node_load(&ns[0], "newest");
  node_load(&ns[1], "older");
  reform_and_expect_uninterrupted(d, ns, &ref);
  free(b);
  pe_model_spec_release(&m);
}
END_TEST

/* A persistent job (pe-client train --persistent): both daemons stop
 * (SIGTERM: each writes its model's restart checkpoint) and start again on
 * their state, and the same registers form the job again: each daemon
 * restores its model at the register, every node takes rank 0's values
 * and generator offset, and AFTER more steps give, bit for bit, the
 * persistables of BEFORE + AFTER steps without interruption. */
START_TEST(test_persistent_job_resumes_after_its_daemons_restart) {
  pe_model_spec m;
  cd_daemon d[2];
  node ns[2];
  batch *b = job_of_text(DROPOUT_MODEL, &m, d, ns);
  steps_on_both(ns, BEFORE + AFTER);
  snap ref;
  snap_take(ns[0].c, "job-mlp", &ref);
  nodes_stop(d, ns, 2);

  nodes_start(d, ns, 2, &m, b);
  for (int r = 0; r < 2; r++) ns[r].persistent = true;
  all(ns, 2, node_register);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "register: %s / %s", ns[0].err, ns[1].err);
  steps_on_both(ns, BEFORE);
  for (int r = 0; r < 2; r++) {
    pe_client_free(ns[r].c);
    kill(d[r].pid, SIGTERM);
    int st;
    ck_assert_int_eq(waitpid(d[r].pid, &st, 0), d[r].pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status 0x%x after SIGTERM", r,
                  st);
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/state/models/job-mlp/shutdown.ckpt", d[r].dir);
    ck_assert_msg(access(ckpt, R_OK) == 0, "rank %d wrote no restart checkpoint %s", r, ckpt);
    cd_spawn(&d[r], (uid_t)-1, (gid_t)-1);
    ns[r].c = cd_connect(&d[r]);
  }
  reform_and_expect_uninterrupted(d, ns, &ref);
  free(b);
  pe_model_spec_release(&m);
}
END_TEST

/* A peer that stops answering (SIGSTOP) without dying: the step fails after
 * [job] timeout (5 s here), naming it; nobody hangs. */
START_TEST(test_silent_peer_fails_the_step_after_the_timeout) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  batch *b = malloc(sizeof *b);
  batch_fill(b);
  cd_daemon d[2];
  node ns[2];
  two_nodes_formed(d, ns, &m, b);
  kill(d[1].pid, SIGSTOP);
  ck_assert_int_ne(node_step(&ns[0]), 0);
  kill(d[1].pid, SIGCONT);
  ck_assert_msg(strstr(ns[0].err, "rank 1") && strstr(ns[0].err, "across the job's 2 nodes"), "%s",
                ns[0].err);
  ck_assert_int_eq(pe_client_ping(ns[0].c), 0);
  nodes_stop(d, ns, 2);
  free(b);
  pe_model_spec_release(&m);
}
END_TEST

START_TEST(test_mismatched_program_is_refused_naming_node_and_variable) {
  pe_model_spec m, other;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(pe_model_spec_build("cnn", &other, err, sizeof err) == 0, "%s", err);
  cd_daemon d[2];
  node ns[2];
  nodes_start(d, ns, 2, &m, NULL);
  ns[1].m = &other;
  all(ns, 2, node_register);
  for (int r = 0; r < 2; r++) {
    ck_assert_msg(ns[r].rc != 0, "rank %d joined a job of two programs", r);
    ck_assert_msg(strstr(ns[r].err, "node rank 1 does not match rank 0: variable '"), "rank %d: %s",
                  r, ns[r].err);
  }
  nodes_stop(d, ns, 2);
  pe_model_spec_release(&m);
  pe_model_spec_release(&other);
}
END_TEST

START_TEST(test_rank_taken_twice_is_refused) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  cd_daemon d[3];
  node ns[3];
  nodes_start(d, ns, 3, &m, NULL);
  for (int r = 0; r < 3; r++) ns[r].world = 2;
  ns[2].rank = 1;
  all(ns, 3, node_register);
  int taken = 0;
  for (int r = 0; r < 3; r++)
    if (ns[r].rc && strstr(ns[r].err, "joined twice")) taken++;
  ck_assert_msg(taken >= 1, "no node was told rank 1 joined twice: %s / %s / %s", ns[0].err,
                ns[1].err, ns[2].err);
  nodes_stop(d, ns, 3);
  pe_model_spec_release(&m);
}
END_TEST

START_TEST(test_node_joining_after_the_job_formed_is_refused) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  batch *b = malloc(sizeof *b);
  batch_fill(b);
  cd_daemon d[3];
  node ns[3];
  nodes_start(d, ns, 3, &m, b);
  for (int r = 0; r < 3; r++) ns[r].world = 2;
  all(ns, 2, node_register);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "register: %s / %s", ns[0].err, ns[1].err);
  /* Rank 1 again, from a third daemon whose [job] timeout is a minute, once
   * the job formed: rank 0's store says so at once (a refusal, not a wait
   * for a rendezvous that will not happen). */
  nodes_stop(&d[2], &ns[2], 1);
  cd_start_conf(&d[2], "[job]\nhost = 127.0.0.1\ntimeout = 60\n");
  ns[2].c = cd_connect(&d[2]);
  ns[2].rank = 1;
  node_register(&ns[2]);
  ck_assert_int_ne(ns[2].rc, 0);
  ck_assert_msg(strstr(ns[2].err, "refused this rank: rank 1") &&
                    strstr(ns[2].err, "joined twice: job 'j' formed already with its 2 nodes"),
                "%s", ns[2].err);
  /* The refusal failed nobody else: the job trains on. */
  all(ns, 2, node_one_step);
  ck_assert_msg(ns[0].rc == 0 && ns[1].rc == 0, "step: %s / %s", ns[0].err, ns[1].err);
  nodes_stop(d, ns, 3);
  free(b);
  pe_model_spec_release(&m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("job_nodes");
  TCase *tc = tcase_create("job");
  tcase_add_test(tc, test_two_nodes_train_as_one_daemon_on_cpu2);
  tcase_add_test(tc, test_three_nodes_train_as_one_daemon_on_cpu3);
  tcase_add_test(tc, test_uneven_shards_train_as_one_daemon_on_the_global_batch);
  tcase_add_test(tc, test_killed_peer_fails_the_step_and_the_job_forms_again);
  tcase_add_test(tc, test_failed_step_keeps_every_persistable_as_of_the_last_step);
  tcase_add_test(tc, test_job_resumes_from_rank0s_checkpoint_as_if_uninterrupted);
  tcase_add_test(tc, test_persistent_job_resumes_after_its_daemons_restart);
  tcase_add_test(tc, test_silent_peer_fails_the_step_after_the_timeout);
  tcase_add_test(tc, test_mismatched_program_is_refused_naming_node_and_variable);
  tcase_add_test(tc, test_rank_taken_twice_is_refused);
  tcase_add_test(tc, test_node_joining_after_the_job_formed_is_refused);
  suite_add_tcase(s, tc);
  return s;
}

CD_CHECK_MAIN(suite)
