/* NCCL across nodes (daemon/cuda/nccl_nodes.h) on one GPU: a node whose
 * peer never comes fails its non-blocking init at the timeout, naming it,
 * instead of blocking for ever; and the cuda backend's make_id gives an id
 * its open accepts the form of. Needs 1 GPU (two nodes need two:
 * test_cuda_nccl_nodes.c). */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include <check.h>
#include <string.h>
#include <time.h>

#include "cuda/nccl_nodes.h"
#include "cuda_test_main.h"
#include "engine/device.h"

START_TEST(lone_node_fails_at_the_timeout) {
  pe_device *dev;
  pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, 0}, NULL, &dev);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
  const pe_node_comm_backend *b = pe_node_comm_backend_of(PE_PLACE_CUDA);
  ck_assert_ptr_nonnull(b);
  uint8_t id[PE_NCCL_NODES_ID_WIRE];
  st = b->make_id(2, id);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
  pe_node_comm t;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  st = b->open(&dev, 1, 0, 2, id, sizeof id, 2000, &t);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ck_assert_msg(st, "node rank 0 of 2 formed alone");
  ck_assert_msg(strstr(pe_status_msg(st), "not every node joined within 2000 ms") &&
                    strstr(pe_status_msg(st), "node rank 0 of 2 joining on cuda:0"),
                "%s", pe_status_msg(st));
  /* It returned (no hang); how long it took is printed, not asserted. */
  printf("lone node: failed after %.1f s: %s\n",
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
         pe_status_msg(st));
  pe_status_free(st);
  pe_device_close(dev);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_nccl_nodes_init");
  TCase *t = tcase_create("init");
  tcase_add_test(t, lone_node_fails_at_the_timeout);
  suite_add_tcase(s, t);
  return s;
}

PE_CUDA_MAIN(suite, 1)

#endif
