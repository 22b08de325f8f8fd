/* Parallel executor vs. the sequential reference on the CNN of pe_models.h
 * (two 5x5 conv + max-pool layers, fc1024, dropout made the identity,
 * fc10; momentum SGD): the loss curve over 20 steps and the parameters
 * after every step, in every setting of par_equiv.h's matrix (cpu:2; sim:4
 * with event waits and with producer waits; AllReduce, Reduce and Sharded; fused
 * and unfused all-reduce), and with the convolutions' bias and relu fused
 * into them on the parallel side (two settings); the parallel startup against the sequential
 * one; a batch of 3 on 4 places. See par_equiv.h for the data, the
 * tolerances and why.
 *
 * The CNN's tolerance after the first step. On these generated batches
 * the CNN's loss spikes (4.8, 8.8, 37, then 2.8 and down), and the spike
 * amplifies the rounding differences of oneDNN's kernels, which pick other
 * algorithms per ISA, per batch rows and with or without fused post-ops.
 * Largest relative differences from the sequential run measured over all
 * 15 settings (PE_EQ_TRACE, 2026-11-28, Xeon with AVX-512, oneDNN 2.6.3):
 *   ONEDNN_MAX_CPU_ISA   step 1 loss/params   steps 2-20 loss / params
 *   native, AVX512_CORE  0 / 3e-8             1.1e-7 / 2.7e-7
 *   AVX2                 0 / 3e-8             1.1e-3 / 4.2e-3 (sim:4, fused ops)
 *   SSE41                0 / 3e-8             1.0e-4 / 4.1e-4 (sim:4)
 * Through step 1, whose loss and update are where every executor bug shows
 * (par_equiv.h: > 1e-2 within two steps), the tolerance stays 1e-5; from
 * step 2 on it is CNN_DRIFT_RTOL, 5x the largest measured drift. */
#include "check_main.h"
#include "par_equiv.h"

#define CNN_EXACT_STEPS 1
#define CNN_DRIFT_RTOL 2e-2

/* A setting of the matrix with the CNN's tolerance after the first step. */
static eq_setting cnn_setting(const eq_setting *set) {
  eq_setting c = *set;
  c.drift_after = CNN_EXACT_STEPS;
  c.drift_rtol = CNN_DRIFT_RTOL;
  return c;
}

START_TEST(cnn_matches_sequential) {
  eq_setting set = cnn_setting(&eq_settings[_i]);
  eq_run_setting("cnn", &set);
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
  eq_setting set = cnn_setting(&eq_fused_ops_settings[_i]);
  eq_run_setting("cnn", &set);
}
END_TEST

/* sim:1 with device memory (the cuda:0 shape, par_equiv.h). */
START_TEST(cnn_device_memory_matches_sequential) {
  eq_setting set = cnn_setting(&eq_devmem_settings[0]);
  eq_run_setting("cnn", &set);
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
