/* Parallel executor vs. the sequential reference on the MLP of pe_models.h
 * (784-256-128-10, momentum SGD): the loss curve over 20 steps and the
 * parameters after every step, in every setting of par_equiv.h's matrix
 * (cpu:2; sim:4 with event waits and with producer waits; AllReduce and
 * Reduce and Sharded; fused and unfused all-reduce); the parallel startup against the
 * sequential one; a batch of 3 on 2 and 4 places; the same on sim
 * places treated as device memory (the cuda path); and with the fully
 * connected layers' bias and relu fused into their matmuls on the parallel
 * side (two settings). See par_equiv.h for the data, the tolerances and
 * why. */
#include "check_main.h"
#include "par_equiv.h"

START_TEST(mlp_matches_sequential) {
  eq_run_setting("mlp", &eq_settings[_i]);
}
END_TEST

/* cpu:2 and sim:4. */
static const int startup_rows[] = {0, 3};

START_TEST(mlp_parallel_startup_matches_sequential) {
  eq_startup_check("mlp", &eq_settings[startup_rows[_i]]);
}
END_TEST

/* cpu:2 AllReduce, Reduce and Sharded, sim:4 AllReduce and Reduce with
 * event waits, sim:4 Reduce and Sharded with producer waits. */
static const int uneven_rows[] = {0, 2, 9, 3, 5, 8, 11};

START_TEST(mlp_batch_of_3_matches_one_place) {
  eq_uneven_check("mlp", &eq_settings[uneven_rows[_i]]);
}
END_TEST

/* Device-memory sim places (par_equiv.h): 20 steps in each row, the
 * parallel startup on sim:4 (broadcast, values read back through copies),
 * a batch of 3 on sim:4 (place 3's gradients zeroed through copies, fused
 * buckets and unfused). */
START_TEST(mlp_device_memory_matches_sequential) {
  eq_run_setting("mlp", &eq_devmem_settings[_i]);
}
END_TEST

START_TEST(mlp_device_memory_startup_and_uneven) {
  eq_startup_check("mlp", &eq_devmem_settings[1]);
  eq_uneven_check("mlp", &eq_devmem_settings[1]);
  eq_uneven_check("mlp", &eq_devmem_settings[2]);
}
END_TEST

/* matmul + bias (+ relu) fused on the parallel side only (fuse_conv_act). */
START_TEST(mlp_fused_ops_match_unfused_sequential) {
  eq_run_setting("mlp", &eq_fused_ops_settings[_i]);
}
END_TEST

#define LEN(a) ((int)(sizeof a / sizeof a[0]))

static Suite *suite(void) {
  Suite *s = suite_create("par_equiv_mlp");
  TCase *tc = tcase_create("equiv");
  tcase_add_loop_test(tc, mlp_matches_sequential, 0, EQ_N_SETTINGS);
  tcase_add_loop_test(tc, mlp_parallel_startup_matches_sequential, 0, LEN(startup_rows));
  tcase_add_loop_test(tc, mlp_batch_of_3_matches_one_place, 0, LEN(uneven_rows));
  tcase_add_loop_test(tc, mlp_device_memory_matches_sequential, 0, EQ_N_DEVMEM);
  tcase_add_test(tc, mlp_device_memory_startup_and_uneven);
  tcase_add_loop_test(tc, mlp_fused_ops_match_unfused_sequential, 0, EQ_N_FUSED_OPS);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
