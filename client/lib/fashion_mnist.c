/* Fashion-MNIST idx reader and the mini-batcher (see pe_dataset.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "pe_dataset.h"

#define IDX_IMAGES_MAGIC 0x00000803u     /* ubyte, 3 dims */
#define IDX_LABELS_MAGIC 0x00000801u     /* ubyte, 1 dim */
#define IDX_MAX_BYTES ((int64_t)1 << 32) /* refuse absurd headers */

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

const char *pe_dataset_default_dir(void) {
  const char *e = getenv("PE_FASHION_MNIST_DIR");
  return e && *e ? e : PE_FASHION_MNIST_DIR;
}

/* Read up to n bytes; returns bytes read, or -1 on a stream error. */
static int64_t gz_read_all(gzFile f, uint8_t *buf, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    int64_t want = n - got > (1 << 20) ? (1 << 20) : n - got;
    int r = gzread(f, buf + got, (unsigned)want);
    if (r < 0) return -1;
    if (r == 0) break;
    got += r;
  }
  return got;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static const char *gz_msg(gzFile f) {
  int code;
  const char *m = gzerror(f, &code);
  return code != Z_OK && m && *m ? m : "end of file";
}

/* Read an idx file of unsigned bytes with `ndim` dims. On success *data
 * (malloc'd) holds prod(dims) bytes. */
static int idx_read(const char *path, uint32_t magic, int ndim, uint32_t *dims, uint8_t **data,
                    char *err, size_t errlen) {
  *data = NULL;
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (!f) {
    seterr(err, errlen, "%s: cannot open: %s", path, errno ? strerror(errno) : "gzopen failed");
    return -1;
  }
  int rc = -1;
  uint8_t hdr[4 + 4 * 3];
  int64_t hlen = 4 + 4 * (int64_t)ndim;
  int64_t got = gz_read_all(f, hdr, hlen);
  if (got != hlen) {
    seterr(err, errlen, "%s: truncated header (%lld of %lld bytes: %s)", path, (long long)got,
           (long long)hlen, got < 0 ? gz_msg(f) : "end of file");
    goto out;
  }
  if (be32(hdr) != magic) {
    seterr(err, errlen, "%s: bad magic 0x%08x (expected 0x%08x, an idx%d ubyte file)", path,
           be32(hdr), magic, ndim);
    goto out;
  }
  int64_t total = 1;
  for (int i = 0; i < ndim; i++) {
    dims[i] = be32(hdr + 4 + 4 * i);
    if (i > 0 && dims[i] == 0) {
      seterr(err, errlen, "%s: dim %d is 0", path, i);
      goto out;
    }
    total *= dims[i];
    if (total > IDX_MAX_BYTES) {
      seterr(err, errlen, "%s: header claims more than %lld bytes", path, (long long)IDX_MAX_BYTES);
      goto out;
    }
  }
  *data = malloc(total ? (size_t)total : 1);
  if (!*data) {
    seterr(err, errlen, "%s: out of memory for %lld bytes", path, (long long)total);
    goto out;
  }
  got = gz_read_all(f, *data, total);
  if (got != total) {
    seterr(err, errlen, "%s: truncated: header promises %lld data bytes, found %lld (%s)", path,
           (long long)total, (long long)(got < 0 ? 0 : got), gz_msg(f));
    goto out;
  }
  uint8_t extra;
  if (gzread(f, &extra, 1) != 0) {
    seterr(err, errlen, "%s: longer than its header says (trailing bytes after %lld)", path,
           (long long)total);
    goto out;
  }
  rc = 0;
out:
  gzclose(f);
  if (rc) {
    free(*data);
    *data = NULL;
  }
  return rc;
}

int pe_dataset_open(const char *dir, const char *split, pe_dataset **out, char *err,
                    size_t errlen) {
  *out = NULL;
  if (!dir) dir = pe_dataset_default_dir();
  if (!split || (strcmp(split, "train") && strcmp(split, "t10k"))) {
    seterr(err, errlen, "dataset: split '%s' is not \"train\" or \"t10k\"",
           split ? split : "(null)");
    return -1;
  }
  char ipath[4096], lpath[4096];
  snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, split);
  snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, split);
  uint32_t idims[3], ldims[1];
  uint8_t *pix = NULL, *lab = NULL;
  pe_dataset *ds = NULL;
  if (idx_read(ipath, IDX_IMAGES_MAGIC, 3, idims, &pix, err, errlen) ||
      idx_read(lpath, IDX_LABELS_MAGIC, 1, ldims, &lab, err, errlen))
    goto fail;
  if (idims[0] != ldims[0]) {
    seterr(err, errlen, "%s: %u labels but %s has %u images (count mismatch)", lpath, ldims[0],
           ipath, idims[0]);
    goto fail;
  }
  for (uint32_t i = 0; i < ldims[0]; i++)
    if (lab[i] >= PE_FASHION_MNIST_CLASSES) {
      seterr(err, errlen, "%s: label %u at index %u is out of range [0, %d)", lpath, lab[i], i,
             PE_FASHION_MNIST_CLASSES);
      goto fail;
    }
  ds = calloc(1, sizeof *ds);
  if (!ds) goto oom;
  ds->n = idims[0];
  ds->rows = (int)idims[1];
  ds->cols = (int)idims[2];
  ds->dim = (int64_t)idims[1] * idims[2];
  ds->images = malloc((size_t)(ds->n * ds->dim) * sizeof(float) + 1);
  ds->labels = malloc((size_t)ds->n * sizeof(int64_t) + 1);
  if (!ds->images || !ds->labels) goto oom;
  for (int64_t i = 0; i < ds->n * ds->dim; i++) ds->images[i] = pix[i] * (1.0f / 255.0f);
  for (int64_t i = 0; i < ds->n; i++) ds->labels[i] = lab[i];
  free(pix);
  free(lab);
  *out = ds;
  return 0;
oom:
  seterr(err, errlen, "dataset %s/%s: out of memory", dir, split);
fail:
  free(pix);
  free(lab);
  pe_dataset_free(ds);
  return -1;
}

void pe_dataset_free(pe_dataset *ds) {
  if (!ds) return;
  free(ds->images);
  free(ds->labels);
  free(ds);
}

void pe_dataset_stats(const pe_dataset *ds, float *mean, float *std) {
  double s = 0, s2 = 0;
  int64_t n = ds->n * ds->dim;
  for (int64_t i = 0; i < n; i++) {
    s += ds->images[i];
    s2 += (double)ds->images[i] * ds->images[i];
  }
  double m = n ? s / (double)n : 0, var = n ? s2 / (double)n - m * m : 0;
  *mean = (float)m;
  *std = (float)sqrt(var > 0 ? var : 0);
}

void pe_dataset_normalize(pe_dataset *ds, float mean, float std) {
  float inv = 1.0f / std;
  for (int64_t i = 0; i < ds->n * ds->dim; i++) ds->images[i] = (ds->images[i] - mean) * inv;
}

/* --- batcher -------------------------------------------------------------------- */

struct pe_batcher {
  const pe_dataset *ds;
  int batch;
  bool shuffle;
  uint64_t seed;
  int64_t *perm; /* example order of the current epoch (this rank's part) */
  int64_t pos;   /* next index into perm; -1: epoch not started */
  int epoch;
  int world, rank; /* pe_batcher_shard; 1 and 0: every example */
};

/* Examples per epoch: this rank's. */
static int64_t epoch_rows(const pe_batcher *bt) {
  return bt->ds->n / bt->world;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

pe_batcher *pe_batcher_new(const pe_dataset *ds, int batch, bool shuffle, uint64_t seed) {
  if (!ds || batch < 1) return NULL;
  pe_batcher *bt = calloc(1, sizeof *bt);
  if (!bt) return NULL;
  bt->perm = malloc((size_t)ds->n * sizeof *bt->perm + 1);
  if (!bt->perm) {
    free(bt);
    return NULL;
  }
  bt->ds = ds;
  bt->batch = batch;
  bt->shuffle = shuffle;
  bt->seed = seed;
  bt->pos = -1;
  bt->world = 1;
  return bt;
}

bool pe_batcher_shard(pe_batcher *bt, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world || bt->ds->n / world < 1) return false;
  bt->world = world;
  bt->rank = rank;
  bt->pos = -1;
  return true;
}

void pe_batcher_free(pe_batcher *bt) {
  if (!bt) return;
  free(bt->perm);
  free(bt);
}

/* A new epoch: identity order, then Fisher-Yates from a generator seeded
 * with (seed, epoch), so epoch k's order does not depend on earlier ones. */
static void epoch_start(pe_batcher *bt) {
  int64_t n = bt->ds->n;
  for (int64_t i = 0; i < n; i++) bt->perm[i] = i;
  bt->epoch++;
  if (bt->shuffle) {
    uint64_t s = bt->seed ^ ((uint64_t)bt->epoch * 0xD1B54A32D192ED03ull);
    for (int64_t i = n - 1; i > 0; i--) {
      /* modulo bias is below 2^-40 for any realistic n */
      int64_t j = (int64_t)(splitmix64(&s) % (uint64_t)(i + 1));
      int64_t t = bt->perm[i];
      bt->perm[i] = bt->perm[j];
      bt->perm[j] = t;
    }
  }
  /* A rank's part: every world-th position of the order, from its rank. */
  for (int64_t k = 0; bt->world > 1 && k < epoch_rows(bt); k++)
    bt->perm[k] = bt->perm[k * bt->world + bt->rank];
  bt->pos = 0;
}

bool pe_batcher_claim(pe_batcher *bt, const int64_t **idx, int *n) {
  *n = 0;
  *idx = NULL;
  if (bt->pos < 0) epoch_start(bt);
  int64_t rows = epoch_rows(bt);
  if (bt->pos >= rows) {
    bt->pos = -1; /* report the epoch's end once */
    return false;
  }
  int64_t k = rows - bt->pos < bt->batch ? rows - bt->pos : bt->batch;
  *idx = bt->perm + bt->pos;
  bt->pos += k;
  *n = (int)k;
  return true;
}

void pe_dataset_gather(const pe_dataset *ds, const int64_t *idx, int lo, int hi, float *images,
                       int64_t *labels) {
  for (int i = lo; i < hi; i++) {
    int64_t e = idx[i];
    if (images)
      memcpy(images + i * ds->dim, ds->images + e * ds->dim, (size_t)ds->dim * sizeof(float));
    if (labels) labels[i] = ds->labels[e];
  }
}

bool pe_batcher_next(pe_batcher *bt, float *images, int64_t *labels, int *n) {
  const int64_t *idx;
  if (!pe_batcher_claim(bt, &idx, n)) return false;
  pe_dataset_gather(bt->ds, idx, 0, *n, images, labels);
  return true;
}

void pe_batcher_reset(pe_batcher *bt) {
  bt->pos = -1;
}

bool pe_batcher_seek(pe_batcher *bt, int epoch, int64_t offset) {
  if (epoch < 1 || offset < 0 || offset > epoch_rows(bt)) return false;
  bt->epoch = epoch - 1;
  epoch_start(bt);
  bt->pos = offset;
  return true;
}

int pe_batcher_epoch(const pe_batcher *bt) {
  return bt->epoch;
}

int64_t pe_batcher_batches(const pe_batcher *bt) {
  return (epoch_rows(bt) + bt->batch - 1) / bt->batch;
}

int pe_dataset_check_input(const pe_dataset *ds, const char *name, int ndim, const int64_t *dims,
                           char *err, size_t errlen) {
  int64_t per = 1;
  char shape[128];
  int off = snprintf(shape, sizeof shape, "[");
  for (int i = 0; i < ndim && off < (int)sizeof shape; i++) {
    if (i > 0) per = dims[i] > 0 && per > 0 ? per * dims[i] : -1;
    off += snprintf(shape + off, sizeof shape - (size_t)off, "%s%lld", i ? "," : "",
                    (long long)dims[i]);
  }
  if (off < (int)sizeof shape) snprintf(shape + off, sizeof shape - (size_t)off, "]");
  if (ndim >= 2 && per == ds->dim) return 0;
  seterr(err, errlen,
         "model input '%s' %s holds %lld values per sample; the Fashion-MNIST images have %lld "
         "(%dx%d): declare it as [-1,%lld] or [-1,1,%d,%d]",
         name, shape, (long long)per, (long long)ds->dim, ds->rows, ds->cols, (long long)ds->dim,
         ds->rows, ds->cols);
  return -1;
}
