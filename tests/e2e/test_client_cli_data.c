/* pe-client train and eval on the user's own data (--data FILE): an .npz
 * of the model's feeds, with its test/ arrays or a held-out fraction; a
 * CSV with a named label column; regression targets (a model file's
 * `target` and `loss mse`) of one and two values; and the errors of bad
 * inputs, each naming the file, the array or column and the shapes. pe-client run feeds
 * the first rows of the same files. Fashion-MNIST stays the data without
 * --data (test_client_cli.c). Skipped (77) when pe-executord or pe-client
 * is not built. */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_cli.h"
#include "npz_write.h"

/* A classifier of 8 features and 2 classes (batch 32). */
#define MODEL8                                                                            \
  "input x 8\nlabel y\nfc 16 act=relu\nfc 2\nloss softmax_with_cross_entropy\naccuracy\n" \
  "optimizer momentum lr=0.05 mu=0.9\nbatch 32\n"

/* n rows of 8 features from a seeded generator, class 1 when their
 * weighted sum is positive: a problem a small network learns. */
static void separable(int n, unsigned seed, float *x, int64_t *y) {
  static const float w[8] = {1, -2, 0.5f, 1.5f, -1, 0.25f, 2, -0.5f};
  for (int i = 0; i < n; i++) {
    float s = 0;
    for (int k = 0; k < 8; k++) {
      seed = seed * 1103515245u + 12345u;
      x[i * 8 + k] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
      s += w[k] * x[i * 8 + k];
    }
    y[i] = s > 0;
  }
}

/* train --json's final_loss and test_accuracy (NAN when absent). */
static void train_json(cd_daemon *d, const char *args, double *loss, double *acc, double *seen) {
  CLI_OK(d, args);
  const char *j = last_line(d->dir);
  *loss = json_num(j, "final_loss");
  *acc = json_num(j, "test_accuracy");
  *seen = json_num(j, "test_examples");
}

/* A text file trains a tiny causal transformer (the charlm's words): the
 * bytes of a repeating phrase are learnable, so the next-byte accuracy
 * over every position of the validation windows is high and a fraction
 * (not a count per window), and the loss is reported in bits per char. */
START_TEST(text_trains_a_sequence_model) {
  cd_daemon d;
  cd_start(&d);
  char model[256], text[256], args[1024];
  write_model(&d, "tiny_lm",
              "tokens tokens 8\ntargets next 8\nembedding 256 16\npos_embedding\n"
              "transformer_block 2 32 causal\nlayer_norm\nfc 256 num_col_dims=2\n"
              "loss softmax_with_cross_entropy\naccuracy\noptimizer adam lr=0.01\nbatch 16\n",
              model, sizeof model);
  snprintf(text, sizeof text, "%s/phrase.txt", d.dir);
  FILE *f = fopen(text, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 400; i++) fputs("the cat sat. ", f);
  fclose(f);
  snprintf(args, sizeof args, "--json train --model '%s' --data '%s' --epochs 3", model, text);
  CLI_OK(&d, args);
  const char *j = last_line(d.dir);
  double acc = json_num(j, "test_accuracy"), bits = json_num(j, "test_bits_per_char");
  ck_assert_msg(acc > 0.5 && acc <= 1, "%s", j);
  ck_assert_msg(bits > 0 && bits < 4, "%s", j);
  ck_assert_double_eq_tol(json_num(j, "test_loss") / log(2), bits, 1e-3);
  cd_stop(&d);
}
END_TEST

/* An .npz with training arrays x, y and test/x, test/y (deflated): the
 * last-epoch loss of 10 epochs is well below that of 1, and the test
 * split is the file's test/ rows; without test/ arrays a tenth of the
 * rows are held out (--test-fraction 0.25: a quarter). */
START_TEST(npz_loss_falls) {
  cd_daemon d;
  cd_start(&d);
  enum { N = 800, NT = 200 };
  static float x[N * 8], xt[NT * 8];
  static int64_t y[N], yt[NT];
  separable(N, 1, x, y);
  separable(NT, 2, xt, yt);
  char model[256], npz[256], plain[256], args[1024];
  write_model(&d, "m8", MODEL8, model, sizeof model);
  snprintf(npz, sizeof npz, "%s/data.npz", d.dir);
  snprintf(plain, sizeof plain, "%s/plain.npz", d.dir);
  npz_array a[] = {{"x", "<f4", 2, {N, 8}, x, 4, false},
                   {"y", "<i8", 1, {N}, y, 8, false},
                   {"test/x", "<f4", 2, {NT, 8}, xt, 4, false},
                   {"test/y", "<i8", 2, {NT, 1}, yt, 8, false}};
  ck_assert(npz_write(npz, a, 4, true));
  ck_assert(npz_write(plain, a, 2, false));
  double l1, l10, acc, seen;
  snprintf(args, sizeof args, "--json train --model '%s' --model-name one --data '%s' --epochs 1",
           model, npz);
  train_json(&d, args, &l1, &acc, &seen);
  snprintf(args, sizeof args,
           "--json train --model '%s' --model-name ten --data '%s' --epochs 10 --persistent", model,
           npz);
  train_json(&d, args, &l10, &acc, &seen);
  ck_assert_msg(isfinite(l1) && l10 < 0.5 * l1, "loss after 1 epoch %g, after 10 %g", l1, l10);
  ck_assert_msg(acc >= 0.9, "test accuracy %g", acc);
  ck_assert_double_eq(seen, NT);
  /* no test/ arrays: the held-out fraction */
  snprintf(args, sizeof args,
           "--json train --model '%s' --model-name frac --data '%s' --epochs 1 --test-fraction "
           "0.25",
           model, plain);
  train_json(&d, args, &l1, &acc, &seen);
  ck_assert_double_eq(seen, N / 4);
  snprintf(args, sizeof args, "--json train --model '%s' --model-name tenth --data '%s' --epochs 1",
           model, plain);
  train_json(&d, args, &l1, &acc, &seen);
  ck_assert_double_eq(seen, N / 10);
  /* eval holds out the same rows (same --seed) and takes the parameters */
  snprintf(args, sizeof args, "--json eval --model '%s' --model-name ten --data '%s'", model, npz);
  CLI_OK(&d, args);
  ck_assert_msg(json_num(last_line(d.dir), "test_accuracy") >= 0.9 &&
                    strstr(last_line(d.dir), "\"fresh_parameters\":false"),
                "%s", last_line(d.dir));
  cd_stop(&d);
}
END_TEST

/* A CSV of three classes in four features, the label column named and in
 * the middle: test accuracy >= 0.9 on the held-out fifth, through the
 * socket as through shared memory. */
START_TEST(csv_classification) {
  cd_daemon d;
  cd_start(&d);
  char model[256], csv[256], args[1024];
  write_model(&d, "m4",
              "input x 4\nlabel y\nfc 16 act=relu\nfc 3\nloss softmax_with_cross_entropy\n"
              "accuracy\noptimizer momentum lr=0.05 mu=0.9\nbatch 16\n",
              model, sizeof model);
  snprintf(csv, sizeof csv, "%s/iris.csv", d.dir);
  FILE *f = fopen(csv, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "sepal_l,sepal_w,species,petal_l,petal_w\n");
  static const float centre[3][4] = {{0, 0, 0, 0}, {3, 3, 0, 0}, {0, 3, 3, 3}};
  unsigned s = 7;
  for (int i = 0; i < 300; i++) {
    float v[4];
    for (int k = 0; k < 4; k++) {
      s = s * 1103515245u + 12345u;
      v[k] = centre[i % 3][k] + (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    fprintf(f, "%g,%g,%d,%g,%g\n", v[0], v[1], i % 3, v[2], v[3]);
  }
  ck_assert_int_eq(fclose(f), 0);
  const char *feeds[] = {"shm", "socket"};
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args,
             "--json train --model '%s' --model-name c%d --data '%s' --label-column species "
             "--test-fraction 0.2 --epochs 20 --feed %s",
             model, i, csv, feeds[i]);
    double loss, acc, seen;
    train_json(&d, args, &loss, &acc, &seen);
    ck_assert_msg(acc >= 0.9, "--feed %s: test accuracy %g", feeds[i], acc);
    ck_assert_double_eq(seen, 60);
  }
  cd_stop(&d);
}
END_TEST

/* Bad inputs fail (1) before training, naming the file, the array or
 * column and the shapes; usage mistakes are 2. */
START_TEST(bad_inputs_named) {
  cd_daemon d;
  cd_start(&d);
  char model[256], path[256], args[1024];
  write_model(&d, "m8", MODEL8, model, sizeof model);
  static float x[40 * 8], x7[40 * 7];
  static int64_t y[40];
  static int32_t y32[40];
  separable(40, 3, x, y);
  struct {
    const char *file;
    npz_array a[2];
    int n;
    const char *want[2];
  } cases[] = {
      {"shape.npz",
       {{"x", "<f4", 2, {40, 7}, x7, 4, false}, {"y", "<i8", 1, {40}, y, 8, false}},
       2,
       {"shape.npz: array 'x' has shape [40,7]", "the model's feed 'x' needs [N,8]"}},
      {"missing.npz",
       {{"x", "<f4", 2, {40, 8}, x, 4, false}},
       1,
       {"missing.npz has no array 'y'", "the model's feed 'y'"}},
      {"dtype.npz",
       {{"x", "<f4", 2, {40, 8}, x, 4, false}, {"y", "<i4", 1, {40}, y32, 4, false}},
       2,
       {"dtype.npz: array 'y' is i32 [40]", "the model's feed 'y' is i64 [N,1]"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", d.dir, cases[i].file);
    ck_assert(npz_write(path, cases[i].a, cases[i].n, false));
    snprintf(args, sizeof args, "train --model '%s' --data '%s'", model, path);
    ck_assert_int_eq(cli(&d, d.dir, args), 1);
    for (int k = 0; k < 2; k++)
      ck_assert_msg(strstr(slurp(d.dir, "err"), cases[i].want[k]), "%s: %s", cases[i].file,
                    slurp(d.dir, "err"));
  }
  snprintf(path, sizeof path, "%s/cells.csv", d.dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "a,b,c,d,e,f,g,h,y\n1,2,3,4,5,6,7,8,0\n1,2,3,n/a,5,6,7,8,1\n");
  ck_assert_int_eq(fclose(f), 0);
  snprintf(args, sizeof args, "train --model '%s' --data '%s'", model, path);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "cells.csv:3: column 'd': 'n/a' is not a number"), "%s",
                slurp(d.dir, "err"));
  /* a CSV option with an .npz, a split with Fashion-MNIST: usage */
  snprintf(args, sizeof args, "train --model '%s' --data '%s/shape.npz' --label-column y", model,
           d.dir);
  ck_assert_int_eq(cli(&d, d.dir, args), 2);
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --test-fraction 0.2"), 2);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "go with --data FILE"), "%s", slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

/* run --data FILE feeds the file's first rows (--batch of them, or all
 * when the file has fewer) as the model's feeds, which --fetch returns as
 * they are: an .npz's arrays, a CSV's columns around its label column, a
 * text file's windows. Bad files fail naming the file, the array and both
 * shapes; --label-column goes with a CSV only. */
START_TEST(run_feeds_the_files_first_rows) {
  cd_daemon d;
  cd_start(&d);
  enum { N = 40 };
  static float x[N * 8], x7[N * 7];
  static int64_t y[N];
  for (int i = 0; i < N * 8; i++) x[i] = (float)i / 4; /* exact in f32 and in %.9g */
  for (int i = 0; i < N; i++) y[i] = i % 2;
  char model[256], npz[256], csv[256], args[1024];
  write_model(&d, "m8", MODEL8, model, sizeof model);
  snprintf(npz, sizeof npz, "%s/run.npz", d.dir);
  npz_array a[] = {{"x", "<f4", 2, {N, 8}, x, 4, false}, {"y", "<i8", 1, {N}, y, 8, false}};
  ck_assert(npz_write(npz, a, 2, false));
  snprintf(args, sizeof args,
           "--json run --model '%s' --model-name rn --data '%s' --batch 4 --fetch loss,x,y "
           "--keep x,y",
           model, npz);
  CLI_OK(&d, args);
  const char *j = last_line(d.dir);
  ck_assert_msg(strstr(j, "\"batch\":4,"), "%s", j);
  ck_assert_msg(
      strstr(j, "\"x\":{\"dtype\":\"f32\",\"shape\":[4,8],\"values\":[0,0.25,0.5,0.75,1,"), "%s",
      j);
  ck_assert_msg(strstr(j, ",7.75]}"), "%s", j); /* x[4 * 8 - 1], the last value fed */
  ck_assert_msg(strstr(j, "\"y\":{\"dtype\":\"i64\",\"shape\":[4,1],\"values\":[0,1,0,1]}"), "%s",
                j);
  ck_assert_msg(isfinite(json_num(j, "mean_0.out")), "%s", j);
  /* A CSV of 3 rows (fewer than the model's batch 32), label in the middle. */
  snprintf(csv, sizeof csv, "%s/run.csv", d.dir);
  FILE *f = fopen(csv, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "a,b,c,d,cls,e,f,g,h\n");
  for (int r = 0; r < 3; r++) fprintf(f, "%d,1,2,3,%d,4,5,6,%d.5\n", r, 1 - r % 2, r);
  ck_assert_int_eq(fclose(f), 0);
  snprintf(args, sizeof args,
           "--json run --model '%s' --model-name rc --data '%s' --label-column cls --fetch x,y "
           "--keep x,y",
           model, csv);
  CLI_OK(&d, args);
  j = last_line(d.dir);
  ck_assert_msg(strstr(j, "\"batch\":3,"), "%s", j);
  ck_assert_msg(strstr(j, "\"shape\":[3,8],\"values\":[0,1,2,3,4,5,6,0.5,1,1,2,3,4,5,6,1.5,2,"),
                "%s", j);
  ck_assert_msg(strstr(j, "\"y\":{\"dtype\":\"i64\",\"shape\":[3,1],\"values\":[1,0,1]}"), "%s", j);
  /* A text file: windows of the sequence model's T bytes. */
  char lm[256], text[256];
  write_model(&d, "tiny_lm",
              "tokens tokens 4\ntargets next 4\nembedding 256 8\nfc 256 num_col_dims=2\n"
              "loss softmax_with_cross_entropy\naccuracy\noptimizer adam lr=0.01\nbatch 16\n",
              lm, sizeof lm);
  snprintf(text, sizeof text, "%s/abc.txt", d.dir);
  f = fopen(text, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 20; i++) fputs("abcdefgh", f);
  ck_assert_int_eq(fclose(f), 0);
  snprintf(args, sizeof args,
           "--json run --model '%s' --data '%s' --batch 2 --fetch tokens,next --keep tokens,next",
           lm, text);
  CLI_OK(&d, args);
  j = last_line(d.dir);
  ck_assert_msg(strstr(j,
                       "\"tokens\":{\"dtype\":\"i64\",\"shape\":[2,4],\"values\":[97,98,99,100,"
                       "101,102,103,104]}"),
                "%s", j);
  ck_assert_msg(strstr(j, "\"values\":[98,99,100,101,102,103,104,97]}"), "%s", j);
  /* A wrong shape and a missing array name the file, the array, the shapes. */
  char path[256];
  snprintf(path, sizeof path, "%s/run7.npz", d.dir);
  npz_array b7[] = {{"x", "<f4", 2, {N, 7}, x7, 4, false}, {"y", "<i8", 1, {N}, y, 8, false}};
  ck_assert(npz_write(path, b7, 2, false));
  snprintf(args, sizeof args, "run --model '%s' --data '%s'", model, path);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "run7.npz: array 'x' has shape [40,7]") &&
                    strstr(slurp(d.dir, "err"), "the model's feed 'x' needs [N,8]"),
                "%s", slurp(d.dir, "err"));
  ck_assert(npz_write(path, b7 + 1, 1, false));
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "run7.npz has no array 'x'"), "%s",
                slurp(d.dir, "err"));
  snprintf(args, sizeof args, "run --model '%s' --data '%s' --label-column y", model, npz);
  ck_assert_int_eq(cli(&d, d.dir, args), 2);
  ck_assert_int_eq(cli(&d, d.dir, "run --model mlp --label-column y"), 2);
  cd_stop(&d);
}
END_TEST

/* Regression: y = X w + b (+ noise under 0.01) of 4 features in [-1, 1];
 * target o of a wide target uses w rotated by o and b times (o + 1), so
 * the columns differ. */
static const float REG_W[4] = {1.5f, -2, 0.5f, 3}, REG_B = 0.7f;

static void linear_rows(int n, int dout, unsigned seed, float *x, double *y) {
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 4; k++) {
      seed = seed * 1103515245u + 12345u;
      x[i * 4 + k] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    for (int o = 0; o < dout; o++) {
      seed = seed * 1103515245u + 12345u;
      double s = REG_B * (o + 1) + ((double)((seed >> 8) & 0xffff) / 65536.0 - 0.5) * 0.02;
      for (int k = 0; k < 4; k++) s += REG_W[(k + o) % 4] * x[i * 4 + k];
      y[i * dout + o] = s;
    }
  }
}

/* A trained linear model's fc_0.w [4, dout] and fc_0.b [dout] are within
 * 0.05 of the data's. */
static void expect_weights(const cd_daemon *d, const char *model, int dout) {
  pe_client *c = cd_connect(d);
  const char *names[] = {"fc_0.w", "fc_0.b"};
  const pe_client_tensor *v;
  size_t n;
  ck_assert_msg(pe_client_get_params(c, model, names, 2, &v, &n) == 0, "%s", pe_client_error(c));
  ck_assert_uint_eq(n, 2);
  const pe_client_tensor *w = pe_client_find(v, n, "fc_0.w"), *b = pe_client_find(v, n, "fc_0.b");
  ck_assert(w && b && pe_client_tensor_numel(w) == 4 * dout && pe_client_tensor_numel(b) == dout);
  for (int o = 0; o < dout; o++) {
    for (int k = 0; k < 4; k++)
      ck_assert_msg(fabsf(((const float *)w->data)[k * dout + o] - REG_W[(k + o) % 4]) < 0.05f,
                    "%s: w[%d][%d] = %g, the data's %g", model, k, o,
                    ((const float *)w->data)[k * dout + o], REG_W[(k + o) % 4]);
    ck_assert_msg(fabsf(((const float *)b->data)[o] - REG_B * (o + 1)) < 0.05f, "%s: b[%d] = %g",
                  model, o, ((const float *)b->data)[o]);
  }
  pe_client_free(c);
}

/* pe-client with the arguments fmt makes exits rc, its stderr holding want. */
static void fails_with(cd_daemon *d, int rc, const char *want, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fails_with(cd_daemon *d, int rc, const char *want, const char *fmt, ...) {
  char args[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  ck_assert_int_eq(cli(d, d->dir, args), rc);
  ck_assert_msg(strstr(slurp(d->dir, "err"), want), "%s: %s", args, slurp(d->dir, "err"));
}

/* The test loss of freshly initialised parameters (eval of a new name),
 * then that of `epochs` of training: its JSON line. */
static const char *fresh_then_trained(cd_daemon *d, const char *model, const char *name,
                                      const char *data, const char *more, double *fresh) {
  char args[1024];
  snprintf(args, sizeof args, "--json eval --model '%s' --model-name %s-fresh --data '%s' %s",
           model, name, data, more);
  CLI_OK(d, args);
  *fresh = json_num(last_line(d->dir), "test_loss");
  snprintf(args, sizeof args,
           "--json train --model '%s' --model-name %s --data '%s' --epochs 20 --persistent %s",
           model, name, data, more);
  CLI_OK(d, args);
  return last_line(d->dir);
}

/* A model file with `target y` and `loss mse` learns a linear map from an
 * .npz (y f64, narrowed) and from a CSV (the target column in the middle):
 * the test loss falls below 5% of the fresh parameters', the weights come
 * out as the data's, and the figure is the loss (no accuracy: null; run
 * fetches the loss alone). */
START_TEST(regression_learns_a_linear_map) {
  cd_daemon d;
  cd_start(&d);
  enum { N = 400 };
  static float x[N * 4];
  static double y[N];
  linear_rows(N, 1, 11, x, y);
  char model[256], npz[256], csv[256];
  write_model(&d, "lin", "input x 4\ntarget y\nfc 1\nloss mse\noptimizer sgd lr=0.1\nbatch 16\n",
              model, sizeof model);
  snprintf(npz, sizeof npz, "%s/lin.npz", d.dir);
  npz_array a[] = {{"x", "<f4", 2, {N, 4}, x, 4, false}, {"y", "<f8", 1, {N}, y, 8, false}};
  ck_assert(npz_write(npz, a, 2, false));
  double fresh;
  const char *j = fresh_then_trained(&d, model, "ln", npz, "", &fresh);
  double loss = json_num(j, "test_loss");
  ck_assert_msg(isfinite(fresh) && fresh > 0.5 && loss < 0.05 * fresh,
                "fresh test loss %g, trained %g: %s", fresh, loss, j);
  ck_assert_msg(strstr(j, "\"test_accuracy\":null") && strstr(j, "\"final_train_accuracy\":null"),
                "%s", j);
  ck_assert_double_eq(json_num(j, "test_examples"), N / 10);
  expect_weights(&d, "ln", 1);

  snprintf(csv, sizeof csv, "%s/lin.csv", d.dir);
  FILE *f = fopen(csv, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "a,b,price,c,d\n");
  for (int i = 0; i < N; i++)
    fprintf(f, "%.9g,%.9g,%.9g,%.9g,%.9g\n", x[i * 4], x[i * 4 + 1], y[i], x[i * 4 + 2],
            x[i * 4 + 3]);
  ck_assert_int_eq(fclose(f), 0);
  j = fresh_then_trained(&d, model, "lc", csv, "--label-column price", &fresh);
  loss = json_num(j, "test_loss");
  ck_assert_msg(isfinite(fresh) && loss < 0.05 * fresh, "fresh test loss %g, trained %g: %s", fresh,
                loss, j);
  expect_weights(&d, "lc", 1);
  char args[1024];
  snprintf(args, sizeof args, "eval --model '%s' --model-name lc --data '%s' --label-column price",
           model, csv);
  CLI_OK(&d, args);
  /* the text output: the loss in significant digits (the noise's 3e-5 is
   * not 0.0000), no accuracy */
  ck_assert_msg(strstr(slurp(d.dir, "out"), "test loss ") &&
                    !strstr(slurp(d.dir, "out"), "test loss 0.0000") &&
                    !strstr(slurp(d.dir, "out"), "accuracy"),
                "%s", slurp(d.dir, "out"));
  /* run fetches the loss; the model has no accuracy to fetch */
  snprintf(args, sizeof args, "--json run --model '%s' --model-name lc --data '%s'", model, npz);
  CLI_OK(&d, args);
  ck_assert_msg(isfinite(json_num(last_line(d.dir), "mse_loss_0.out")), "%s", last_line(d.dir));
  fails_with(&d, 2, "--fetch accuracy: the model has no accuracy",
             "run --model '%s' --data '%s' --fetch loss,accuracy", model, npz);
  cd_stop(&d);
}
END_TEST

/* A 2-wide target: two CSV columns named in order (the file has them the
 * other way round), or an .npz array [N, 2]; the weights of both outputs
 * come out as the data's. Wrong shapes and dtypes name the file, the
 * array or the columns, and both shapes. */
START_TEST(regression_wide_target_and_errors) {
  cd_daemon d;
  cd_start(&d);
  enum { N = 400 };
  static float x[N * 4], y32[N * 2];
  static double y[N * 2];
  static int64_t yi[N];
  linear_rows(N, 2, 5, x, y);
  for (int i = 0; i < 2 * N; i++) y32[i] = (float)y[i];
  char model[256], npz[256], csv[256];
  write_model(&d, "lin2", "input x 4\ntarget y 2\nfc 2\nloss mse\noptimizer sgd lr=0.1\nbatch 16\n",
              model, sizeof model);
  snprintf(csv, sizeof csv, "%s/two.csv", d.dir);
  FILE *f = fopen(csv, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "a,t1,b,c,t0,d\n");
  for (int i = 0; i < N; i++)
    fprintf(f, "%.9g,%.9g,%.9g,%.9g,%.9g,%.9g\n", x[i * 4], y[i * 2 + 1], x[i * 4 + 1],
            x[i * 4 + 2], y[i * 2], x[i * 4 + 3]);
  ck_assert_int_eq(fclose(f), 0);
  double fresh;
  const char *j = fresh_then_trained(&d, model, "w2c", csv, "--label-column t0,t1", &fresh);
  ck_assert_msg(json_num(j, "test_loss") < 0.05 * fresh, "fresh %g: %s", fresh, j);
  expect_weights(&d, "w2c", 2);
  snprintf(npz, sizeof npz, "%s/two.npz", d.dir);
  npz_array a[] = {{"x", "<f4", 2, {N, 4}, x, 4, false}, {"y", "<f4", 2, {N, 2}, y32, 4, false}};
  ck_assert(npz_write(npz, a, 2, true));
  j = fresh_then_trained(&d, model, "w2n", npz, "", &fresh);
  ck_assert_msg(json_num(j, "test_loss") < 0.05 * fresh, "fresh %g: %s", fresh, j);
  expect_weights(&d, "w2n", 2);

  /* errors: exit 1, before training (usage: 2) */
  npz_array wide[] = {a[0], {"y", "<f4", 2, {N, 1}, y32, 4, false}};
  npz_array ints[] = {a[0], {"y", "<i8", 1, {N}, yi, 8, false}};
  snprintf(npz, sizeof npz, "%s/wide.npz", d.dir);
  ck_assert(npz_write(npz, wide, 2, false));
  fails_with(&d, 1, "wide.npz: array 'y' has shape [400,1]; the model's feed 'y' needs [N,2]",
             "train --model '%s' --data '%s'", model, npz);
  snprintf(npz, sizeof npz, "%s/ints.npz", d.dir);
  ck_assert(npz_write(npz, ints, 2, false));
  fails_with(&d, 1, "ints.npz: array 'y' is i64 [400]; the model's feed 'y' is f32 [N,2]",
             "train --model '%s' --data '%s'", model, npz);
  fails_with(&d, 1,
             "two.csv: --label-column 't0' names 1 column(s); the model's label feed 'y' [-1,2] "
             "takes 2 value(s) per example",
             "train --model '%s' --data '%s' --label-column t0", model, csv);
  fails_with(&d, 1, "two.csv:1: no column 't2' (--label-column)",
             "train --model '%s' --data '%s' --label-column t0,t2", model, csv);
  /* Fashion-MNIST has class labels: a regression target is a usage error */
  fails_with(&d, 2, "the label 'y' is a regression target (f32)", "train --model '%s'", model);
  cd_stop(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_cli_data");
  TCase *tc = tcase_create("client_cli_data");
  tcase_add_test(tc, npz_loss_falls);
  tcase_add_test(tc, text_trains_a_sequence_model);
  tcase_add_test(tc, csv_classification);
  tcase_add_test(tc, bad_inputs_named);
  tcase_add_test(tc, run_feeds_the_files_first_rows);
  tcase_add_test(tc, regression_learns_a_linear_map);
  tcase_add_test(tc, regression_wide_target_and_errors);
  suite_add_tcase(s, tc);
  return s;
}

CLI_CHECK_MAIN(suite)
