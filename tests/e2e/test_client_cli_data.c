/* pe-client train and eval on the user's own data (--data FILE): an .npz
 * of the model's feeds, with its test/ arrays or a held-out fraction; a
 * CSV with a named label column; and the errors of bad inputs, each
 * naming the file, the array or column and the shapes. pe-client run feeds
 * the first rows of the same files. Fashion-MNIST stays the data without
 * --data (test_client_cli.c). Skipped (77) when pe-executord or pe-client
 * is not built. */
#include <check.h>
#include <math.h>
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
  static double x64[40 * 8];
  static int64_t y[40];
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
       {{"x", "<f8", 2, {40, 8}, x64, 8, false}, {"y", "<i8", 1, {40}, y, 8, false}},
       2,
       {"dtype.npz: array 'x' is f64 [40,8]", "the model's feed 'x' is f32 [N,8]"}},
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

static Suite *suite(void) {
  Suite *s = suite_create("client_cli_data");
  TCase *tc = tcase_create("client_cli_data");
  tcase_add_test(tc, npz_loss_falls);
  tcase_add_test(tc, text_trains_a_sequence_model);
  tcase_add_test(tc, csv_classification);
  tcase_add_test(tc, bad_inputs_named);
  tcase_add_test(tc, run_feeds_the_files_first_rows);
  suite_add_tcase(s, tc);
  return s;
}

CLI_CHECK_MAIN(suite)
