/* Fashion-MNIST reader and batcher: small idx .gz files written here with
 * zlib, every error path, seeded shuffling, and (when installed) the real
 * data set. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check_main.h"
#include "pe_dataset.h"

static char tmpdir[64];

static void mk_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/pe_ds_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_tmpdir(void) {
  const char *names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
  char p[256];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
    unlink(p);
  }
  rmdir(tmpdir);
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Write <tmpdir>/<split>-<kind>-idxN-ubyte.gz: magic, dims, then `len`
 * bytes of data (callers pass fewer or more than the dims say to make
 * truncated or over-long files). */
static void write_idx(const char *split, bool images, uint32_t magic, int ndim,
                      const uint32_t *dims, const uint8_t *data, size_t len) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s-%s-idx%d-ubyte.gz", tmpdir, split,
           images ? "images" : "labels", images ? 3 : 1);
  gzFile f = gzopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  uint8_t hdr[16];
  put_be32(hdr, magic);
  for (int i = 0; i < ndim; i++) put_be32(hdr + 4 + 4 * i, dims[i]);
  ck_assert_int_eq(gzwrite(f, hdr, (unsigned)(4 + 4 * ndim)), 4 + 4 * ndim);
  if (len) ck_assert_int_eq(gzwrite(f, data, (unsigned)len), (int)len);
  ck_assert_int_eq(gzclose(f), Z_OK);
}

/* A well-formed split of n images of 1 x 1 pixel whose value is the
 * example's index (so batches can be traced) and labels index % 10. */
static void write_indexed(const char *split, uint32_t n) {
  uint8_t pix[256], lab[256];
  ck_assert_uint_le(n, 256);
  for (uint32_t i = 0; i < n; i++) pix[i] = (uint8_t)i, lab[i] = (uint8_t)(i % 10);
  write_idx(split, true, 0x803, 3, (uint32_t[]){n, 1, 1}, pix, n);
  write_idx(split, false, 0x801, 1, (uint32_t[]){n}, lab, n);
}

/* A fresh directory with an n-example "train" split (write_indexed), open. */
static pe_dataset *open_indexed(uint32_t n) {
  mk_tmpdir();
  write_indexed("train", n);
  pe_dataset *ds;
  char err[256];
  ck_assert_msg(pe_dataset_open(tmpdir, "train", &ds, err, sizeof err) == 0, "%s", err);
  return ds;
}

/* Open split "train" of tmpdir, expecting failure; returns the message. */
static const char *open_fails(void) {
  static char err[512];
  pe_dataset *ds = (pe_dataset *)1;
  ck_assert_int_eq(pe_dataset_open(tmpdir, "train", &ds, err, sizeof err), -1);
  ck_assert_ptr_null(ds);
  return err;
}

START_TEST(reads_small_files) {
  mk_tmpdir();
  uint8_t pix[3 * 2 * 3], lab[3] = {7, 0, 9};
  for (int i = 0; i < 18; i++) pix[i] = (uint8_t)(i * 15);
  write_idx("t10k", true, 0x803, 3, (uint32_t[]){3, 2, 3}, pix, sizeof pix);
  write_idx("t10k", false, 0x801, 1, (uint32_t[]){3}, lab, sizeof lab);
  pe_dataset *ds;
  char err[256] = "";
  ck_assert_msg(pe_dataset_open(tmpdir, "t10k", &ds, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(ds->n, 3);
  ck_assert_int_eq(ds->rows, 2);
  ck_assert_int_eq(ds->cols, 3);
  ck_assert_int_eq(ds->dim, 6);
  for (int i = 0; i < 18; i++) ck_assert_float_eq_tol(ds->images[i], i * 15 / 255.0f, 1e-7);
  ck_assert_int_eq(ds->labels[0], 7);
  ck_assert_int_eq(ds->labels[2], 9);
  float mean, std;
  pe_dataset_stats(ds, &mean, &std);
  ck_assert_float_eq_tol(mean, 127.5f / 255.0f, 1e-6); /* 0, 15, .., 255 */
  ck_assert_float_eq_tol(std, sqrtf((18 * 18 - 1) / 12.0f) * 15 / 255.0f, 1e-5);
  pe_dataset_normalize(ds, 0.5f, 0.25f);
  ck_assert_float_eq_tol(ds->images[17], (255 / 255.0f - 0.5f) / 0.25f, 1e-6);
  pe_dataset_free(ds);
  rm_tmpdir();
}
END_TEST

START_TEST(batches_cover_epoch_with_partial_last) {
  pe_dataset *ds = open_indexed(10);
  pe_batcher *bt = pe_batcher_new(ds, 4, false, 0);
  ck_assert_int_eq(pe_batcher_batches(bt), 3);
  float x[4];
  int64_t y[4];
  int n, sizes[3] = {4, 4, 2}, seen = 0;
  for (int epoch = 1; epoch <= 2; epoch++) {
    for (int k = 0; k < 3; k++) {
      ck_assert(pe_batcher_next(bt, x, y, &n));
      ck_assert_int_eq(n, sizes[k]);
      for (int i = 0; i < n; i++, seen++) { /* unshuffled: in order */
        ck_assert_float_eq_tol(x[i], (seen % 10) / 255.0f, 1e-7);
        ck_assert_int_eq(y[i], seen % 10);
      }
      ck_assert_int_eq(pe_batcher_epoch(bt), epoch);
    }
    ck_assert(!pe_batcher_next(bt, x, y, &n));
    ck_assert_int_eq(n, 0);
  }
  ck_assert_ptr_null(pe_batcher_new(ds, 0, false, 0));
  pe_batcher_free(bt);
  pe_dataset_free(ds);
  rm_tmpdir();
}
END_TEST

/* One epoch's example indices (recovered from the pixel values). */
static void epoch_order(pe_batcher *bt, int64_t n, int64_t *order) {
  float x[7];
  int64_t y[7];
  int k, at = 0;
  while (pe_batcher_next(bt, x, y, &k))
    for (int i = 0; i < k; i++) {
      ck_assert_int_lt(at, n);
      order[at] = (int64_t)(x[i] * 255.0f + 0.5f);
      ck_assert_int_eq(y[i], order[at] % 10); /* label travels with its image */
      at++;
    }
  ck_assert_int_eq(at, n);
}

START_TEST(shuffle_is_seeded_permutation) {
  enum { N = 200 };
  pe_dataset *ds = open_indexed(N);
  pe_batcher *a = pe_batcher_new(ds, 7, true, 42), *b = pe_batcher_new(ds, 7, true, 42);
  pe_batcher *c = pe_batcher_new(ds, 7, true, 43);
  int64_t oa[N], oa2[N], ob[N], oc[N];
  epoch_order(a, N, oa);
  epoch_order(b, N, ob);
  epoch_order(c, N, oc);
  ck_assert_mem_eq(oa, ob, sizeof oa); /* same seed, same order */
  ck_assert(memcmp(oa, oc, sizeof oa) != 0);
  bool hit[N] = {false}, moved = false;
  for (int i = 0; i < N; i++) {
    ck_assert(!hit[oa[i]]); /* a permutation: each example once */
    hit[oa[i]] = true;
    moved |= oa[i] != i;
  }
  ck_assert(moved);
  epoch_order(a, N, oa2); /* a new permutation per epoch */
  ck_assert(memcmp(oa, oa2, sizeof oa) != 0);
  pe_batcher_reset(b); /* reset mid-way: the next epoch starts fresh */
  float x[7];
  int64_t y[7];
  int k;
  ck_assert(pe_batcher_next(b, x, y, &k));
  pe_batcher_reset(b);
  epoch_order(b, N, ob);
  epoch_order(a, N, oa);
  ck_assert_int_eq(pe_batcher_epoch(b), 3); /* epoch 2 was abandoned */
  pe_batcher_free(a);
  pe_batcher_free(b);
  pe_batcher_free(c);
  pe_dataset_free(ds);
  rm_tmpdir();
}
END_TEST

/* A seek to (epoch, offset) gives that epoch's order from that example on
 * (whatever the batcher did before), then the following epochs as usual. */
START_TEST(seek_repeats_an_epoch_from_an_example) {
  enum { N = 200, AT = 45 };
  pe_dataset *ds = open_indexed(N);
  pe_batcher *a = pe_batcher_new(ds, 7, true, 42), *b = pe_batcher_new(ds, 7, true, 42);
  int64_t ref[4][N], got[N];
  for (int ep = 0; ep < 4; ep++) epoch_order(a, N, ref[ep]);
  /* b is in epoch 1; it jumps ahead to epoch 3, example AT. */
  float x[7];
  int64_t y[7];
  int k;
  ck_assert(pe_batcher_next(b, x, y, &k));
  ck_assert(pe_batcher_seek(b, 3, AT));
  ck_assert_int_eq(pe_batcher_epoch(b), 3);
  int at = AT;
  while (pe_batcher_next(b, x, y, &k))
    for (int i = 0; i < k; i++, at++) ck_assert_int_eq((int64_t)(x[i] * 255.0f + 0.5f), ref[2][at]);
  ck_assert_int_eq(at, N);
  epoch_order(b, N, got); /* then epoch 4 */
  ck_assert_mem_eq(got, ref[3], sizeof got);
  ck_assert(pe_batcher_seek(b, 2, 0)); /* and back to a whole earlier epoch */
  epoch_order(b, N, got);
  ck_assert_mem_eq(got, ref[1], sizeof got);
  ck_assert(pe_batcher_seek(b, 1, N)); /* at the end: the epoch ends at once */
  ck_assert(!pe_batcher_next(b, x, y, &k));
  epoch_order(b, N, got);
  ck_assert_mem_eq(got, ref[1], sizeof got);
  ck_assert(!pe_batcher_seek(b, 0, 0));
  ck_assert(!pe_batcher_seek(b, 1, -1));
  ck_assert(!pe_batcher_seek(b, 1, N + 1));
  pe_batcher_free(a);
  pe_batcher_free(b);
  pe_dataset_free(ds);
  rm_tmpdir();
}
END_TEST

/* A job's ranks (pe_batcher_shard) of N = 23 examples, world 3, batch 2:
 * each epoch every rank walks N / 3 = 7 examples, in 4 batches (the last
 * of one); step s of the three ranks together holds exactly positions
 * [6s, 6s + 6) of the unsharded order of that epoch (one machine's batch
 * of 6), the last step positions [18, 21); the last N % 3 positions are
 * left out, other examples in another epoch. seek counts the rank's
 * examples. Bad arguments are refused. */
START_TEST(shard_walks_every_world_th_position) {
  enum { N = 23, W = 3, B = 2, M = N / W };
  pe_dataset *ds = open_indexed(N);
  pe_batcher *one = pe_batcher_new(ds, 7, true, 5);
  pe_batcher *r[W];
  for (int k = 0; k < W; k++) {
    r[k] = pe_batcher_new(ds, B, true, 5);
    ck_assert(pe_batcher_shard(r[k], W, k));
    ck_assert_int_eq(pe_batcher_batches(r[k]), (M + B - 1) / B);
  }
  int64_t left[2][N - M * W];
  for (int ep = 0; ep < 2; ep++) {
    int64_t order[N];
    epoch_order(one, N, order);
    for (int step = 0; step < (M + B - 1) / B; step++) {
      int64_t want[W * B], got[W * B];
      int nw = 0, ng = 0;
      for (int p = step * W * B; p < (step + 1) * W * B && p < M * W; p++) want[nw++] = order[p];
      for (int k = 0; k < W; k++) {
        float x[B];
        int64_t y[B];
        int n;
        ck_assert(pe_batcher_next(r[k], x, y, &n));
        ck_assert_int_eq(n, step < M / B ? B : M % B);
        for (int i = 0; i < n; i++) got[ng++] = (int64_t)(x[i] * 255.0f + 0.5f);
      }
      ck_assert_int_eq(ng, nw);
      for (int i = 0; i < nw; i++) { /* the same set: every wanted example once */
        int hits = 0;
        for (int j = 0; j < ng; j++) hits += got[j] == want[i];
        ck_assert_msg(hits == 1, "epoch %d step %d: example %lld %d times", ep + 1, step,
                      (long long)want[i], hits);
      }
    }
    for (int k = 0; k < W; k++) {
      float x[B];
      int64_t y[B];
      int n;
      ck_assert(!pe_batcher_next(r[k], x, y, &n));
    }
    memcpy(left[ep], order + M * W, sizeof left[ep]);
  }
  ck_assert_msg(memcmp(left[0], left[1], sizeof left[0]), "the same examples left out twice");
  /* seek: rank 1's example 3 of epoch 2 onwards. */
  pe_batcher *again = pe_batcher_new(ds, B, true, 5);
  ck_assert(pe_batcher_shard(again, W, 1));
  int64_t ref[M], got[M];
  ck_assert(pe_batcher_seek(r[1], 2, 0));
  epoch_order(r[1], M, ref);
  ck_assert(pe_batcher_seek(again, 2, 3));
  float x[B];
  int64_t y[B];
  int n, at = 3;
  while (pe_batcher_next(again, x, y, &n))
    for (int i = 0; i < n; i++) got[at++] = (int64_t)(x[i] * 255.0f + 0.5f);
  ck_assert_int_eq(at, M);
  ck_assert_mem_eq(got + 3, ref + 3, (M - 3) * sizeof(int64_t));
  ck_assert(!pe_batcher_seek(again, 1, M + 1));
  ck_assert(!pe_batcher_shard(again, 0, 0));
  ck_assert(!pe_batcher_shard(again, 3, 3));
  ck_assert(!pe_batcher_shard(again, 24, 0)); /* a rank with no example */
  pe_batcher_free(again);
  for (int k = 0; k < W; k++) pe_batcher_free(r[k]);
  pe_batcher_free(one);
  pe_dataset_free(ds);
  rm_tmpdir();
}
END_TEST

START_TEST(claim_and_gather_match_next) {
  /* The two halves of pe_batcher_next, rows gathered in two pieces (the
   * second half first), give the same batches as next with the same seed,
   * over two epochs and their ends. */
  enum { N = 23, B = 5 };
  pe_dataset *ds = open_indexed(N);
  pe_batcher *ref = pe_batcher_new(ds, B, true, 9), *bt = pe_batcher_new(ds, B, true, 9);
  for (int call = 0; call < 2 * (N / B + 2); call++) {
    float rx[B], x[B];
    int64_t ry[B], y[B];
    int rn, n;
    const int64_t *idx;
    bool more = pe_batcher_next(ref, rx, ry, &rn);
    ck_assert_int_eq(pe_batcher_claim(bt, &idx, &n), more);
    ck_assert_int_eq(n, rn);
    if (!more) {
      ck_assert_ptr_null(idx);
      continue;
    }
    memset(x, 0xff, sizeof x);
    pe_dataset_gather(ds, idx, n / 2, n, x, y);
    pe_dataset_gather(ds, idx, 0, n / 2, x, NULL);
    pe_dataset_gather(ds, idx, 0, n / 2, NULL, y);
    ck_assert_mem_eq(x, rx, (size_t)n * sizeof(float));
    ck_assert_mem_eq(y, ry, (size_t)n * sizeof(int64_t));
  }
  ck_assert_int_eq(pe_batcher_epoch(bt), pe_batcher_epoch(ref));
  pe_batcher_free(ref);
  pe_batcher_free(bt);
  pe_dataset_free(ds);
  rm_tmpdir();
}
END_TEST

START_TEST(missing_file) {
  mk_tmpdir();
  const char *e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "train-images-idx3-ubyte.gz"));
  ck_assert_ptr_nonnull(strstr(e, "No such file"));
  write_idx("train", true, 0x803, 3, (uint32_t[]){1, 1, 1}, (uint8_t[]){0}, 1);
  e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "train-labels-idx1-ubyte.gz"));
  ck_assert_ptr_nonnull(strstr(e, "No such file"));
  rm_tmpdir();
}
END_TEST

START_TEST(bad_magic) {
  mk_tmpdir();
  write_indexed("train", 4);
  write_idx("train", true, 0x801, 3, (uint32_t[]){4, 1, 1}, (uint8_t[]){0, 1, 2, 3}, 4);
  const char *e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "train-images-idx3-ubyte.gz"));
  ck_assert_ptr_nonnull(strstr(e, "bad magic 0x00000801"));
  write_indexed("train", 4);
  write_idx("train", false, 0x803, 1, (uint32_t[]){4}, (uint8_t[]){0, 1, 2, 3}, 4);
  e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "train-labels-idx1-ubyte.gz: bad magic"));
  rm_tmpdir();
}
END_TEST

START_TEST(truncated_files) {
  mk_tmpdir();
  uint8_t pix[8 * 4] = {0};
  write_indexed("train", 8);
  write_idx("train", true, 0x803, 3, (uint32_t[]){8, 2, 2}, pix, 8 * 4 - 5);
  const char *e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "train-images-idx3-ubyte.gz: truncated"));
  ck_assert_ptr_nonnull(strstr(e, "32"));
  ck_assert_ptr_nonnull(strstr(e, "27"));
  write_idx("train", true, 0x803, 1, (uint32_t[]){8}, NULL, 0); /* header cut after 8 bytes */
  e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "truncated header"));
  /* a raw gzip stream cut in the middle */
  write_idx("train", true, 0x803, 3, (uint32_t[]){8, 2, 2}, pix, sizeof pix);
  char path[256];
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", tmpdir);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(truncate(path, st.st_size - 12), 0);
  e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "train-images-idx3-ubyte.gz"));
  ck_assert_ptr_nonnull(strstr(e, "truncated"));
  /* and a file longer than its header */
  write_idx("train", true, 0x803, 3, (uint32_t[]){8, 1, 1}, pix, 9);
  e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "trailing bytes"));
  rm_tmpdir();
}
END_TEST

START_TEST(count_mismatch_and_bad_labels) {
  mk_tmpdir();
  write_indexed("train", 6);
  write_idx("train", false, 0x801, 1, (uint32_t[]){5}, (uint8_t[]){0, 1, 2, 3, 4}, 5);
  const char *e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "count mismatch"));
  ck_assert_ptr_nonnull(strstr(e, "5 labels"));
  ck_assert_ptr_nonnull(strstr(e, "6 images"));
  write_idx("train", false, 0x801, 1, (uint32_t[]){6}, (uint8_t[]){0, 1, 2, 10, 4, 5}, 6);
  e = open_fails();
  ck_assert_ptr_nonnull(strstr(e, "label 10 at index 3"));
  char err[128];
  pe_dataset *ds;
  ck_assert_int_eq(pe_dataset_open(tmpdir, "valid", &ds, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "split 'valid'"));
  rm_tmpdir();
}
END_TEST

START_TEST(default_dir_from_env) {
  unsetenv("PE_FASHION_MNIST_DIR");
  ck_assert_str_eq(pe_dataset_default_dir(), PE_FASHION_MNIST_DIR);
  setenv("PE_FASHION_MNIST_DIR", "/nowhere", 1);
  ck_assert_str_eq(pe_dataset_default_dir(), "/nowhere");
  char err[256];
  pe_dataset *ds;
  ck_assert_int_eq(pe_dataset_open(NULL, "t10k", &ds, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "/nowhere/t10k-images-idx3-ubyte.gz"));
  unsetenv("PE_FASHION_MNIST_DIR");
}
END_TEST

/* A model input must hold one 28x28 image per sample: feeds are cut from
 * the images at that size (a larger input read past them, a smaller one
 * trained on shifted pixels). */
START_TEST(model_input_must_take_the_images) {
  pe_dataset ds = {.n = 1, .rows = 28, .cols = 28, .dim = 784};
  char err[256];
  ck_assert_int_eq(pe_dataset_check_input(&ds, "image", 2, (int64_t[]){-1, 784}, err, sizeof err),
                   0);
  ck_assert_int_eq(
      pe_dataset_check_input(&ds, "image", 4, (int64_t[]){-1, 1, 28, 28}, err, sizeof err), 0);
  ck_assert_int_eq(pe_dataset_check_input(&ds, "img", 2, (int64_t[]){-1, 50000}, err, sizeof err),
                   -1);
  ck_assert_msg(strstr(err, "'img' [-1,50000] holds 50000") && strstr(err, "have 784 (28x28)"),
                "%s", err);
  ck_assert_int_eq(pe_dataset_check_input(&ds, "image", 2, (int64_t[]){-1, 783}, err, sizeof err),
                   -1);
  ck_assert_int_eq(
      pe_dataset_check_input(&ds, "image", 4, (int64_t[]){-1, 3, 28, 28}, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "[-1,3,28,28] holds 2352"), "%s", err);
  ck_assert_int_eq(pe_dataset_check_input(&ds, "image", 1, (int64_t[]){-1}, err, sizeof err), -1);
}
END_TEST

/* The installed data set, when present (Debian's dataset-fashion-mnist). */
START_TEST(real_fashion_mnist) {
  struct stat st;
  if (stat(PE_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", &st) != 0) return;
  const char *splits[] = {"train", "t10k"};
  const int64_t counts[] = {60000, 10000};
  for (int s = 0; s < 2; s++) {
    pe_dataset *ds;
    char err[256];
    ck_assert_msg(pe_dataset_open(PE_FASHION_MNIST_DIR, splits[s], &ds, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_int_eq(ds->n, counts[s]);
    ck_assert_int_eq(ds->rows, 28);
    ck_assert_int_eq(ds->cols, 28);
    int64_t per_class[10] = {0};
    for (int64_t i = 0; i < ds->n; i++) {
      ck_assert(ds->labels[i] >= 0 && ds->labels[i] < 10);
      per_class[ds->labels[i]]++;
    }
    for (int c = 0; c < 10; c++) ck_assert_int_eq(per_class[c], counts[s] / 10); /* balanced */
    float lo = 1, hi = 0;
    for (int64_t i = 0; i < ds->n * ds->dim; i++) {
      lo = ds->images[i] < lo ? ds->images[i] : lo;
      hi = ds->images[i] > hi ? ds->images[i] : hi;
    }
    ck_assert_float_eq(lo, 0.0f);
    ck_assert_float_eq(hi, 1.0f);
    pe_dataset_free(ds);
  }
}
END_TEST

static Suite *dataset_suite(void) {
  Suite *s = suite_create("dataset");
  TCase *tc = tcase_create("fashion_mnist");
  tcase_add_test(tc, reads_small_files);
  tcase_add_test(tc, batches_cover_epoch_with_partial_last);
  tcase_add_test(tc, shuffle_is_seeded_permutation);
  tcase_add_test(tc, seek_repeats_an_epoch_from_an_example);
  tcase_add_test(tc, claim_and_gather_match_next);
  tcase_add_test(tc, shard_walks_every_world_th_position);
  tcase_add_test(tc, missing_file);
  tcase_add_test(tc, bad_magic);
  tcase_add_test(tc, truncated_files);
  tcase_add_test(tc, count_mismatch_and_bad_labels);
  tcase_add_test(tc, default_dir_from_env);
  tcase_add_test(tc, model_input_must_take_the_images);
  tcase_add_test(tc, real_fashion_mnist);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(dataset_suite)
