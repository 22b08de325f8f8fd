/* Parallel executor vs. the sequential reference on the CNN of pe_models.h
 * (two 5x5 conv + max-pool layers, fc1024, dropout made the identity,
 * fc10; momentum SGD): the loss curve over 20 steps and the parameters
 * after every step, in every setting of issue 3's matrix (cpu:2; sim:4
 * with event waits and with producer waits; AllReduce, Reduce and Sharded; fused
 * and unfused all-reduce), and with the convolutions' bias and relu fused
 * into them on the parallel side (two settings); the parallel startup against the sequential
 * one; a batch of 3 on 4 places. See par_equiv.h for the data, the
 * tolerances and why. */
#include "check_main.h"
#include "par_equiv.h"

START_TEST(cnn_matches_sequential) {
  eq_run_setting("cnn", &eq_settings[_i]);
}
END_TEST

START_TEST(cnn_parallel_startup_matches_sequential) {
  eq_startup_check("cnn", &eq_settings[0]);
}
END_TEST

/* sim:4 Reduce, event waits: place 3 gets no sample. */
START_TEST(cnn_batch_of_3_matches_one_place) {
  eq_uneven_check("cnn", &eq_settings[5]);
}
END_TEST

/* conv2d + bias + relu fused on the parallel side only (fuse_conv_act). */
START_TEST(cnn_fused_ops_match_unfused_sequential) {
  eq_run_setting("cnn", &eq_fused_ops_settings[_i]);
}
END_TEST

/* sim:1 with device memory (the cuda:0 shape, par_equiv.h). */
START_TEST(cnn_device_memory_matches_sequential) {
  eq_run_setting("cnn", &eq_devmem_settings[0]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_equiv_cnn");
  TCase *tc = tcase_create("equiv");
  tcase_add_loop_test(tc, cnn_matches_sequential, 0, EQ_N_SETTINGS);
  tcase_add_loop_test(tc, cnn_fused_ops_match_unfused_sequential, 0, EQ_N_FUSED_OPS);
  tcase_add_test(tc, cnn_parallel_startup_matches_sequential);
  tcase_add_test(tc, cnn_batch_of_3_matches_one_place);
  tcase_add_test(tc, cnn_device_memory_matches_sequential);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
