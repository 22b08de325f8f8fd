/* NCCL across the nodes of a job (daemon/cuda/nccl_nodes.h) on one
 * machine with two GPUs: two threads play two nodes, each with its own GPU
 * as its lead place. Rank 0 makes the id and hands it to rank 1 through a
 * job's rendezvous store (daemon/net/gloo_comm.h, pe_gloo_shared), as the
 * daemons do; then the node communicator sums two buffers of unequal
 * lengths, a node that never comes fails the other's init at the timeout,
 * and a node that gives up (fail) fails the other's all-reduce instead of
 * hanging it. Skipped with fewer than 2 GPUs (a node's GPU is its own). */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include <check.h>
#include <pthread.h>
#include <string.h>

#include "cuda/cuda_ctx.h"
#include "cuda/nccl_nodes.h"
#include "cuda_test_main.h"
#include "engine/device.h"
#include "free_port.h"
#include "net/gloo_comm.h"

enum { NA = 1000003, NB = 17 };

typedef struct node {
  int rank, world, timeout_ms;
  const char *rendezvous;
  bool skip_all_reduce; /* gives up (fail) instead of summing */
  pe_device *dev;
  float *a, *b;
  size_t cap_a, cap_b;
  pe_status *st;     /* the first failure */
  pe_status *second; /* an all-reduce after the failure */
  float host_a[NA], host_b[NB];
} node;

static void *node_main(void *arg) {
  node *n = arg;
  pe_gloo_comm *g = NULL;
  pe_nccl_nodes *c = NULL;
  pe_node_comm t;
  int gpus[1] = {n->rank};
  pe_nccl_nodes_plan p;
  uint8_t id[PE_NCCL_ID_BYTES] = {0}, wire[PE_NCCL_NODES_ID_WIRE], got[PE_NCCL_NODES_ID_WIRE];
  n->st = pe_nccl_nodes_plan_make(n->rank, n->world, gpus, 1, &p);
  if (!n->st && n->rank == 0) n->st = pe_nccl_nodes_new_id(id);
  if (!n->st) {
    pe_nccl_nodes_id_encode(&p, id, wire);
    pe_gloo_shared sh = {PE_NCCL_NODES_ID_KEY, wire, got, sizeof got};
    pe_gloo_opts o = {.job = "nodes",
                      .token = "t",
                      .rendezvous = n->rendezvous,
                      .host = "127.0.0.1",
                      .rank = n->rank,
                      .world_size = n->world,
                      .timeout_ms = n->timeout_ms,
                      .shared = &sh};
    n->st = pe_gloo_comm_new(&o, &g);
  }
  if (!n->st) n->st = pe_nccl_nodes_id_decode(&p, got, sizeof got, id);
  if (!n->st) n->st = pe_nccl_nodes_new(n->dev, &p, id, n->timeout_ms, &t, &c);
  if (!n->st) {
    pe_stream *s = pe_device_stream(n->dev, PE_STREAM_COMM);
    for (int j = 0; j < NA; j++) n->host_a[j] = (float)((n->rank + 1) * (j % 7));
    for (int j = 0; j < NB; j++) n->host_b[j] = (float)((n->rank + 1) * 100 + j);
    n->st = pe_stream_copy(s, n->a, n->host_a, sizeof n->host_a, PE_COPY_H2D);
    if (!n->st) n->st = pe_stream_copy(s, n->b, n->host_b, sizeof n->host_b, PE_COPY_H2D);
    if (!n->st) n->st = pe_stream_sync(s);
    if (!n->st && n->skip_all_reduce) {
      void (*give_up)(void *, const char *) = t.fail; /* check.h defines fail() */
      give_up(t.ctx, "test: this node gives up");
    } else if (!n->st) {
      float *bufs[2] = {n->a, n->b};
      size_t counts[2] = {NA, NB};
      n->st = t.all_reduce(t.ctx, bufs, counts, 2);
      if (n->st) n->second = t.all_reduce(t.ctx, bufs, counts, 2);
    }
    if (!n->st && !n->skip_all_reduce) {
      n->st = pe_stream_copy(s, n->host_a, n->a, sizeof n->host_a, PE_COPY_D2H);
      if (!n->st) n->st = pe_stream_copy(s, n->host_b, n->b, sizeof n->host_b, PE_COPY_D2H);
      if (!n->st) n->st = pe_stream_sync(s);
    }
  }
  pe_nccl_nodes_free(c);
  pe_gloo_comm_free(g);
  return NULL;
}

static node nodes[2];

static void open_node(node *n, int rank, int world, const char *rv, int timeout_ms) {
  memset(n, 0, sizeof *n);
  n->rank = rank;
  n->world = world;
  n->rendezvous = rv;
  n->timeout_ms = timeout_ms;
  pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, rank}, NULL, &n->dev);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
  n->a = pe_device_alloc(n->dev, NA * sizeof(float), &n->cap_a);
  n->b = pe_device_alloc(n->dev, NB * sizeof(float), &n->cap_b);
  ck_assert(n->a && n->b);
}

static void close_node(node *n) {
  pe_status_free(n->st);
  pe_status_free(n->second);
  pe_device_free(n->dev, n->a, n->cap_a);
  pe_device_free(n->dev, n->b, n->cap_b);
  pe_device_close(n->dev);
}

static void run_nodes(int count) {
  pthread_t th[2];
  for (int r = 0; r < count; r++)
    ck_assert_int_eq(pthread_create(&th[r], NULL, node_main, &nodes[r]), 0);
  for (int r = 0; r < count; r++) pthread_join(th[r], NULL);
}

static void rendezvous(char *rv, size_t cap) {
  snprintf(rv, cap, "127.0.0.1:%d", free_port());
}

START_TEST(two_nodes_sum_through_the_store_id) {
  char rv[64];
  rendezvous(rv, sizeof rv);
  for (int r = 0; r < 2; r++) open_node(&nodes[r], r, 2, rv, 60000);
  run_nodes(2);
  for (int r = 0; r < 2; r++) {
    ck_assert_msg(!nodes[r].st, "node %d: %s", r, pe_status_msg(nodes[r].st));
    for (int j = 0; j < NA; j += 4099)
      ck_assert_msg(nodes[r].host_a[j] == (float)(3 * (j % 7)), "node %d a[%d] = %g", r, j,
                    nodes[r].host_a[j]);
    for (int j = 0; j < NB; j++)
      ck_assert_msg(nodes[r].host_b[j] == (float)(300 + 2 * j), "node %d b[%d] = %g", r, j,
                    nodes[r].host_b[j]);
    ck_assert_mem_eq(nodes[r].host_a, nodes[0].host_a, sizeof nodes[0].host_a);
  }
  for (int r = 0; r < 2; r++) close_node(&nodes[r]);
}
END_TEST

/* Rank 1 never starts: rank 0 fails at the rendezvous's timeout (the
 * store) and does not hang. */
START_TEST(missing_node_fails_at_the_timeout) {
  char rv[64];
  rendezvous(rv, sizeof rv);
  open_node(&nodes[0], 0, 2, rv, 3000);
  run_nodes(1);
  ck_assert_msg(nodes[0].st, "rank 0 formed alone");
  close_node(&nodes[0]);
}
END_TEST

/* Rank 1 gives up instead of summing: rank 0's all-reduce fails (an NCCL
 * error or the timeout), and every later one says the communicator is
 * broken. */
START_TEST(node_that_gives_up_fails_the_other) {
  char rv[64];
  rendezvous(rv, sizeof rv);
  for (int r = 0; r < 2; r++) open_node(&nodes[r], r, 2, rv, 5000);
  nodes[1].skip_all_reduce = true;
  run_nodes(2);
  ck_assert_msg(!nodes[1].st, "node 1: %s", pe_status_msg(nodes[1].st));
  ck_assert_msg(nodes[0].st, "node 0's all-reduce succeeded without node 1");
  ck_assert_msg(strstr(pe_status_msg(nodes[0].st), "nccl across nodes"), "%s",
                pe_status_msg(nodes[0].st));
  ck_assert_msg(nodes[0].second && strstr(pe_status_msg(nodes[0].second), "is broken"), "%s",
                nodes[0].second ? pe_status_msg(nodes[0].second) : "(later all-reduce ran)");
  for (int r = 0; r < 2; r++) close_node(&nodes[r]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_nccl_nodes");
  TCase *t = tcase_create("nodes");
  tcase_add_test(t, two_nodes_sum_through_the_store_id);
  tcase_add_test(t, missing_node_fails_at_the_timeout);
  tcase_add_test(t, node_that_gives_up_fails_the_other);
  suite_add_tcase(s, t);
  return s;
}

PE_CUDA_MAIN(suite, 2)

#endif
