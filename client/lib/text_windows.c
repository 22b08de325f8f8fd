/* pe_text_read (pe_feed_data.h): a text file as the windows of a
 * byte-level language model. Token ids are byte values (a vocabulary of
 * 256, the same for every file, so a model trained on one text reads
 * another). The first 90% of the bytes train, the last 10% validate.
 * A split of L bytes gives (L - 1) / T windows at stride T: window i is
 * bytes [iT, iT + T + 1), its input the first T, its label (the next
 * byte of each position) the last T. The batcher shuffles the windows
 * per epoch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pe_builder.h"
#include "pe_feed_data.h"

/* The windows of bytes [0, len) into a fresh pe_feed_data. */
static pe_feed_data *windows(const unsigned char *bytes, int64_t len, int64_t T, int yndim) {
  int64_t n = (len - 1) / T;
  pe_feed_data *d = pe_feed_data_new(PE_FEED_TEXT);
  if (!d) return NULL;
  d->x = (pe_feed_array){
      .dtype = PE_B_I64, .ndim = 2, .dims = {n, T}, .row_bytes = (size_t)T * sizeof(int64_t)};
  d->y = d->x;
  d->y.ndim = yndim;
  d->y.dims[2] = 1;
  d->x.data = malloc((size_t)n * d->x.row_bytes + 1);
  d->y.data = malloc((size_t)n * d->y.row_bytes + 1);
  if (!d->x.data || !d->y.data) {
    pe_feed_data_free(d);
    return NULL;
  }
  int64_t *x = d->x.data, *y = d->y.data;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < T; j++) {
      x[i * T + j] = bytes[i * T + j];
      y[i * T + j] = bytes[i * T + j + 1];
    }
  d->n = d->rows.n = n;
  return d;
}

int pe_text_read(const char *path, const pe_feed_decl *x, const pe_feed_decl *y,
                 pe_feed_data **train, pe_feed_data **valid, char *err, size_t errlen) {
  *train = *valid = NULL;
  char want[200];
  bool x_ok = x->dtype == PE_B_I64 && x->ndim == 2 && x->dims[1] > 0;
  int64_t T = x_ok ? x->dims[1] : 0;
  bool y_ok = y->dtype == PE_B_I64 && (y->ndim == 2 || (y->ndim == 3 && y->dims[2] == 1)) &&
              y->dims[1] == T;
  if (!x_ok || !y_ok) {
    const pe_feed_decl *bad = x_ok ? y : x;
    snprintf(err, errlen,
             "%s: text trains a model whose input and label feeds are i64 [-1,T] token ids "
             "(label [-1,T] or [-1,T,1]); the model's feed '%s' is %s %s",
             path, bad->name, pe_feed_dtype_str(bad->dtype),
             pe_feed_shape_str(bad->ndim, bad->dims, want, sizeof want));
    return -1;
  }
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  unsigned char *bytes = NULL;
  size_t len = 0, cap = 0;
  bool oom = false;
  for (;;) {
    if (len == cap) {
      size_t more = cap ? 2 * cap : 1 << 16;
      unsigned char *grown = realloc(bytes, more);
      if ((oom = !grown)) break;
      bytes = grown;
      cap = more;
    }
    size_t k = fread(bytes + len, 1, cap - len, fp);
    len += k;
    if (k == 0) break;
  }
  bool read_err = ferror(fp) || oom;
  fclose(fp);
  int64_t valid_len = (int64_t)len / 10, train_len = (int64_t)len - valid_len;
  int rc = -1;
  if (read_err)
    snprintf(err, errlen, "%s: cannot read it (%s)", path, oom ? "out of memory" : "I/O");
  else if (valid_len < T + 1)
    snprintf(err, errlen,
             "%s: %zu bytes; T = %lld (the model's feed '%s') needs at least %lld, so that its "
             "last 10%% (the validation split) holds one window of T + 1 bytes",
             path, len, (long long)T, x->name, (long long)(10 * (T + 1)));
  else if (!(*train = windows(bytes, train_len, T, y->ndim)) ||
           !(*valid = windows(bytes + train_len, valid_len, T, y->ndim)))
    snprintf(err, errlen, "%s: out of memory for the windows", path);
  else
    rc = 0;
  if (rc) {
    pe_feed_data_free(*train);
    *train = NULL;
  }
  free(bytes);
  return rc;
}
