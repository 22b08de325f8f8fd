/* A small .npz writer for the tests of pe-client's own data (numpy.savez's
 * format: a zip of .npy files; libzip, as libpeclient reads it). */
#ifndef PE_TESTS_NPZ_WRITE_H
#define PE_TESTS_NPZ_WRITE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

typedef struct npz_array {
  const char *name;  /* the entry is name + ".npy" */
  const char *descr; /* "<f4", "<i8", ... */
  int ndim;
  int64_t dims[4];
  const void *data; /* prod(dims) elements of descr's size */
  size_t elem;      /* bytes per element */
  bool fortran;     /* fortran_order: True */
} npz_array;

/* Writes the arrays to path (deflated when deflate); false on an error. */
static inline bool npz_write(const char *path, const npz_array *a, int n, bool deflate) {
  int zerr;
  zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &zerr);
  if (!z) return false;
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    char hdr[256], shape[96] = "";
    size_t off = 0, count = 1;
    for (int k = 0; k < a[i].ndim; k++) {
      off += (size_t)snprintf(shape + off, sizeof shape - off, "%lld,", (long long)a[i].dims[k]);
      count *= (size_t)a[i].dims[k];
    }
    int h = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }",
                     a[i].descr, a[i].fortran ? "True" : "False", shape);
    size_t hlen = ((size_t)h + 10 + 1 + 63) / 64 * 64 - 10; /* total a multiple of 64 */
    size_t bytes = 10 + hlen + count * a[i].elem;
    unsigned char *buf = malloc(bytes);
    if (!buf) {
      ok = false;
      break;
    }
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    memset(buf + 10, ' ', hlen);
    memcpy(buf + 10, hdr, (size_t)h);
    buf[10 + hlen - 1] = '\n';
    memcpy(buf + 10 + hlen, a[i].data, count * a[i].elem);
    char entry[128];
    snprintf(entry, sizeof entry, "%s.npy", a[i].name);
    zip_source_t *src = zip_source_buffer(z, buf, bytes, 1); /* frees buf */
    zip_int64_t idx = src ? zip_file_add(z, entry, src, ZIP_FL_OVERWRITE) : -1;
    if (idx < 0) {
      if (src) zip_source_free(src);
      ok = false;
    } else if (zip_set_file_compression(z, (zip_uint64_t)idx,
                                        deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0)) {
      ok = false;
    }
  }
  if (zip_close(z)) {
    zip_discard(z);
    return false;
  }
  return ok;
}

#endif
