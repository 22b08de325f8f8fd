/* The plan and id wire format of NCCL across the nodes of a job
 * (daemon/cuda/nccl_nodes.h), on the CPU: which GPU leads, the ranks, and
 * the refusal of an id that is not the job's. The communicator itself
 * needs GPUs (test_cuda_nccl_nodes.c). Without PE_HAVE_CUDA the suite is
 * skipped. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend (PE_CUDA=OFF or nvcc not found)\n");
  return 77;
}
#else

#include <check.h>
#include <string.h>

#include "check_main.h"
#include "cuda/nccl_nodes.h"
#include "engine/device.h"

static void expect_error(pe_status *st, const char *needle) {
  ck_assert_msg(st, "accepted; expected '%s'", needle);
  ck_assert_msg(strstr(pe_status_msg(st), needle), "'%s' not in: %s", needle, pe_status_msg(st));
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
}

/* Node rank r of n is NCCL rank r of n; its place 0's GPU leads. */
START_TEST(plan_lead_is_place_0) {
  int gpus[3] = {2, 0, 1};
  pe_nccl_nodes_plan p;
  ck_assert_ptr_null(pe_nccl_nodes_plan_make(1, 3, gpus, 3, &p));
  ck_assert_int_eq(p.nodes, 3);
  ck_assert_int_eq(p.nccl_rank, 1);
  ck_assert_int_eq(p.lead_place, 0);
  ck_assert_int_eq(p.lead_gpu, 2);
  ck_assert_int_eq(p.local, 3);
  ck_assert_ptr_null(pe_nccl_nodes_plan_make(0, 2, gpus + 1, 1, &p));
  ck_assert_int_eq(p.nccl_rank, 0);
  ck_assert_int_eq(p.lead_gpu, 0);
  ck_assert_int_eq(p.local, 1);
}
END_TEST

START_TEST(plan_refuses_bad_input) {
  int gpus[3] = {0, 1, 0}, neg[1] = {-1};
  pe_nccl_nodes_plan p;
  expect_error(pe_nccl_nodes_plan_make(0, 1, gpus, 1, &p), "1 nodes is outside 2..4096");
  expect_error(pe_nccl_nodes_plan_make(2, 2, gpus, 1, &p), "node rank 2 is outside 0..1");
  expect_error(pe_nccl_nodes_plan_make(0, 2, gpus, 0, &p), "0 cuda places on node rank 0");
  expect_error(pe_nccl_nodes_plan_make(0, 2, gpus, 3, &p), "places 0 and 2 are both cuda:0");
  expect_error(pe_nccl_nodes_plan_make(0, 2, neg, 1, &p), "place 0 is cuda:-1");
}
END_TEST

static void make_id(uint8_t id[PE_NCCL_ID_BYTES]) {
  for (int i = 0; i < PE_NCCL_ID_BYTES; i++) id[i] = (uint8_t)(i * 31 + 7);
}

/* What rank 0 encodes, another rank decodes to the same bytes. */
START_TEST(id_round_trip) {
  int gpus[1] = {0};
  pe_nccl_nodes_plan p0, p2;
  ck_assert_ptr_null(pe_nccl_nodes_plan_make(0, 3, gpus, 1, &p0));
  ck_assert_ptr_null(pe_nccl_nodes_plan_make(2, 3, gpus, 1, &p2));
  uint8_t id[PE_NCCL_ID_BYTES], wire[PE_NCCL_NODES_ID_WIRE], back[PE_NCCL_ID_BYTES];
  make_id(id);
  pe_nccl_nodes_id_encode(&p0, id, wire);
  memset(back, 0, sizeof back);
  ck_assert_ptr_null(pe_nccl_nodes_id_decode(&p2, wire, sizeof wire, back));
  ck_assert_mem_eq(back, id, PE_NCCL_ID_BYTES);
}
END_TEST

/* Another length, another magic or another number of nodes is refused,
 * and the output is left alone. */
START_TEST(id_refuses_foreign) {
  int gpus[1] = {0};
  pe_nccl_nodes_plan p0, p1, other;
  ck_assert_ptr_null(pe_nccl_nodes_plan_make(0, 2, gpus, 1, &p0));
  ck_assert_ptr_null(pe_nccl_nodes_plan_make(1, 2, gpus, 1, &p1));
  ck_assert_ptr_null(pe_nccl_nodes_plan_make(0, 3, gpus, 1, &other));
  uint8_t id[PE_NCCL_ID_BYTES], wire[PE_NCCL_NODES_ID_WIRE], back[PE_NCCL_ID_BYTES];
  make_id(id);
  memset(back, 0, sizeof back);
  pe_nccl_nodes_id_encode(&p0, id, wire);
  expect_error(pe_nccl_nodes_id_decode(&p1, wire, sizeof wire - 1, back),
               "rank 0's id is 143 bytes, node rank 1 expects 144");
  expect_error(pe_nccl_nodes_id_decode(&p1, id, PE_NCCL_ID_BYTES, back),
               "rank 0's id is 128 bytes");
  pe_nccl_nodes_id_encode(&other, id, wire);
  expect_error(pe_nccl_nodes_id_decode(&p1, wire, sizeof wire, back),
               "rank 0's id is for 3 nodes, node rank 1 is in a job of 2");
  pe_nccl_nodes_id_encode(&p0, id, wire);
  wire[0] ^= 1;
  expect_error(pe_nccl_nodes_id_decode(&p1, wire, sizeof wire, back), "is not a pe NCCL id");
  for (int i = 0; i < PE_NCCL_ID_BYTES; i++) ck_assert_int_eq(back[i], 0);
}
END_TEST

/* The backend reaches the engine for cuda places only, and its open
 * refuses a foreign id and a non-cuda place before any CUDA call. */
START_TEST(backend_registered_for_cuda) {
  ck_assert_ptr_null(pe_node_comm_backend_of(PE_PLACE_CPU));
  const pe_node_comm_backend *b = pe_node_comm_backend_of(PE_PLACE_CUDA);
  ck_assert_ptr_nonnull(b);
  ck_assert_uint_eq(b->id_bytes, PE_NCCL_NODES_ID_WIRE);
  pe_device cuda0 = {.place = {PE_PLACE_CUDA, 0}}, cpu0 = {.place = {PE_PLACE_CPU, 0}};
  pe_device *devs[1] = {&cuda0};
  uint8_t wire[PE_NCCL_NODES_ID_WIRE] = {0};
  pe_node_comm t;
  expect_error(b->open(devs, 1, 1, 2, wire, sizeof wire, 1000, &t), "is not a pe NCCL id");
  expect_error(b->open(devs, 1, 1, 2, wire, 16, 1000, &t), "rank 0's id is 16 bytes");
  devs[0] = &cpu0;
  expect_error(b->open(devs, 1, 1, 2, wire, sizeof wire, 1000, &t), "place 0 is not a cuda place");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_nccl_nodes_plan");
  TCase *t = tcase_create("plan");
  tcase_add_test(t, plan_lead_is_place_0);
  tcase_add_test(t, plan_refuses_bad_input);
  tcase_add_test(t, id_round_trip);
  tcase_add_test(t, id_refuses_foreign);
  tcase_add_test(t, backend_registered_for_cuda);
  suite_add_tcase(s, t);
  return s;
}

PE_CHECK_MAIN(suite)

#endif
