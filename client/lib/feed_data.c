/* The rows of a trainer's two feeds (contract in pe_feed_data.h): the
 * checks against the program's feeds, the held-out split, the batches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pe_builder.h"
#include "pe_feed_data.h"

pe_feed_data *pe_feed_data_new(pe_feed_kind kind) {
  pe_feed_data *d = calloc(1, sizeof *d);
  if (d) d->kind = kind;
  return d;
}

void pe_feed_data_free(pe_feed_data *d) {
  if (!d) return;
  if (!d->x.borrowed) free(d->x.data);
  if (!d->y.borrowed) free(d->y.data);
  free(d);
}

pe_feed_data *pe_feed_data_borrow(const pe_dataset *ds) {
  pe_feed_data *d = pe_feed_data_new(PE_FEED_IMAGES);
  if (!d) return NULL;
  d->x = (pe_feed_array){.dtype = PE_B_F32,
                         .ndim = 2,
                         .dims = {ds->n, ds->dim},
                         .row_bytes = (size_t)ds->dim * sizeof(float),
                         .data = ds->images,
                         .borrowed = true};
  d->y = (pe_feed_array){.dtype = PE_B_I64,
                         .ndim = 2,
                         .dims = {ds->n, 1},
                         .row_bytes = sizeof(int64_t),
                         .data = ds->labels,
                         .borrowed = true};
  d->n = d->rows.n = ds->n;
  return d;
}

const char *pe_feed_dtype_str(int dtype) {
  switch (dtype) {
    case PE_B_F32: return "f32";
    case PE_B_F64: return "f64";
    case PE_B_I32: return "i32";
    case PE_B_I64: return "i64";
    case PE_B_U8: return "u8";
    default: return "?";
  }
}

const char *pe_feed_shape_str(int ndim, const int64_t *dims, char *buf, size_t len) {
  size_t off = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, "%s%lld", i ? "," : "", (long long)dims[i]);
  if (off < len) snprintf(buf + off, len - off, "]");
  return buf;
}

/* "[N,D1,...]": the feed's shape with the rows for its batch. */
static void rows_shape(const pe_feed_decl *f, char *buf, size_t len) {
  size_t off = (size_t)snprintf(buf, len, "[N");
  for (int i = 1; i < f->ndim && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, ",%lld", (long long)f->dims[i]);
  if (off < len) snprintf(buf + off, len - off, "]");
}

int pe_feed_array_check(pe_feed_array *a, const pe_feed_decl *f, const char *file, const char *what,
                        char *err, size_t errlen) {
  char want[200], got[200];
  rows_shape(f, want, sizeof want);
  pe_feed_shape_str(a->ndim, a->dims, got, sizeof got);
  if (a->dtype != f->dtype) {
    snprintf(err, errlen, "%s: %s is %s %s; the model's feed '%s' is %s %s", file, what,
             pe_feed_dtype_str(a->dtype), got, f->name, pe_feed_dtype_str(f->dtype), want);
    return -1;
  }
  /* [N, D] for a declared [-1, D, 1]: the same rows. */
  if (a->ndim + 1 == f->ndim && f->dims[f->ndim - 1] == 1) a->dims[a->ndim++] = 1;
  bool fits = a->ndim == f->ndim;
  for (int i = 1; fits && i < f->ndim; i++) fits = a->dims[i] == f->dims[i];
  if (!fits) {
    snprintf(err, errlen, "%s: %s has shape %s; the model's feed '%s' needs %s", file, what, got,
             f->name, want);
    return -1;
  }
  return 0;
}

int pe_feed_data_finish(pe_feed_data *d, const char *file, char *err, size_t errlen) {
  if (d->x.dims[0] != d->y.dims[0]) {
    snprintf(err, errlen, "%s: the input has %lld rows, the label %lld", file,
             (long long)d->x.dims[0], (long long)d->y.dims[0]);
    return -1;
  }
  d->n = d->rows.n = d->x.dims[0];
  return 0;
}

/* Rows keep[i] of a into a fresh array of n rows. */
static int take_rows(const pe_feed_array *a, const int64_t *keep, int64_t n, pe_feed_array *out) {
  *out = *a;
  out->borrowed = false;
  out->dims[0] = n;
  out->data = malloc((size_t)n * a->row_bytes + 1);
  if (!out->data) return -1;
  for (int64_t i = 0; i < n; i++)
    memcpy((char *)out->data + (size_t)i * a->row_bytes,
           (const char *)a->data + (size_t)keep[i] * a->row_bytes, a->row_bytes);
  return 0;
}

int pe_feed_data_split(pe_feed_data *d, double fraction, uint64_t seed, pe_feed_data **test,
                       char *err, size_t errlen) {
  int64_t n = d->n, nt = (int64_t)(fraction * (double)n);
  if (nt < 1) nt = 1;
  if (n < 2 || nt >= n) {
    snprintf(err, errlen, "%lld rows cannot be split into training and test rows (%g held out)",
             (long long)n, fraction);
    return -1;
  }
  /* Which rows are held out: the first nt of a seeded order, the same
   * way pe_batcher shuffles an epoch, an epoch number that training never
   * reaches (1 << 20), so that the split is not one epoch's order. */
  pe_batcher *bt = pe_feed_data_batcher(d, (int)(n < (1 << 30) ? n : 1 << 30), true, seed);
  bool *held = calloc((size_t)n, sizeof *held);
  int64_t *tr = malloc((size_t)n * sizeof *tr), *te = malloc((size_t)nt * sizeof *te);
  *test = pe_feed_data_new(d->kind);
  int rc = -1;
  const int64_t *idx;
  int got;
  if (bt && held && tr && te && *test && pe_batcher_seek(bt, 1 << 20, 0) &&
      pe_batcher_claim(bt, &idx, &got) && got >= nt) {
    for (int64_t i = 0; i < nt; i++) held[idx[i]] = true;
    int64_t a = 0, b = 0;
    for (int64_t i = 0; i < n; i++) {
      if (held[i])
        te[b++] = i;
      else
        tr[a++] = i;
    }
    pe_feed_array x, y;
    if (!take_rows(&d->x, te, nt, &(*test)->x) && !take_rows(&d->y, te, nt, &(*test)->y) &&
        !take_rows(&d->x, tr, n - nt, &x)) {
      if (!take_rows(&d->y, tr, n - nt, &y)) {
        if (!d->x.borrowed) free(d->x.data);
        if (!d->y.borrowed) free(d->y.data);
        d->x = x;
        d->y = y;
        d->n = d->rows.n = n - nt;
        (*test)->n = (*test)->rows.n = nt;
        rc = 0;
      } else {
        free(x.data);
      }
    }
  }
  if (rc) {
    snprintf(err, errlen, "out of memory splitting %lld rows", (long long)n);
    pe_feed_data_free(*test);
    *test = NULL;
  }
  pe_batcher_free(bt);
  free(held);
  free(tr);
  free(te);
  return rc;
}

pe_batcher *pe_feed_data_batcher(pe_feed_data *d, int batch, bool shuffle, uint64_t seed) {
  d->rows.n = d->n;
  return pe_batcher_new(&d->rows, batch, shuffle, seed);
}

void pe_feed_data_gather(const pe_feed_data *d, const int64_t *idx, int lo, int hi, void *x,
                         void *y) {
  size_t xr = d->x.row_bytes, yr = d->y.row_bytes;
  for (int i = lo; i < hi; i++) {
    size_t e = (size_t)idx[i];
    if (x) memcpy((char *)x + (size_t)i * xr, (const char *)d->x.data + e * xr, xr);
    if (y) memcpy((char *)y + (size_t)i * yr, (const char *)d->y.data + e * yr, yr);
  }
}
