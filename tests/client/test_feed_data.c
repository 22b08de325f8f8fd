/* The user's data as feed rows (pe_feed_data.h): .npz arrays of any
 * declared shape and an f32 label (regression), f64 narrowed to f32 feeds,
 * CSV regression (one or several target columns) and class columns, a text file's windows for a
 * byte-level language model, the held-out split, the prefetcher over rows, and the errors, each
 * naming the file, the array or column and the shapes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "npz_write.h"
#include "pe_batch_prefetch.h"
#include "pe_builder.h"
#include "pe_feed_data.h"

static char dir[] = "/tmp/pe-feed-data-XXXXXX";

static void setup(void) {
  strcpy(dir, "/tmp/pe-feed-data-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static const char *path_of(const char *name) {
  static char p[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

static void write_text(const char *name, const char *text, size_t len) {
  FILE *f = fopen(path_of(name), "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

/* The feeds x and y of a program declaring them (dtype, dims each). */
static void feeds(pe_b_dtype xt, int xn, const int64_t *xd, pe_b_dtype yt, int yn,
                  const int64_t *yd, pe_feed_decl *x, pe_feed_decl *y) {
  pe_builder *b = pe_builder_new();
  ck_assert_ptr_nonnull(pe_builder_data(b, "x", xt, xn, xd));
  ck_assert_ptr_nonnull(pe_builder_data(b, "y", yt, yn, yd));
  uint8_t *bytes;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
  char err[256];
  ck_assert_msg(pe_program_feed(bytes, len, "x", x, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(pe_program_feed(bytes, len, "y", y, err, sizeof err) == 0, "%s", err);
  pe_feed_decl none;
  ck_assert_int_eq(pe_program_feed(bytes, len, "nope", &none, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "no variable 'nope'"), "%s", err);
  free(bytes);
  pe_builder_free(b);
}

/* A regression .npz: f32 [N,2,3] inputs, f32 [N] targets for a [-1,1]
 * feed; deflated and stored alike; the rows as written. */
START_TEST(npz_regression_rows) {
  pe_feed_decl x, y;
  feeds(PE_B_F32, PE_B_SHAPE(-1, 2, 3), PE_B_F32, PE_B_SHAPE(-1, 1), &x, &y);
  float xv[5 * 6], yv[5];
  for (int i = 0; i < 30; i++) xv[i] = (float)i * 0.5f;
  for (int i = 0; i < 5; i++) yv[i] = (float)i - 2.5f;
  for (int deflate = 0; deflate < 2; deflate++) {
    npz_array a[] = {{"x", "<f4", 3, {5, 2, 3}, xv, 4, false}, {"y", "<f4", 1, {5}, yv, 4, false}};
    ck_assert(npz_write(path_of("r.npz"), a, 2, deflate));
    pe_feed_data *d;
    char err[512];
    ck_assert_msg(pe_npz_read(path_of("r.npz"), "", &x, &y, &d, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(d->n, 5);
    ck_assert_int_eq(d->y.ndim, 2); /* [5] read as [5,1] */
    float gx[2 * 6], gy[2];
    const int64_t idx[] = {3, 1};
    pe_feed_data_gather(d, idx, 0, 2, gx, gy);
    ck_assert(!memcmp(gx, xv + 18, 6 * sizeof(float)) &&
              !memcmp(gx + 6, xv + 6, 6 * sizeof(float)));
    ck_assert(gy[0] == yv[3] && gy[1] == yv[1]);
    /* no test/ arrays: 1, no message needed */
    pe_feed_data *t;
    ck_assert_int_eq(pe_npz_read(path_of("r.npz"), "test/", &x, &y, &t, err, sizeof err), 1);
    pe_feed_data_free(d);
  }
}
END_TEST

/* f64 arrays (numpy's default) fill f32 feeds, narrowed: a [N,2,3] input
 * and a [N,2] target, the values as (float) of the doubles. */
START_TEST(npz_f64_narrowed) {
  pe_feed_decl x, y;
  feeds(PE_B_F32, PE_B_SHAPE(-1, 2, 3), PE_B_F32, PE_B_SHAPE(-1, 2), &x, &y);
  double xv[4 * 6], yv[4 * 2];
  for (int i = 0; i < 24; i++) xv[i] = 0.1 * i - 1;
  for (int i = 0; i < 8; i++) yv[i] = 1e3 / (i + 1);
  npz_array a[] = {{"x", "<f8", 3, {4, 2, 3}, xv, 8, false}, {"y", "<f8", 2, {4, 2}, yv, 8, false}};
  ck_assert(npz_write(path_of("f.npz"), a, 2, true));
  pe_feed_data *d;
  char err[512];
  ck_assert_msg(pe_npz_read(path_of("f.npz"), "", &x, &y, &d, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(d->x.dtype, PE_B_F32);
  ck_assert_uint_eq(d->x.row_bytes, 6 * sizeof(float));
  ck_assert_uint_eq(d->y.row_bytes, 2 * sizeof(float));
  for (int i = 0; i < 24; i++) ck_assert(((const float *)d->x.data)[i] == (float)xv[i]);
  for (int i = 0; i < 8; i++) ck_assert(((const float *)d->y.data)[i] == (float)yv[i]);
  pe_feed_data_free(d);
}
END_TEST

/* Wrong dtype, shape, a missing array, Fortran order: each error names
 * the file, the array and both dtypes or shapes. */
START_TEST(npz_errors_name_array_and_shapes) {
  pe_feed_decl x, y;
  feeds(PE_B_F32, PE_B_SHAPE(-1, 4), PE_B_I64, PE_B_SHAPE(-1, 1), &x, &y);
  double yd[3] = {0};
  float xf[3 * 5] = {0};
  int32_t yi[3] = {0};
  int64_t yl[3] = {0};
  struct {
    npz_array a[2];
    int n;
    const char *want[3];
  } cases[] = {
      {{{"x", "<f4", 2, {3, 4}, xf, 4, false}, {"y", "<f8", 1, {3}, yd, 8, false}},
       2,
       {"array 'y' is f64 [3]", "feed 'y' is i64 [N,1]", "bad.npz"}},
      {{{"x", "<f4", 2, {3, 5}, xf, 4, false}, {"y", "<i8", 1, {3}, yl, 8, false}},
       2,
       {"array 'x' has shape [3,5]", "feed 'x' needs [N,4]", "bad.npz"}},
      {{{"x", "<f4", 2, {3, 4}, xf, 4, false}, {"y", "<i4", 1, {3}, yi, 4, false}},
       2,
       {"array 'y' is i32 [3]", "feed 'y' is i64 [N,1]", "bad.npz"}},
      {{{"x", "<f4", 2, {3, 4}, xf, 4, false}}, 1, {"no array 'y'", "bad.npz", "feed 'y'"}},
      {{{"x", "<f4", 2, {3, 4}, xf, 4, true}, {"y", "<i8", 1, {3}, yl, 8, false}},
       2,
       {"array 'x' is in Fortran order", "bad.npz", ""}},
      {{{"x", "<f4", 2, {3, 4}, xf, 4, false}, {"y", "<i8", 1, {2}, yl, 8, false}},
       2,
       {"input has 3 rows, the label 2", "bad.npz", ""}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert(npz_write(path_of("bad.npz"), cases[i].a, cases[i].n, i % 2));
    pe_feed_data *d = (pe_feed_data *)1;
    char err[512] = "";
    ck_assert_int_eq(pe_npz_read(path_of("bad.npz"), "", &x, &y, &d, err, sizeof err), -1);
    ck_assert_ptr_null(d);
    for (int k = 0; k < 3; k++)
      ck_assert_msg(strstr(err, cases[i].want[k]), "case %zu: '%s' lacks '%s'", i, err,
                    cases[i].want[k]);
  }
  char err[512];
  pe_feed_data *d;
  write_text("notzip.npz", "hello", 5);
  ck_assert_int_eq(pe_npz_read(path_of("notzip.npz"), "", &x, &y, &d, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "notzip.npz: cannot open as .npz"), "%s", err);
}
END_TEST

/* CSV: regression (f32 label) and classes (i64), the label column by
 * name or the last; a cell that is not a number names file, line, column
 * and its text. */
START_TEST(csv_columns_and_errors) {
  pe_feed_decl x, y, yi;
  feeds(PE_B_F32, PE_B_SHAPE(-1, 2), PE_B_F32, PE_B_SHAPE(-1, 1), &x, &y);
  feeds(PE_B_F32, PE_B_SHAPE(-1, 2), PE_B_I64, PE_B_SHAPE(-1, 1), &x, &yi);
  const char *csv = "a, target ,b\r\n1.5,-2,3\r\n\r\n4,5e-1, 6 \r\n";
  write_text("r.csv", csv, strlen(csv));
  pe_feed_data *d;
  char err[512];
  ck_assert_msg(pe_csv_read(path_of("r.csv"), "target", &x, &y, &d, err, sizeof err) == 0, "%s",
                err);
  ck_assert_int_eq(d->n, 2);
  const float *xv = d->x.data, *yv = d->y.data;
  ck_assert(xv[0] == 1.5f && xv[1] == 3 && xv[2] == 4 && xv[3] == 6);
  ck_assert(yv[0] == -2 && yv[1] == 0.5f);
  pe_feed_data_free(d);
  /* the last column by default, as class ids */
  const char *cls = "a,b,k\n1,2,0\n3,4,2\n";
  write_text("c.csv", cls, strlen(cls));
  ck_assert_msg(pe_csv_read(path_of("c.csv"), NULL, &x, &yi, &d, err, sizeof err) == 0, "%s", err);
  ck_assert(((int64_t *)d->y.data)[1] == 2);
  pe_feed_data_free(d);
  struct {
    const char *text, *label, *want;
    const pe_feed_decl *y;
  } bad[] = {
      {"a,b,y\n1,2,0\n1,x2,1\n", NULL, "bad.csv:3: column 'b': 'x2' is not a number", &yi},
      {"a,b,y\n1,2,0.5\n", NULL, "bad.csv:2: column 'y': '0.5' is not an integer", &yi},
      {"a,b,y\n1,2\n", NULL, "bad.csv:2: fewer cells than the header's 3", &y},
      {"a,b,y\n1,2,3,4\n", NULL, "bad.csv:2: more cells than the header's 3", &y},
      {"a,b,y\n1,2,3\n", "z", "bad.csv:1: no column 'z'", &y},
      {"a,b,c,y\n1,2,3,4\n", NULL,
       "bad.csv: the input (3 feature columns) has shape [1,3]; the model's feed 'x' needs [N,2]",
       &y},
      {"a,b,y\n", NULL, "bad.csv: a header and no data rows", &y},
      {"a,b,y\n1,2,3\n", "y,y", "bad.csv: --label-column names column 'y' twice", &y},
      {"a,b,y\n1,2,3\n", "a,b,y", "bad.csv: --label-column names every column", &y},
      {"a,b,y\n1,2,3\n", "b,y",
       "bad.csv: --label-column 'b,y' names 2 column(s); the model's label feed 'y' [-1,1] takes "
       "1 value(s) per example",
       &y},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_text("bad.csv", bad[i].text, strlen(bad[i].text));
    ck_assert_int_eq(
        pe_csv_read(path_of("bad.csv"), bad[i].label, &x, bad[i].y, &d, err, sizeof err), -1);
    ck_assert_msg(strstr(err, bad[i].want), "case %zu: '%s' lacks '%s'", i, err, bad[i].want);
  }
}
END_TEST

/* A wide target: the columns --label-column names, in its order, or the
 * last ones; a [-1,2,2] target takes four columns row-major. */
START_TEST(csv_wide_target) {
  pe_feed_decl x, y2, y22;
  feeds(PE_B_F32, PE_B_SHAPE(-1, 2), PE_B_F32, PE_B_SHAPE(-1, 2), &x, &y2);
  const char *csv = "t1,a,t0,b\n1,2,3,4\n5,6,7,8\n";
  write_text("w.csv", csv, strlen(csv));
  pe_feed_data *d;
  char err[512];
  ck_assert_msg(pe_csv_read(path_of("w.csv"), "t0,t1", &x, &y2, &d, err, sizeof err) == 0, "%s",
                err);
  const float *xv = d->x.data, *yv = d->y.data;
  ck_assert(xv[0] == 2 && xv[1] == 4 && xv[2] == 6 && xv[3] == 8);
  ck_assert(yv[0] == 3 && yv[1] == 1 && yv[2] == 7 && yv[3] == 5);
  ck_assert_int_eq(d->y.ndim, 2);
  ck_assert_int_eq(d->y.dims[1], 2);
  pe_feed_data_free(d);
  /* by default the last two: t0 and b, in file order */
  ck_assert_msg(pe_csv_read(path_of("w.csv"), NULL, &x, &y2, &d, err, sizeof err) == 0, "%s", err);
  xv = d->x.data, yv = d->y.data;
  ck_assert(xv[0] == 1 && xv[1] == 2 && yv[0] == 3 && yv[1] == 4);
  pe_feed_data_free(d);
  pe_feed_decl x1;
  feeds(PE_B_F32, PE_B_SHAPE(-1, 1), PE_B_F32, PE_B_SHAPE(-1, 2, 2), &x1, &y22);
  const char *sq = "a,b,c,d,e\n1,2,3,4,5\n";
  write_text("s.csv", sq, strlen(sq));
  ck_assert_msg(pe_csv_read(path_of("s.csv"), "e,d,c,b", &x1, &y22, &d, err, sizeof err) == 0, "%s",
                err);
  ck_assert_int_eq(d->y.ndim, 3);
  yv = d->y.data;
  ck_assert(yv[0] == 5 && yv[1] == 4 && yv[2] == 3 && yv[3] == 2 && *(float *)d->x.data == 1);
  pe_feed_data_free(d);
  ck_assert_int_eq(pe_csv_read(path_of("s.csv"), "e", &x1, &y22, &d, err, sizeof err), -1);
  ck_assert_msg(strstr(err,
                       "s.csv: --label-column 'e' names 1 column(s); the model's label feed "
                       "'y' [-1,2,2] takes 4 value(s) per example"),
                "%s", err);
}
END_TEST

/* A text file: byte ids, windows of T + 1 at stride T, the last 10% for
 * validation; a label feed [-1,T,1] takes the same rows; a model whose
 * feeds are not i64 [-1,T] is refused by name. */
START_TEST(text_windows) {
  pe_feed_decl x, y, y3, xf;
  feeds(PE_B_I64, PE_B_SHAPE(-1, 4), PE_B_I64, PE_B_SHAPE(-1, 4), &x, &y);
  feeds(PE_B_I64, PE_B_SHAPE(-1, 4), PE_B_I64, PE_B_SHAPE(-1, 4, 1), &x, &y3);
  char text[100];
  for (int i = 0; i < 100; i++) text[i] = (char)('a' + i % 26);
  write_text("t.txt", text, sizeof text);
  pe_feed_data *tr, *va;
  char err[512];
  ck_assert_msg(pe_text_read(path_of("t.txt"), &x, &y, &tr, &va, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(tr->kind, PE_FEED_TEXT);
  ck_assert_int_eq(tr->n, (90 - 1) / 4); /* 22 windows of the first 90 bytes */
  ck_assert_int_eq(va->n, (10 - 1) / 4);
  const int64_t *tx = tr->x.data, *ty = tr->y.data, *vx = va->x.data;
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(tx[5 * 4 + i], (unsigned char)text[20 + i]);
    ck_assert_int_eq(ty[5 * 4 + i], (unsigned char)text[21 + i]);
    ck_assert_int_eq(vx[i], (unsigned char)text[90 + i]);
  }
  pe_feed_data_free(tr);
  pe_feed_data_free(va);
  ck_assert_msg(pe_text_read(path_of("t.txt"), &x, &y3, &tr, &va, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(tr->y.ndim, 3);
  pe_feed_data_free(tr);
  pe_feed_data_free(va);
  write_text("short.txt", text, 30);
  ck_assert_int_eq(pe_text_read(path_of("short.txt"), &x, &y, &tr, &va, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "short.txt: 30 bytes; T = 4") && strstr(err, "at least 50"), "%s", err);
  feeds(PE_B_F32, PE_B_SHAPE(-1, 4), PE_B_I64, PE_B_SHAPE(-1, 4), &xf, &y);
  ck_assert_int_eq(pe_text_read(path_of("t.txt"), &xf, &y, &tr, &va, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "t.txt: text trains") && strstr(err, "feed 'x' is f32 [-1,4]"), "%s",
                err);
}
END_TEST

/* The held-out split: sizes, disjoint rows that together are all, the
 * same rows for the same seed; the prefetcher over rows gathers what the
 * batcher claims. */
START_TEST(split_and_prefetch) {
  pe_feed_decl x, y;
  feeds(PE_B_F32, PE_B_SHAPE(-1, 1), PE_B_I64, PE_B_SHAPE(-1, 1), &x, &y);
  float xv[50];
  int64_t yv[50];
  for (int i = 0; i < 50; i++) xv[i] = (float)(yv[i] = i);
  npz_array a[] = {{"x", "<f4", 2, {50, 1}, xv, 4, false}, {"y", "<i8", 2, {50, 1}, yv, 8, false}};
  ck_assert(npz_write(path_of("s.npz"), a, 2, false));
  char err[512];
  int64_t first[10];
  for (int round = 0; round < 2; round++) {
    pe_feed_data *d, *t;
    ck_assert_int_eq(pe_npz_read(path_of("s.npz"), "", &x, &y, &d, err, sizeof err), 0);
    ck_assert_msg(pe_feed_data_split(d, 0.2, 7, &t, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(d->n, 40);
    ck_assert_int_eq(t->n, 10);
    bool seen[50] = {false};
    for (int i = 0; i < 40; i++) seen[((int64_t *)d->y.data)[i]] = true;
    for (int i = 0; i < 10; i++) {
      int64_t v = ((int64_t *)t->y.data)[i];
      ck_assert(!seen[v]);
      seen[v] = true;
      ck_assert(((float *)t->x.data)[i] == (float)v); /* rows stay whole */
      if (round == 0) first[i] = v;
      ck_assert_int_eq(v, first[i]);
    }
    for (int i = 0; i < 50; i++) ck_assert(seen[i]);
    /* the prefetcher: every training row once per epoch, x and y together */
    pe_batcher *bt = pe_feed_data_batcher(d, 16, true, 3);
    float xb[2][16];
    int64_t yb[2][16];
    void *const xs[2] = {xb[0], xb[1]}, *const ys[2] = {yb[0], yb[1]};
    pe_batch_prefetch *pf;
    ck_assert_int_eq(pe_batch_prefetch_start_rows(bt, d, xs, ys, 0, &pf), 0);
    int n, k, rows = 0;
    bool got[50] = {false};
    while ((k = pe_batch_prefetch_next(pf, &n)) >= 0)
      for (int i = 0; i < n; i++, rows++) {
        ck_assert(xb[k][i] == (float)yb[k][i]);
        ck_assert(!got[yb[k][i]]);
        got[yb[k][i]] = true;
      }
    pe_batch_prefetch_stop(pf);
    ck_assert_int_eq(rows, 40);
    pe_batcher_free(bt);
    pe_feed_data_free(d);
    pe_feed_data_free(t);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("feed_data");
  TCase *tc = tcase_create("feed_data");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, npz_regression_rows);
  tcase_add_test(tc, npz_errors_name_array_and_shapes);
  tcase_add_test(tc, csv_columns_and_errors);
  tcase_add_test(tc, npz_f64_narrowed);
  tcase_add_test(tc, csv_wide_target);
  tcase_add_test(tc, text_windows);
  tcase_add_test(tc, split_and_prefetch);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
