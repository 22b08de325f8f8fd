/* End to end, in-process: an MLP built with the program builder, compiled by
 * the train and test pipelines, run by the sequential executor, learns a
 * generated 4-class problem (a random linear teacher in 20-D, samples kept
 * only with a margin, so it is linearly separable) and classifies held-out
 * data with accuracy > 0.95. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "engine/seq_executor.h"
#include "pe_builder.h"
#include "test_assert.h"

enum { DIM = 20, CLASSES = 4, N_TRAIN = 2048, N_TEST = 1024, BATCH = 64, STEPS = 400 };

/* --- generated data ------------------------------------------------------------ */

typedef struct gen {
  uint64_t s;
} gen;

static double gen_uniform(gen *g) {
  uint64_t z = (g->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double gen_normal(gen *g) {
  return sqrt(-2.0 * log(gen_uniform(g))) * cos(6.283185307179586 * gen_uniform(g));
}

typedef struct dataset {
  int n;
  float x[N_TRAIN * DIM];
  int64_t y[N_TRAIN];
} dataset;

/* Teacher scores x.W; keep x only when the best class wins by `margin`. */
static void make_data(gen *g, const float *w, int n, dataset *d) {
  d->n = n;
  for (int i = 0; i < n;) {
    float *x = d->x + i * DIM, s[CLASSES];
    for (int k = 0; k < DIM; k++) x[k] = (float)gen_normal(g);
    int best = 0;
    for (int c = 0; c < CLASSES; c++) {
      s[c] = 0;
      for (int k = 0; k < DIM; k++) s[c] += x[k] * w[k * CLASSES + c];
      if (s[c] > s[best]) best = c;
    }
    float second = -INFINITY;
    for (int c = 0; c < CLASSES; c++)
      if (c != best && s[c] > second) second = s[c];
    if (s[best] - second < 1.0f) continue;
    d->y[i++] = best;
  }
}

/* --- the model and its executors -------------------------------------------------- */

typedef struct run {
  pe_program *train, *eval;
  pe_scope *scope;
  pe_seq_exec *step, *test;
  const char *loss, *correct;
} run;

static void run_setup(run *r, uint64_t seed) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, DIM));
  const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
  pe_b_fc_opts hidden = {.act = PE_B_ACT_RELU};
  const char *h = pe_builder_fc(b, x, 64, &hidden);
  const char *logits = pe_builder_fc(b, h, CLASSES, NULL);
  const char *loss = pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, y, NULL));
  const char *acc = pe_builder_accuracy(b, logits, y, 1);
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  ck_assert_int_eq(pe_builder_momentum(b, 0.05f, 0.9f, false), 0);
  uint8_t *bytes;
  size_t len;
  ck_assert_msg(pe_builder_finish(b, &bytes, &len) == 0, "%s", pe_builder_error(b));
  ck_assert_str_eq(loss, "mean_0.out");
  ck_assert_str_eq(acc, "accuracy_0.out");
  r->loss = "mean_0.out";
  r->correct = "accuracy_0.correct";
  pe_builder_free(b);

  pe_program *p;
  PE_CK_OK(pe_program_decode(bytes, len, &p));
  free(bytes);
  PE_CK_OK(pe_program_clone(p, &r->train));
  PE_CK_OK(pe_program_clone(p, &r->eval));
  pe_program_free(p);
  PE_CK_OK(pe_program_compile(r->train, false));
  PE_CK_OK(pe_program_compile(r->eval, true));
  r->scope = pe_scope_new(NULL);
  pe_exec_opts eo = {.seed = seed, .threads = 1};
  pe_seq_exec *init;
  PE_CK_OK(pe_seq_exec_new(r->train, r->train->startup_block, r->scope, &eo, &init));
  PE_CK_OK(pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL));
  pe_seq_exec_free(init);
  PE_CK_OK(pe_seq_exec_new(r->train, r->train->main_block, r->scope, &eo, &r->step));
  PE_CK_OK(pe_seq_exec_new(r->eval, r->eval->main_block, r->scope, &eo, &r->test));
}

static void run_free(run *r) {
  pe_seq_exec_free(r->step);
  pe_seq_exec_free(r->test);
  pe_scope_free(r->scope);
  pe_program_free(r->train);
  pe_program_free(r->eval);
}

/* One executor run over examples [at, at+n) of d; returns the fetched tensor. */
static const pe_tensor *run_batch(pe_seq_exec *e, const dataset *d, int at, int n,
                                  const char *fetch) {
  pe_tensor xt, yt;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_shape xs = PE_SHAPE(n, DIM), ys = PE_SHAPE(n, 1);
  pe_tensor_view(&xt, PE_F32, &xs, (void *)(d->x + (size_t)at * DIM));
  pe_tensor_view(&yt, PE_I64, &ys, (void *)(d->y + at));
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  const pe_tensor *out;
  PE_CK_OK(pe_seq_exec_run(e, feeds, 2, &fetch, 1, &out));
  return out;
}

/* Train `steps` steps in order over d (wrapping); returns the mean loss of
 * the first and the last 20 steps. */
static void train(run *r, const dataset *d, int steps, double *first, double *last) {
  *first = *last = 0;
  for (int s = 0; s < steps; s++) {
    int at = (s * BATCH) % d->n;
    int n = at + BATCH <= d->n ? BATCH : d->n - at;
    float l = pe_f32(run_batch(r->step, d, at, n, r->loss))[0];
    ck_assert_msg(isfinite(l), "loss %f at step %d", l, s);
    if (s < 20) *first += l / 20;
    if (s >= steps - 20) *last += l / 20;
  }
}

static double accuracy(run *r, const dataset *d) {
  int64_t correct = 0;
  for (int at = 0; at < d->n; at += 300) { /* 300: the last batch is partial */
    int n = d->n - at < 300 ? d->n - at : 300;
    correct += pe_i64(run_batch(r->test, d, at, n, r->correct))[0];
  }
  return (double)correct / d->n;
}

static dataset train_set, test_set;

static void make_sets(void) {
  gen g = {12345};
  float w[DIM * CLASSES];
  for (int i = 0; i < DIM * CLASSES; i++) w[i] = (float)gen_normal(&g);
  make_data(&g, w, N_TRAIN, &train_set);
  make_data(&g, w, N_TEST, &test_set);
}

START_TEST(mlp_learns_linear_teacher) {
  make_sets();
  run r;
  run_setup(&r, 7);
  double before = accuracy(&r, &test_set), first, last;
  train(&r, &train_set, STEPS, &first, &last);
  double after = accuracy(&r, &test_set);
  fprintf(stderr, "train_mlp: held-out accuracy %.4f -> %.4f, loss %.4f -> %.4f in %d steps\n",
          before, after, first, last, STEPS);
  ck_assert_msg(after > 0.95, "held-out accuracy %.4f (before training %.4f)", after, before);
  ck_assert_msg(last < 0.25 * first, "loss went from %.4f to %.4f", first, last);
  /* the eval program reads the parameters the train program updated */
  ck_assert_msg(before < 0.8, "untrained accuracy %.4f is suspiciously high", before);
  run_free(&r);
}
END_TEST

/* Same seed, same data: the sequential executor is deterministic. */
START_TEST(training_is_deterministic) {
  make_sets();
  double loss[2], acc[2];
  for (int i = 0; i < 2; i++) {
    run r;
    run_setup(&r, 99);
    double first;
    train(&r, &train_set, 60, &first, &loss[i]);
    acc[i] = accuracy(&r, &test_set);
    run_free(&r);
  }
  ck_assert_double_eq(loss[0], loss[1]);
  ck_assert_double_eq(acc[0], acc[1]);
}
END_TEST

static Suite *train_suite(void) {
  Suite *s = suite_create("train_mlp");
  TCase *tc = tcase_create("train");
  tcase_add_test(tc, mlp_learns_linear_teacher);
  tcase_add_test(tc, training_is_deterministic);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(train_suite)
