/* A job across nodes on cuda places, end to end on one machine with two
 * GPUs: two daemons, each seeing one GPU (CUDA_VISIBLE_DEVICES), form a
 * job on loopback and train the MLP data-parallel on cuda:1 each, every
 * node on its half of the global batch; the gradients cross the nodes
 * through NCCL over the two GPUs (daemon/cuda/nccl_nodes.h), the rows
 * through Gloo.
 *  - after every step both nodes hold bit-identical parameters;
 *  - they equal one daemon training the global batch on cuda:2 (its two
 *    places summed by NCCL within the node), within summation order.
 * Skipped with fewer than 2 GPUs (each node's GPU is its own). */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../e2e/client_daemon.h"
#include "cuda_test_main.h"
#include "free_port.h"
#include "pe_client.h"
#include "pe_models.h"

#define ROWS 24 /* the global batch: 12 rows per node */
#define STEPS 3
#define CONF "[job]\nhost = 127.0.0.1\ntimeout = 60\n"

static float xs[ROWS * 784];
static int64_t ys[ROWS];

/* Every parameter of the model, concatenated in the daemon's name order. */
typedef struct params {
  size_t n;
  float *v;
} params;

static void params_take(pe_client *c, const char *model, params *p) {
  const pe_client_tensor *v;
  size_t n;
  CD_OK(c, pe_client_get_params(c, model, NULL, 0, &v, &n));
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++) bytes += v[i].nbytes;
  p->v = malloc(bytes);
  ck_assert_ptr_nonnull(p->v);
  p->n = bytes / sizeof(float);
  for (size_t i = 0, at = 0; i < n; at += v[i].nbytes, i++)
    memcpy((char *)p->v + at, v[i].data, v[i].nbytes);
}

/* One daemon: its client, its registered program, what it held after
 * each step. */
typedef struct trainer {
  cd_daemon d;
  pe_client *c;
  const pe_model_spec *m;
  const char *places, *model;
  int rank, world; /* world 0: no job */
  char rendezvous[64];
  uint64_t h;
  int row0, rows;
  int rc;
  char err[1024];
  params after[STEPS];
} trainer;

/* visible: the GPU the daemon sees as its cuda:0 (CUDA_VISIBLE_DEVICES,
 * inherited); NULL: the test's own GPUs. */
static void trainer_start(trainer *t, const char *visible) {
  const char *was = getenv("CUDA_VISIBLE_DEVICES");
  char *saved = was ? strdup(was) : NULL;
  if (visible) setenv("CUDA_VISIBLE_DEVICES", visible, 1);
  cd_start_conf(&t->d, CONF);
  if (saved)
    setenv("CUDA_VISIBLE_DEVICES", saved, 1);
  else
    unsetenv("CUDA_VISIBLE_DEVICES");
  free(saved);
  t->c = cd_connect(&t->d);
}

static void *trainer_run(void *arg) {
  trainer *t = arg;
  const char *keep[] = {t->m->loss};
  pe_client_register_args a = {.program = t->m->bytes,
                               .program_len = t->m->len,
                               .model = t->model,
                               .places = t->places,
                               .seed = 3,
                               .keep = keep,
                               .n_keep = 1};
  if (t->world) {
    a.job = "gpu-job";
    a.job_world = t->world;
    a.job_rank = t->rank;
    a.job_rendezvous = t->rendezvous;
    a.job_token = "secret";
  }
  pe_client_program p;
  bool inited;
  t->rc = pe_client_register(t->c, &a, &p);
  if (!t->rc) t->rc = pe_client_init(t->c, p.handle, false, &inited);
  for (int s = 0; s < STEPS && !t->rc; s++) {
    pe_client_tensor f[2];
    pe_client_tensor_set(&f[0], t->m->image, PE_B_F32, 2, (int64_t[]){t->rows, 784},
                         xs + (size_t)t->row0 * 784);
    pe_client_tensor_set(&f[1], t->m->label, PE_B_I64, 2, (int64_t[]){t->rows, 1}, ys + t->row0);
    const char *fetch[] = {t->m->loss};
    pe_client_run_result r;
    t->rc = pe_client_run(t->c, p.handle, f, 2, fetch, 1, NULL, &r);
    if (!t->rc) params_take(t->c, t->model, &t->after[s]);
  }
  if (t->rc) snprintf(t->err, sizeof t->err, "%s", pe_client_error(t->c));
  return NULL;
}

static void trainer_stop(trainer *t) {
  for (int s = 0; s < STEPS; s++) free(t->after[s].v);
  pe_client_free(t->c);
  cd_stop(&t->d);
}

START_TEST(two_gpu_nodes_train_as_one_daemon_on_cuda2) {
  uint32_t seed = 11;
  for (int i = 0; i < ROWS * 784; i++) {
    seed = seed * 1664525u + 1013904223u;
    xs[i] = (float)(seed >> 8) / (float)(1u << 24);
  }
  for (int i = 0; i < ROWS; i++) ys[i] = (i * 7) % 10;
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  static trainer node[2], one;
  int port = free_port();
  for (int r = 0; r < 2; r++) {
    node[r] = (trainer){.m = &m, .places = "cuda:1", .model = "job-mlp", .rank = r, .world = 2};
    node[r].row0 = r * ROWS / 2;
    node[r].rows = ROWS / 2;
    snprintf(node[r].rendezvous, sizeof node[r].rendezvous, "127.0.0.1:%d", port);
    trainer_start(&node[r], r ? "1" : "0");
  }
  pthread_t th[2];
  for (int r = 0; r < 2; r++)
    ck_assert_int_eq(pthread_create(&th[r], NULL, trainer_run, &node[r]), 0);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++) {
    if (node[r].rc) cd_dump_log(&node[r].d);
    ck_assert_msg(node[r].rc == 0, "rank %d: %s", r, node[r].err);
  }
  one = (trainer){.m = &m, .places = "cuda:2", .model = "one", .rows = ROWS};
  trainer_start(&one, NULL);
  trainer_run(&one);
  if (one.rc) cd_dump_log(&one.d);
  ck_assert_msg(one.rc == 0, "one daemon on cuda:2: %s", one.err);
  for (int s = 0; s < STEPS; s++) {
    const params *a = &node[0].after[s], *b = &node[1].after[s], *ref = &one.after[s];
    ck_assert_uint_eq(a->n, b->n);
    ck_assert_uint_eq(a->n, ref->n);
    ck_assert_msg(!memcmp(a->v, b->v, a->n * sizeof(float)),
                  "step %d: rank 1's parameters differ from rank 0's", s);
    /* NCCL sums the two GPUs in its own order in both set-ups (across
     * nodes, within the node): equal within summation order. */
    double worst = 0;
    for (size_t i = 0; i < a->n; i++) {
      double d = fabs((double)a->v[i] - (double)ref->v[i]);
      if (d > worst) worst = d;
    }
    ck_assert_msg(worst <= 1e-5, "step %d: the job is %g from one daemon on cuda:2", s, worst);
  }
  double moved = 0;
  for (size_t i = 0; i < node[0].after[0].n; i++)
    moved += fabs((double)node[0].after[STEPS - 1].v[i] - (double)node[0].after[0].v[i]);
  ck_assert_msg(moved > 0, "training did not change the parameters");
  for (int r = 0; r < 2; r++) trainer_stop(&node[r]);
  trainer_stop(&one);
  pe_model_spec_release(&m);
}
END_TEST

static Suite *job_nodes_suite(void) {
  cd_require_binary("pe-executord");
  Suite *s = suite_create("cuda_job_nodes");
  TCase *tc = tcase_create("cuda_job_nodes");
  tcase_add_test(tc, two_gpu_nodes_train_as_one_daemon_on_cuda2);
  suite_add_tcase(s, tc);
  return s;
}

PE_CUDA_MAIN(job_nodes_suite, 2)

#endif
