/* A job's backend communicator across nodes (server/job/job.h) with a test
 * backend, two nodes as two threads on loopback, no GPU:
 *  - rank 0 alone makes the id; it reaches every node through the job's
 *    store; every node opens the backend on its places with its rank, and
 *    the job lends the backend's table; freeing the job closes it;
 *  - a node whose open fails fails its formation naming its rank;
 *  - a failing device exchange breaks the job (host exchanges refuse
 *    after it) and tells the backend (fail);
 *  - a job on cpu places has no backend table and makes no id;
 *  - a node on another kind of place than rank 0's is refused on every
 *    node, naming it and both kinds, before any backend opens. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "free_port.h"
#include "server/job/job.h"

#define ID_BYTES 24

/* The backend's record of one node. */
typedef struct seen {
  int opens, closes, fails, n_places, nodes;
  char id[ID_BYTES];
} seen;

static struct {
  int makes;
  int fail_rank; /* open fails on this rank; -1: none */
  seen node[2];
} fb;
static pthread_mutex_t fb_mu = PTHREAD_MUTEX_INITIALIZER;

static pe_status *fb_make_id(int nodes, void *id) {
  pthread_mutex_lock(&fb_mu);
  fb.makes++;
  pthread_mutex_unlock(&fb_mu);
  memset(id, 0, ID_BYTES);
  snprintf(id, ID_BYTES, "test-id of %d nodes", nodes);
  return NULL;
}

static pe_status *fb_all_reduce(void *ctx, float *const *bufs, const size_t *counts, int nbuf) {
  (void)ctx;
  (void)bufs;
  (void)counts;
  (void)nbuf;
  return pe_error(PE_EIO, "test backend: peer rank 1 is gone");
}

static void fb_fail(void *ctx, const char *why) {
  (void)why;
  pthread_mutex_lock(&fb_mu);
  ((seen *)ctx)->fails++;
  pthread_mutex_unlock(&fb_mu);
}

static pe_status *fb_open(pe_device *const *devs, int n_places, int rank, int nodes, const void *id,
                          size_t id_len, int timeout_ms, pe_node_comm *table) {
  (void)devs;
  (void)timeout_ms;
  if (rank < 0 || rank > 1 || id_len != ID_BYTES)
    return pe_error(PE_EINVAL, "test backend: rank %d, id of %zu bytes", rank, id_len);
  seen *s = &fb.node[rank];
  pthread_mutex_lock(&fb_mu);
  s->opens++;
  s->n_places = n_places;
  s->nodes = nodes;
  memcpy(s->id, id, ID_BYTES);
  pthread_mutex_unlock(&fb_mu);
  if (rank == fb.fail_rank) return pe_error(PE_EIO, "test backend: cuda:%d unreachable", rank);
  *table = (pe_node_comm){s, rank, nodes, fb_all_reduce, fb_fail};
  return NULL;
}

static void fb_close(pe_node_comm *table) {
  pthread_mutex_lock(&fb_mu);
  ((seen *)table->ctx)->closes++;
  pthread_mutex_unlock(&fb_mu);
}

static const pe_node_comm_backend fake_backend = {ID_BYTES, fb_make_id, fb_open, fb_close};

typedef struct node {
  int rank;
  char rendezvous[64];
  const pe_node_comm_backend *backend;
  pe_place_kind kind;
  pe_srv_job *job;
  pe_status *st;
} node;

static void *node_form(void *arg) {
  node *n = arg;
  Pe__JobSpec spec = PE__JOB_SPEC__INIT;
  spec.name = "j";
  spec.world = 2;
  spec.rank = (uint32_t)n->rank;
  spec.rendezvous = n->rendezvous;
  spec.token = "secret";
  pe_srv_job_self self = {.program_hash = 42,
                          .host = "127.0.0.1",
                          .timeout_ms = 20000,
                          .backend = n->backend,
                          .n_places = 2,
                          .kind = n->kind};
  n->st = pe_srv_job_form(&spec, &self, &n->job);
  return NULL;
}

/* Both nodes form the job: backend b[r] (NULL: cpu places) on node r. */
static void form_mixed(node *ns, const pe_node_comm_backend *const *b, int fail_rank) {
  memset(&fb, 0, sizeof fb);
  fb.fail_rank = fail_rank;
  int port = free_port();
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    ns[r] = (node){.rank = r, .backend = b[r], .kind = b[r] ? PE_PLACE_CUDA : PE_PLACE_CPU};
    snprintf(ns[r].rendezvous, sizeof ns[r].rendezvous, "127.0.0.1:%d", port);
    ck_assert_int_eq(pthread_create(&t[r], NULL, node_form, &ns[r]), 0);
  }
  for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
}

/* Both nodes with backend b, or both on cpu places. */
static void form_two(node *ns, const pe_node_comm_backend *b, int fail_rank) {
  const pe_node_comm_backend *both[2] = {b, b};
  form_mixed(ns, both, fail_rank);
}

START_TEST(id_travels_and_every_node_opens) {
  node ns[2];
  form_two(ns, &fake_backend, -1);
  for (int r = 0; r < 2; r++) {
    ck_assert_msg(!ns[r].st, "rank %d: %s", r, pe_status_msg(ns[r].st));
    const pe_node_comm *d = pe_srv_job_dcomm(ns[r].job);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(d->rank, r);
    ck_assert_int_eq(d->world, 2);
    ck_assert_int_eq(fb.node[r].opens, 1);
    ck_assert_int_eq(fb.node[r].n_places, 2);
    ck_assert_int_eq(fb.node[r].nodes, 2);
    ck_assert_str_eq(fb.node[r].id, "test-id of 2 nodes");
  }
  ck_assert_int_eq(fb.makes, 1);
  for (int r = 0; r < 2; r++) {
    pe_srv_job_free(ns[r].job);
    ck_assert_int_eq(fb.node[r].closes, 1);
  }
}
END_TEST

START_TEST(failed_open_names_the_rank) {
  node ns[2];
  form_two(ns, &fake_backend, 1);
  ck_assert_ptr_nonnull(ns[1].st);
  const char *m = pe_status_msg(ns[1].st);
  ck_assert_msg(strstr(m, "node rank 1 of 2") && strstr(m, "cuda:1 unreachable"), "%s", m);
  ck_assert_ptr_null(ns[1].job);
  ck_assert_int_eq(fb.node[1].closes, 0); /* never opened */
  pe_status_free(ns[1].st);
  ck_assert_msg(!ns[0].st, "%s", pe_status_msg(ns[0].st));
  pe_srv_job_free(ns[0].job);
}
END_TEST

START_TEST(failed_device_exchange_breaks_the_job) {
  node ns[2];
  form_two(ns, &fake_backend, -1);
  for (int r = 0; r < 2; r++) ck_assert_msg(!ns[r].st, "%s", pe_status_msg(ns[r].st));
  const pe_node_comm *d = pe_srv_job_dcomm(ns[0].job);
  float v = 1, *b = &v;
  size_t one = 1;
  pe_status *st = d->all_reduce(d->ctx, &b, &one, 1);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(strstr(pe_status_msg(st), "peer rank 1 is gone"), "%s", pe_status_msg(st));
  pe_status_free(st);
  ck_assert(pe_srv_job_broken(ns[0].job));
  ck_assert_int_eq(fb.node[0].fails, 1);
  const pe_node_comm *h = pe_srv_job_comm(ns[0].job);
  st = h->all_reduce(h->ctx, &b, &one, 1);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(strstr(pe_status_msg(st), "broken"), "%s", pe_status_msg(st));
  pe_status_free(st);
  for (int r = 0; r < 2; r++) pe_srv_job_free(ns[r].job);
}
END_TEST

START_TEST(cpu_job_has_no_backend) {
  node ns[2];
  form_two(ns, NULL, -1);
  for (int r = 0; r < 2; r++) {
    ck_assert_msg(!ns[r].st, "%s", pe_status_msg(ns[r].st));
    ck_assert_ptr_null(pe_srv_job_dcomm(ns[r].job));
    ck_assert_int_eq(fb.node[r].opens, 0);
  }
  ck_assert_int_eq(fb.makes, 0);
  for (int r = 0; r < 2; r++) pe_srv_job_free(ns[r].job);
}
END_TEST

START_TEST(other_kind_of_place_is_refused) {
  node ns[2];
  const pe_node_comm_backend *b[2] = {&fake_backend, NULL};
  form_mixed(ns, b, -1);
  for (int r = 0; r < 2; r++) {
    ck_assert_msg(ns[r].st, "rank %d formed", r);
    const char *m = pe_status_msg(ns[r].st);
    ck_assert_msg(strstr(m, "node rank 1 trains on cpu places and rank 0 on cuda places"), "%s", m);
    ck_assert_ptr_null(ns[r].job);
    ck_assert_int_eq(fb.node[r].opens, 0);
    pe_status_free(ns[r].st);
  }
}
END_TEST

static Suite *job_backend_suite(void) {
  Suite *s = suite_create("job_backend");
  TCase *tc = tcase_create("job_backend");
  tcase_add_test(tc, id_travels_and_every_node_opens);
  tcase_add_test(tc, failed_open_names_the_rank);
  tcase_add_test(tc, failed_device_exchange_breaks_the_job);
  tcase_add_test(tc, cpu_job_has_no_backend);
  tcase_add_test(tc, other_kind_of_place_is_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(job_backend_suite)
