/* The Sharded strategy (PE_STRATEGY_SHARDED, graph.h; parallel/sharded.c) against
 * AllReduce on the same program, seed and batches: every loss, parameter
 * and optimizer state bit-identical (why: sharded_test_util.h). Tests:
 *   equivalence   sgd/momentum/adam x cpu:2, cpu:3, sim:4 (both sync rules):
 *                 10 steps on uneven batches (a place gets 0 rows on 4 places)
 *   grad_fetch    a gradient fetched by name is the whole batch's under
 *                 AllReduce, Reduce and Sharded, and one place's
 *   tiny_params   a 1-unit hidden layer: a 1-element parameter, whose
 *                 learning rate and beta pows have its element count and so
 *                 are sliced with it
 *   denormal_velocity  flushed (or kept) denormals exactly as AllReduce's
 *                 optimizer, on cpu and sim, OpenMP teams on the AllReduce
 *                 side */
#include "check_main.h"
#include "sharded_test_util.h"

/* --- equivalence --------------------------------------------------------------------------- */

static const setting SETTINGS[] = {
    {PE_PLACE_CPU, 2, PE_SYNC_WAIT_EVENT, "cpu:2"},
    {PE_PLACE_CPU, 3, PE_SYNC_WAIT_EVENT, "cpu:3"},
    {PE_PLACE_SIM, 4, PE_SYNC_WAIT_EVENT, "sim:4 wait-event"},
    {PE_PLACE_SIM, 4, PE_SYNC_WAIT_PRODUCER, "sim:4 wait-producer"},
};
/* momentum+l2: with weight decay (each slice decays once, as AllReduce's
 * every-place update does). adam+cosine: a learning-rate schedule (every
 * place computes the rate from its own counter; the sharded update reads
 * the rate of its slice's place). adamw+l2+1d: decoupled decay (0.01) on the
 * weights, none on the biases. */
static const char *const OPTS[] = {"sgd",         "momentum",    "adam",
                                   "momentum+l2", "adam+cosine", "adamw+l2+1d"};
enum { N_SETTINGS = 4, N_OPTS = 6 };

/* Loop index i: optimizer i / N_SETTINGS, setting i % N_SETTINGS. */
START_TEST(equivalence) {
  const char *opt = OPTS[_i / N_SETTINGS];
  const setting *st = &SETTINGS[_i % N_SETTINGS];
  pe_runtime *rt = rt_new(2);
  side ar, sh;
  side_new(&ar, rt, opt, BIG, st->kind, st->n, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, opt, BIG, st->kind, st->n, PE_STRATEGY_SHARDED);
  char when[96];
  snprintf(when, sizeof when, "%s %s startup", opt, st->label);
  int n_vars = expect_models_equal(&ar, &sh, when, false);
  /* 4 parameters + learning rate, + 4 velocities, + 4 x (2 moments, 2 pows),
   * + the schedule's step counter */
  ck_assert_int_eq(n_vars, (!strncmp(opt, "adam", 4)       ? 21
                            : !strncmp(opt, "momentum", 8) ? 9
                                                           : 5) +
                               (strstr(opt, "+cosine") ? 1 : 0));
  pe_run_opts ro = {.sync = st->sync};
  float losses[STEPS];
  char curve[STEPS * 12] = "";
  for (int s = 0; s < STEPS; s++) {
    float la = side_step(&ar, s, ROWS[s], &ro), lb = side_step(&sh, s, ROWS[s], &ro);
    ck_assert_msg(isfinite(la), "%s %s step %d: loss %g", opt, st->label, s, la);
    ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0,
                  "%s %s step %d (%d rows): AllReduce loss %.9g, Sharded %.9g", opt, st->label, s,
                  ROWS[s], la, lb);
    snprintf(when, sizeof when, "%s %s after step %d (%d rows)", opt, st->label, s, ROWS[s]);
    expect_models_equal(&ar, &sh, when, true);
    losses[s] = la;
    snprintf(curve + strlen(curve), sizeof curve - strlen(curve), " %.4f", la);
  }
  /* Step 0's batch again: after 10 updates its loss is lower. */
  float again_a = side_step(&ar, 0, ROWS[0], &ro), again_b = side_step(&sh, 0, ROWS[0], &ro);
  ck_assert_msg(memcmp(&again_a, &again_b, sizeof again_a) == 0,
                "%s %s, batch 0 again: %.9g vs %.9g", opt, st->label, again_a, again_b);
  expect_models_equal(&ar, &sh, "after batch 0 again", true);
  if (!strcmp(opt, "adam")) { /* one update per step, not one per chunk */
    ck_assert_float_eq(get1(&sh, "fc_0.w@BETA1POW"), get1(&ar, "fc_0.w@BETA1POW"));
    ck_assert_float_eq_tol(get1(&sh, "fc_0.w@BETA1POW"), powf(0.9f, STEPS + 2), 1e-6f);
  }
  if (strstr(opt, "+cosine")) { /* past warmup and decay: min_lr on every place's replica */
    ck_assert_float_eq(get1(&ar, "learning_rate"), 1e-3f);
    ck_assert_float_eq(get1(&sh, "learning_rate"), 1e-3f);
  }
  fprintf(stderr, "par_sharded %-8s %-19s loss:%s; batch 0 again %.4f\n", opt, st->label, curve,
          again_a);
  ck_assert_msg(again_a < losses[0] - 0.05f, "%s %s: batch 0's loss went from %.4f to %.4f", opt,
                st->label, losses[0], again_a);
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

/* --- fetching a parameter's gradient --------------------------------------------------------- */

/* Run step `step` with n rows, fetching the loss and GRADS into out[0..]. */
static void side_run_grads(side *s, int step, int n, const pe_run_opts *ro, pe_tensor *out) {
  batch *b = malloc(sizeof *b);
  ck_assert_ptr_nonnull(b);
  batch_make(b, step, n, s->nt.in);
  const char *fetch[1 + N_GRADS] = {loss_name};
  for (int k = 0; k < N_GRADS; k++) fetch[1 + k] = GRADS[k];
  PE_CK_OK(pe_par_exec_run(s->step, b->feeds, 2, fetch, 1 + N_GRADS, out, ro, NULL));
  free(b);
}

/* A gradient fetched by name is the whole batch's under every strategy:
 * AllReduce (a place's all-reduced copy), Reduce (the owner's) and Sharded
 * (summed at fetch time: no place holds the sum) give the same bits, and
 * match one place running the whole batch. Loop: cpu:2, sim:4. */
START_TEST(grad_fetch) {
  const setting *st = &SETTINGS[_i == 0 ? 0 : 2];
  pe_runtime *rt = rt_new(2);
  /* The one-place reference gets a one-core budget: with two its kernels
   * would open OpenMP teams, which ThreadSanitizer (uninstrumented libgomp)
   * reports as races. */
  pe_runtime *rt1;
  pe_runtime_opts o1 = {.threads = 2, .cores = 1};
  PE_CK_OK(pe_runtime_new(&o1, &rt1));
  side one, sides[3];
  static const pe_graph_strategy strat[3] = {PE_STRATEGY_ALLREDUCE, PE_STRATEGY_REDUCE,
                                             PE_STRATEGY_SHARDED};
  static const char *const names[3] = {"allreduce", "reduce", "sharded"};
  side_new(&one, rt1, "momentum", BIG, st->kind, 1, PE_STRATEGY_ALLREDUCE);
  for (int k = 0; k < 3; k++) side_new(&sides[k], rt, "momentum", BIG, st->kind, st->n, strat[k]);
  pe_run_opts ro = {.sync = st->sync};
  pe_tensor ref[1 + N_GRADS], got[3][1 + N_GRADS];
  for (int f = 0; f <= N_GRADS; f++) {
    pe_tensor_init(&ref[f]);
    for (int k = 0; k < 3; k++) pe_tensor_init(&got[k][f]);
  }
  for (int s = 0; s < 5; s++) { /* 24, 17, 24, 5, 3 rows: one empty place on sim:4 */
    side_run_grads(&one, s, ROWS[s], &ro, ref);
    for (int k = 0; k < 3; k++) side_run_grads(&sides[k], s, ROWS[s], &ro, got[k]);
    for (int f = 1; f <= N_GRADS; f++) {
      const char *g = GRADS[f - 1];
      ck_assert_msg(pe_shape_equal(&ref[f].shape, &got[0][f].shape), "%s: shape", g);
      for (int k = 1; k < 3; k++)
        ck_assert_msg(pe_tensor_bytes(&got[k][f]) == pe_tensor_bytes(&got[0][f]) &&
                          memcmp(got[k][f].data, got[0][f].data, pe_tensor_bytes(&got[0][f])) == 0,
                      "%s step %d (%d rows): %s differs between allreduce and %s", st->label, s,
                      ROWS[s], g, names[k]);
      double worst = 0, norm = 0;
      for (int64_t i = 0; i < pe_tensor_numel(&ref[f]); i++) {
        double a = pe_f32(&got[2][f])[i], b = pe_f32(&ref[f])[i];
        worst = fmax(worst, fabs(a - b) / fmax(1.0, fabs(b)));
        norm += b * b;
      }
      ck_assert_msg(norm > 0, "%s step %d: %s is all zero", st->label, s, g);
      ck_assert_msg(worst <= 1e-5,
                    "%s step %d (%d rows): %s differs from one place's by %.3g (relative)",
                    st->label, s, ROWS[s], g, worst);
    }
  }
  for (int f = 0; f <= N_GRADS; f++) {
    pe_tensor_release(&ref[f]);
    for (int k = 0; k < 3; k++) pe_tensor_release(&got[k][f]);
  }
  for (int k = 0; k < 3; k++) side_free(&sides[k]);
  side_free(&one);
  pe_runtime_free(rt1);
  pe_runtime_free(rt);
}
END_TEST

/* --- tiny parameters ------------------------------------------------------------------------ */

/* in 3 -> hidden 1 -> CLASSES: fc_0.b has 1 element, fc_0.w 3, fc_1.w 10:
 * every arg of fc_0.b's update (LearningRate, Beta1Pow, ... included) has
 * Param's element count, so the node slices them all; the others keep their
 * [1] args whole. Loop index: adam / momentum on cpu:3 and sim:2. */
START_TEST(tiny_params) {
  static const net TINY = {3, 1};
  const char *opt = _i / 2 ? "momentum" : "adam";
  pe_place_kind kind = _i % 2 ? PE_PLACE_SIM : PE_PLACE_CPU;
  int n = _i % 2 ? 2 : 3;
  pe_runtime *rt = rt_new(2);
  side ar, sh;
  side_new(&ar, rt, opt, TINY, kind, n, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, opt, TINY, kind, n, PE_STRATEGY_SHARDED);
  expect_models_equal(&ar, &sh, "tiny startup", false);
  for (int s = 0; s < STEPS; s++) {
    float la = side_step(&ar, s, ROWS[s], NULL), lb = side_step(&sh, s, ROWS[s], NULL);
    ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0, "tiny %s step %d: %.9g vs %.9g", opt, s, la,
                  lb);
    char when[64];
    snprintf(when, sizeof when, "tiny %s after step %d", opt, s);
    expect_models_equal(&ar, &sh, when, true);
  }
  if (!strcmp(opt, "adam")) { /* 0.9^11: one update per step */
    ck_assert_float_eq(get1(&sh, "fc_0.b@BETA1POW"), get1(&ar, "fc_0.b@BETA1POW"));
    ck_assert_float_eq_tol(get1(&sh, "fc_0.b@BETA1POW"), powf(0.9f, STEPS + 1), 1e-6f);
  }
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

/* --- denormals: the same flushing rule on both paths ------------------------------------------ */

/* The update must flush (or keep) denormals exactly as the per-place
 * optimizer does (core/fpenv.h): it runs on other threads (a pool worker
 * per chunk, or place 0's comm stream on sim) and with a one-thread ctx,
 * where AllReduce's kernel may use an OpenMP team (cores 4 over 2 places).
 * fc_0.w's velocity is set to a denormal and an all-zero batch makes its
 * gradient 0, so v = mu * v: 0 when flushed, mu * v when kept. Loop index:
 * keep_denormals (i / 2) x cpu:2 / sim:2 (i % 2). */
START_TEST(denormal_velocity) {
  int keep = _i / 2;
  pe_place_kind kind = _i % 2 ? PE_PLACE_SIM : PE_PLACE_CPU;
  /* Under TSan no teams: libgomp is not instrumented, so a team's reads
   * of its parent's stack read as races (./pe, run_tsan). */
#ifdef __SANITIZE_THREAD__
  pe_runtime_opts o = {.threads = 2, .cores = 2, .keep_denormals = keep};
#else
  pe_runtime_opts o = {.threads = 2, .cores = 4, .keep_denormals = keep};
#endif
  pe_runtime *rt;
  PE_CK_OK(pe_runtime_new(&o, &rt));
  side ar, sh;
  side_new(&ar, rt, "momentum", BIG, kind, 2, PE_STRATEGY_ALLREDUCE);
  side_new(&sh, rt, "momentum", BIG, kind, 2, PE_STRATEGY_SHARDED);
  int64_t numel = (int64_t)BIG.in * BIG.hidden;
  float *v = malloc((size_t)numel * sizeof(float));
  ck_assert_ptr_nonnull(v);
  const float tiny = 1e-39f; /* denormal: below FLT_MIN = 1.18e-38 */
  for (int64_t k = 0; k < numel; k++) v[k] = tiny;
  pe_tensor vt;
  pe_tensor_init(&vt);
  pe_shape vs = PE_SHAPE(BIG.in, BIG.hidden);
  pe_tensor_view(&vt, PE_F32, &vs, v);
  PE_CK_OK(pe_model_set(ar.m, "fc_0.w@VELOCITY", &vt));
  PE_CK_OK(pe_model_set(sh.m, "fc_0.w@VELOCITY", &vt));
  /* 8 rows of zeros: x^T dh = 0 for fc_0.w. */
  static float x[8 * MAX_IN];
  int64_t y[8] = {0};
  pe_tensor xt, yt, out;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_init(&out);
  pe_shape xs = PE_SHAPE(8, BIG.in), ys = PE_SHAPE(8, 1);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_tensor_view(&yt, PE_I64, &ys, y);
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  const char *fetch = loss_name;
  PE_CK_OK(pe_par_exec_run(ar.step, feeds, 2, &fetch, 1, &out, NULL, NULL));
  PE_CK_OK(pe_par_exec_run(sh.step, feeds, 2, &fetch, 1, &out, NULL, NULL));
  pe_tensor_release(&out);
  expect_models_equal(&ar, &sh, keep ? "denormals kept" : "denormals flushed", true);
  volatile float mu = 0.9f, dn = tiny;
  float want = keep ? mu * dn : 0.0f;
  ck_assert(!keep || (want > 0 && want < 1.17549435e-38f));
  for (int p = 0; p < 2; p++) {
    pe_tensor t;
    pe_tensor_init(&t);
    /* AllReduce's on both places; Sharded's on place 0 (the only one). */
    PE_CK_OK(pe_model_get_place(p ? ar.m : sh.m, "fc_0.w@VELOCITY", p, &t));
    for (int64_t k = 0; k < numel; k += 997)
      ck_assert_msg(pe_f32(&t)[k] == want,
                    "%s keep_denormals %d, place %d: velocity[%lld] = %g, "
                    "want %g",
                    pe_place_kind_name(kind), keep, p, (long long)k, pe_f32(&t)[k], want);
    pe_tensor_release(&t);
  }
  free(v);
  side_free(&sh);
  side_free(&ar);
  pe_runtime_free(rt);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_sharded");
  TCase *tc = tcase_create("sharded");
  tcase_add_loop_test(tc, equivalence, 0, N_OPTS * N_SETTINGS);
  tcase_add_loop_test(tc, grad_fetch, 0, 2);
  tcase_add_loop_test(tc, tiny_params, 0, 4);
  tcase_add_loop_test(tc, denormal_velocity, 0, 4);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
