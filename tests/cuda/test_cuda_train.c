/* Training on cuda:0 with the parallel executor against the sequential
 * CPU reference (tests/train/par_equiv.h): the MLP and the CNN, 20 steps
 * each, with both synchronisation strategies, on one GPU and (where there
 * are two) on two with NCCL; the loss of every step and
 * every parameter after every step compared. Parameters go to the GPU with
 * pe_model_set and come back with pe_model_get, the loss through the fetch,
 * so this is the executor's whole cuda path (engine/place_io.h, the scaled
 * loss-gradient seed, feeds on the h2d stream, cuBLAS/cuDNN/own kernels).
 *
 * Tolerance 1e-3 relative, against 1e-5 between cpu and sim places: cuBLAS
 * and cuDNN reduce in other orders and with other algorithms than oneDNN
 * (each kernel is within 1e-4 of the CPU, test_cuda_kernels.c), and 20
 * steps of momentum SGD carry those differences forward. A real bug (a
 * wrong gradient, a missing seed scale, a stale parameter, a fetch read
 * before the kernels finished) moves the loss by > 1e-2 within two steps.
 *
 * Skipped without a GPU; without the CUDA backend too. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include "../train/par_equiv.h"
#include "cuda_test_main.h"

#define CUDA_RTOL 1e-3

/* The cuda:2 rows (NCCL all-reduce per gradient and per bucket, NCCL
 * broadcast of the initial parameters) run where there are 2 GPUs. */
static const eq_setting cuda_rows[] = {
    {"cuda:1 event", PE_PLACE_CUDA, 1, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, false, false,
     CUDA_RTOL},
    {"cuda:1 producer", PE_PLACE_CUDA, 1, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_ALLREDUCE, false,
     false, CUDA_RTOL},
    {"cuda:2 event allreduce", PE_PLACE_CUDA, 2, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, false,
     false, CUDA_RTOL},
    {"cuda:2 producer allreduce fused", PE_PLACE_CUDA, 2, PE_SYNC_WAIT_PRODUCER,
     PE_STRATEGY_ALLREDUCE, true, false, CUDA_RTOL},
};
#define N_ROWS ((int)(sizeof cuda_rows / sizeof cuda_rows[0]))

static bool have_gpus(const eq_setting *set) {
  int n = pe_cuda_device_count(NULL);
  if (n >= set->n_places) return true;
  printf("%s: skipped, %d GPU(s)\n", set->name, n);
  return false;
}

START_TEST(mlp_on_cuda_matches_cpu) {
  if (have_gpus(&cuda_rows[_i])) eq_run_setting("mlp", &cuda_rows[_i]);
}
END_TEST

START_TEST(cnn_on_cuda_matches_cpu) {
  if (have_gpus(&cuda_rows[_i])) eq_run_setting("cnn", &cuda_rows[_i]);
}
END_TEST

/* Parameters initialised on cuda:0 and broadcast by NCCL equal the
 * sequential startup's bit for bit (the random kernels draw the same
 * numbers, test_cuda_kernels.c), then train like it. */
START_TEST(mlp_startup_broadcast_on_cuda) {
  if (have_gpus(&cuda_rows[2])) eq_startup_check("mlp", &cuda_rows[2]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_train");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, mlp_on_cuda_matches_cpu, 0, N_ROWS);
  tcase_add_loop_test(tc, cnn_on_cuda_matches_cpu, 0, N_ROWS);
  tcase_add_test(tc, mlp_startup_broadcast_on_cuda);
  suite_add_tcase(s, tc);
  return s;
}

PE_CUDA_MAIN(suite, 1)

#endif
