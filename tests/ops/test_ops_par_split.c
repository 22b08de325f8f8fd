/* One split rule for every CPU kernel (ops/cpu/par_min.h): a loop over
 * exactly PE_PAR_MIN elements stays on the calling thread, one over more
 * goes to the kernel's team. The optimizer, clip, dropout and batch_norm
 * kernels are checked beside relu, so that none of them splits at
 * PE_PAR_MIN itself (>=) where the others do not.
 *
 * The probe: which thread wrote an element shows in a denormal result. The
 * OpenMP team is created first with denormals kept, then only the calling
 * thread flushes them (the team keeps the state it was created with,
 * core/fpenv.h). Each op below maps a denormal input d to d (or a multiple
 * of it), so an output element is 0 where the calling thread wrote it and
 * nonzero where a team thread did. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "check_main.h"
#include "core/fpenv.h"
#include "op_harness.h"
#include "ops/cpu/par_min.h"
#include "ops/device_ctx.h"
#include "test_assert.h"

#define DEN 1e-39f /* denormal in f32 (< 1.18e-38) */

static void fill(pe_scope *s, const char *name, pe_shape shape, float v) {
  float *p = pe_f32(ph_set_uniform(s, name, shape, 0, 0, 0));
  for (int64_t i = 0; i < pe_shape_numel(&shape); i++) p[i] = v;
}

/* Output elements from index `from` on that are nonzero: written by a team
 * thread that keeps denormals. Bits, not != 0.0f: with denormals-are-zero
 * the calling thread would compare a denormal equal to 0. */
static int64_t team_written(pe_scope *s, const char *name, int64_t from) {
  const pe_tensor *t = ph_get(s, name);
  int64_t k = 0;
  for (int64_t i = from; i < pe_tensor_numel(t); i++) {
    uint32_t u;
    memcpy(&u, &pe_f32(t)[i], sizeof u);
    k += (u & 0x7fffffffu) != 0;
  }
  return k;
}

/* Run op kind on n elements (shape [n], batch_norm: [1, 2, n/2 / 64, 64]);
 * returns how many output elements a team thread wrote. */
static int64_t run_probe(int kind, int64_t n) {
  pe_scope *s = pe_scope_new(NULL);
  pe_shape sh = kind == 6 ? PE_SHAPE(1, 2, n / 128, 64) : PE_SHAPE(n);
  pe_op_desc *op = NULL;
  const char *out = "w";
  int64_t from = 0;
  fill(s, "w", sh, DEN);
  fill(s, "w@GRAD", sh, 0);
  fill(s, "v", sh, 0);
  fill(s, "m1", sh, 0);
  fill(s, "m2", sh, 0);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.5f});
  ph_set_f32(s, "b1p", PE_SHAPE(1), (float[]){0.9f});
  ph_set_f32(s, "b2p", PE_SHAPE(1), (float[]){0.999f});
  switch (kind) {
    case 0: /* p - lr * 0 */
      op = ph_op("sgd", "Param", "w", "Grad", "w@GRAD", "LearningRate", "lr", NULL, "ParamOut", "w",
                 NULL);
      break;
    case 1: /* p - lr * (0.9 * 0 + 0) */
      op = ph_op("momentum", "Param", "w", "Grad", "w@GRAD", "Velocity", "v", "LearningRate", "lr",
                 NULL, "ParamOut", "w", "VelocityOut", "v", NULL);
      PE_CK_OK(pe_op_set_float(op, "mu", 0.9f));
      break;
    case 2: /* p * 1 - lr_t * 0 / (0 + eps) */
      op = ph_op("adam", "Param", "w", "Grad", "w@GRAD", "LearningRate", "lr", "Moment1", "m1",
                 "Moment2", "m2", "Beta1Pow", "b1p", "Beta2Pow", "b2p", NULL, "ParamOut", "w",
                 "Moment1Out", "m1", "Moment2Out", "m2", "Beta1PowOut", "b1p", "Beta2PowOut", "b2p",
                 NULL);
      break;
    case 3: /* w[0] = 1000: c ~ 1e-3; the rest d * c, still denormal */
      pe_f32(ph_get(s, "w"))[0] = 1000.0f;
      op = ph_op("clip_by_global_norm", "X", "w", NULL, "Out", "y", NULL);
      PE_CK_OK(pe_op_set_float(op, "max_norm", 1.0f));
      out = "y";
      from = 1;
      break;
    case 4: /* is_test, upscale_in_train: x * 1 */
    case 5: /* training with p 0: every element kept, x * 1 */
      op = ph_op("dropout", "X", "w", NULL, "Out", "y", "Mask", "mask", NULL);
      PE_CK_OK(pe_op_set_float(op, "dropout_prob", 0.0f));
      PE_CK_OK(pe_op_set_bool(op, "is_test", kind == 4));
      PE_CK_OK(pe_op_set_string(op, "dropout_implementation", "upscale_in_train"));
      out = "y";
      break;
    case 6: /* running statistics 0 and 1 - eps: x * 1 + 0 per channel */
      fill(s, "scale", PE_SHAPE(2), 1);
      fill(s, "bias", PE_SHAPE(2), 0);
      fill(s, "mean", PE_SHAPE(2), 0);
      fill(s, "var", PE_SHAPE(2), 1);
      op = ph_op("batch_norm", "X", "w", "Scale", "scale", "Bias", "bias", "Mean", "mean",
                 "Variance", "var", NULL, "Y", "y", "MeanOut", "mean", "VarianceOut", "var",
                 "SavedMean", "sm", "SavedVariance", "sv", NULL);
      PE_CK_OK(pe_op_set_bool(op, "is_test", true));
      out = "y";
      break;
    case 7: /* d > 0: d (split at > PE_PAR_MIN before too) */
      op = ph_op("relu", "X", "w", NULL, "Out", "y", NULL);
      out = "y";
      break;
  }
  PE_CK_OK(ph_run_op(s, op, NULL));
  int64_t k = team_written(s, out, from);
  pe_op_desc_free(op);
  pe_scope_free(s);
  return k;
}

static const char *const KINDS[] = {"sgd",     "momentum",      "adam",       "clip_by_global_norm",
                                    "dropout", "dropout train", "batch_norm", "relu"};

START_TEST(exactly_par_min_elements_stay_on_the_calling_thread) {
  /* The harness's team has pe_cpu_cores() threads: one core, nothing to split. */
  if (!pe_fpenv_supported() || pe_cpu_cores() < 2) return;
  int kind = _i;
  ck_assert(pe_fpenv_flush_denormals(false));
  /* Create the team, keeping denormals. */
  int64_t over = PE_PAR_MIN + 128;
  run_probe(kind, over);
  ck_assert(pe_fpenv_flush_denormals(true));
  /* Still split above the threshold, the team's half unflushed ... */
  ck_assert_msg(run_probe(kind, over) > 0, "%s on %lld elements ran on the calling thread",
                KINDS[kind], (long long)over);
  /* ... and on the calling thread alone at it. */
  int64_t k = run_probe(kind, PE_PAR_MIN);
  ck_assert_msg(k == 0, "%s on PE_PAR_MIN = %d elements: %lld written by the OpenMP team",
                KINDS[kind], PE_PAR_MIN, (long long)k);
  ck_assert(!pe_par_split(PE_PAR_MIN) && pe_par_split(PE_PAR_MIN + 1));
  pe_fpenv_flush_denormals(false);
}
END_TEST

static Suite *par_split_suite(void) {
  Suite *s = suite_create("ops_par_split");
  TCase *tc = tcase_create("par_split");
  tcase_add_loop_test(tc, exactly_par_min_elements_stay_on_the_calling_thread, 0, 8);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(par_split_suite)
