/* pe_npz_read (pe_feed_data.h): numpy's .npz, a zip archive (libzip) of
 * .npy files, one per array, entry "<name>.npy".
 *
 * An .npy file: the magic "\x93NUMPY", version major.minor, the header's
 * length (2 bytes little-endian in version 1, 4 in 2 and 3), then the
 * header, a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (150, 4), }
 * and the data, C order. The header is read here as far as those three
 * keys go; the data is copied as it is (little-endian dtypes only), but
 * for '<f8' into an f32 feed, which is narrowed to f32. */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

#include "pe_builder.h"
#include "pe_feed_data.h"

#define NPY_HEADER_MAX 65536

/* The value text after 'key': in header h; NULL when absent. */
static const char *npy_key(const char *h, const char *key) {
  char q[64];
  snprintf(q, sizeof q, "'%s'", key);
  const char *p = strstr(h, q);
  if (!p) return NULL;
  p += strlen(q);
  while (isspace((unsigned char)*p)) p++;
  if (*p != ':') return NULL;
  p++;
  while (isspace((unsigned char)*p)) p++;
  return p;
}

/* descr, fortran_order and shape of header h into a; -1 with a message. */
static int npy_parse_header(const char *h, const char *file, const char *what, pe_feed_array *a,
                            char *err, size_t errlen) {
  const char *d = npy_key(h, "descr"), *fo = npy_key(h, "fortran_order"), *sh = npy_key(h, "shape");
  if (!d || !fo || !sh || (*d != '\'' && *d != '"') || *sh != '(') {
    snprintf(err, errlen, "%s: array '%s': not a .npy header (descr, fortran_order, shape)", file,
             what);
    return -1;
  }
  static const struct {
    const char *descr;
    int dtype;
    size_t size;
  } kinds[] = {{"<f4", PE_B_F32, 4},
               {"<i8", PE_B_I64, 8},
               {"<f8", PE_B_F64, 8},
               {"<i4", PE_B_I32, 4},
               {"|u1", PE_B_U8, 1}};
  size_t size = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !size; i++)
    if (!strncmp(d + 1, kinds[i].descr, 3) && d[4] == d[0]) {
      a->dtype = kinds[i].dtype;
      size = kinds[i].size;
    }
  if (!size) {
    snprintf(err, errlen, "%s: array '%s' has dtype %.12s (f4, f8, i4, i8, u1 are read)", file,
             what, d);
    return -1;
  }
  if (strncmp(fo, "False", 5)) {
    snprintf(err, errlen, "%s: array '%s' is in Fortran order (numpy.ascontiguousarray it)", file,
             what);
    return -1;
  }
  a->ndim = 0;
  const char *p = sh + 1;
  size_t per = size;
  for (;;) {
    while (isspace((unsigned char)*p) || *p == ',') p++;
    if (*p == ')') break;
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0 || a->ndim == PE_FEED_MAX_DIMS) {
      snprintf(err, errlen, "%s: array '%s': bad shape %.40s (at most %d dims)", file, what, sh,
               PE_FEED_MAX_DIMS);
      return -1;
    }
    a->dims[a->ndim++] = v;
    p = end;
  }
  if (a->ndim == 0) {
    snprintf(err, errlen, "%s: array '%s' is a scalar; it needs a row per example", file, what);
    return -1;
  }
  for (int i = 1; i < a->ndim; i++) per *= (size_t)a->dims[i];
  a->row_bytes = per;
  return 0;
}

/* Exactly n bytes of f, or -1. */
static int zread(zip_file_t *f, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    zip_int64_t k = zip_fread(f, (char *)buf + got, n - got);
    if (k <= 0) return -1;
    got += (size_t)k;
  }
  return 0;
}

/* n doubles at p into n floats at p: element i is read before float i
 * is written, and float i lies within doubles 0..i. */
static void narrow_f64(void *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double v;
    memcpy(&v, (char *)p + i * sizeof v, sizeof v);
    float f = (float)v;
    memcpy((char *)p + i * sizeof f, &f, sizeof f);
  }
}

/* Array `name` of z into a, checked against f. 1: no such entry. */
static int npz_array(zip_t *z, const char *file, const char *name, const pe_feed_decl *f,
                     pe_feed_array *a, char *err, size_t errlen) {
  char entry[PE_FEED_NAME_LEN + 16];
  snprintf(entry, sizeof entry, "%s.npy", name);
  zip_file_t *zf = zip_fopen(z, entry, 0);
  if (!zf) return 1;
  int rc = -1;
  unsigned char pre[10];
  char *h = NULL;
  uint32_t hlen = 0;
  if (zread(zf, pre, 10) || memcmp(pre, "\x93NUMPY", 6)) {
    snprintf(err, errlen, "%s: array '%s': not a .npy file", file, name);
    goto out;
  }
  hlen = pre[8] | (uint32_t)pre[9] << 8;
  if (pre[6] >= 2) { /* a 4-byte length: two more bytes */
    unsigned char more[2];
    if (zread(zf, more, 2)) goto truncated;
    hlen |= (uint32_t)more[0] << 16 | (uint32_t)more[1] << 24;
  }
  if (hlen > NPY_HEADER_MAX || !(h = calloc(hlen + 1, 1))) {
    snprintf(err, errlen, "%s: array '%s': a %u-byte header", file, name, hlen);
    goto out;
  }
  if (zread(zf, h, hlen)) goto truncated;
  char what[PE_FEED_NAME_LEN + 16];
  snprintf(what, sizeof what, "array '%s'", name);
  if (npy_parse_header(h, file, name, a, err, errlen)) goto out;
  /* f64 for an f32 feed (numpy's default dtype): read, then narrowed */
  bool narrow = a->dtype == PE_B_F64 && f->dtype == PE_B_F32;
  if (narrow) {
    a->dtype = PE_B_F32;
    a->row_bytes /= 2;
  }
  if (pe_feed_array_check(a, f, file, what, err, errlen)) goto out;
  size_t bytes = (size_t)a->dims[0] * a->row_bytes * (narrow ? 2 : 1);
  if (!(a->data = malloc(bytes + 1))) {
    snprintf(err, errlen, "%s: array '%s': out of memory for %zu bytes", file, name, bytes);
    goto out;
  }
  if (zread(zf, a->data, bytes)) goto truncated;
  if (narrow) narrow_f64(a->data, bytes / sizeof(double));
  rc = 0;
  goto out;
truncated:
  snprintf(err, errlen, "%s: array '%s' is truncated", file, name);
out:
  free(h);
  zip_fclose(zf);
  return rc;
}

int pe_npz_read(const char *path, const char *prefix, const pe_feed_decl *x, const pe_feed_decl *y,
                pe_feed_data **out, char *err, size_t errlen) {
  *out = NULL;
  int zerr = 0;
  zip_t *z = zip_open(path, ZIP_RDONLY, &zerr);
  if (!z) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, zerr);
    snprintf(err, errlen, "%s: cannot open as .npz: %s", path, zip_error_strerror(&ze));
    zip_error_fini(&ze);
    return -1;
  }
  pe_feed_data *d = pe_feed_data_new(PE_FEED_ARRAYS);
  char xn[PE_FEED_NAME_LEN + 8], yn[PE_FEED_NAME_LEN + 8];
  snprintf(xn, sizeof xn, "%s%s", prefix, x->name);
  snprintf(yn, sizeof yn, "%s%s", prefix, y->name);
  int rc = d ? npz_array(z, path, xn, x, &d->x, err, errlen) : -1;
  int rc_y = rc < 0 ? -1 : npz_array(z, path, yn, y, &d->y, err, errlen);
  if (!d)
    snprintf(err, errlen, "out of memory");
  else if (rc == 1 && rc_y == 1 && *prefix)
    rc = 1; /* no such split */
  else if (rc >= 0 && rc_y >= 0 && (rc == 1 || rc_y == 1)) {
    snprintf(err, errlen, "%s has no array '%s' (the model's feed '%s'%s)", path, rc == 1 ? xn : yn,
             rc == 1 ? x->name : y->name, *prefix ? "; a test split needs both arrays" : "");
    rc = -1;
  } else if (rc == 0 && rc_y < 0)
    rc = -1;
  if (!rc) rc = pe_feed_data_finish(d, path, err, errlen);
  zip_close(z);
  if (rc)
    pe_feed_data_free(d);
  else
    *out = d;
  return rc;
}
