/* A model's parameters in a file of one's own (pe_params_file.h), in the
 * daemon's checkpoint format (daemon/format). */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "core/strmap.h"
#include "format/checkpoint_format.h"
#include "format/durable_file.h"
#include "pe_params_file.h"

#define PARAMS_FILE_MAX ((size_t)1 << 36) /* 64 GiB: a bound, not a limit anyone meets */

/* st's message into err; frees st; -1. */
static int fail(pe_status *st, char *err, size_t errlen) {
  snprintf(err, errlen, "%s", pe_status_msg(st));
  pe_status_free(st);
  return -1;
}

/* t[0..n) as the file takes them: each checked, the names unique (a file
 * holds one value per name). */
static int check_tensors(const pe_client_tensor *t, size_t n, const char *path, char *err,
                         size_t errlen) {
  if (n && !t) return snprintf(err, errlen, "%s: %zu tensors but no array (NULL)", path, n), -1;
  if (n > INT32_MAX)
    return snprintf(err, errlen, "%s: %zu tensors (at most %d)", path, n, INT32_MAX), -1;
  pe_strmap seen;
  pe_strmap_init(&seen);
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (pec_tensor_check(path, &t[i], true, err, errlen)) {
      rc = -1;
    } else if (pe_strmap_has(&seen, t[i].name)) {
      snprintf(err, errlen, "%s: tensor '%s' given twice", path, t[i].name);
      rc = -1;
    } else if (!pe_strmap_put(&seen, t[i].name, NULL)) {
      snprintf(err, errlen, "%s: out of memory checking %zu names", path, n);
      rc = -1;
    }
  }
  pe_strmap_destroy(&seen);
  return rc;
}

int pe_params_file_write(const pe_client_tensor *t, size_t n, const char *path, uint64_t *bytes,
                         char *err, size_t errlen) {
  if (!path || !*path) return snprintf(err, errlen, "params file: no path"), -1;
  if (check_tensors(t, n, path, err, errlen)) return -1;
  /* Views of the fetched values: the encoder only reads them. */
  pe_ckpt_entry *e = calloc(n ? n : 1, sizeof *e);
  if (!e) return snprintf(err, errlen, "out of memory for %zu tensors", n), -1;
  for (size_t i = 0; i < n; i++) {
    e[i].name = (char *)t[i].name;
    e[i].t.dtype = (pe_dtype)t[i].dtype;
    e[i].t.shape.ndim = t[i].ndim;
    memcpy(e[i].t.shape.d, t[i].shape, sizeof(int64_t) * (size_t)t[i].ndim);
    e[i].t.data = (void *)t[i].data;
    e[i].t.cap = t[i].nbytes;
  }
  uint8_t *buf = NULL;
  size_t len = 0;
  pe_status *st = pe_ckpt_encode(e, (int)n, NULL, &buf, &len);
  free(e);
  if (st) return fail(st, err, errlen);
  /* pe_write_atomic takes the directory and the name apart. */
  char *d = strdup(path), *f = strdup(path);
  if (!d || !f)
    st = pe_error(PE_ENOMEM, "out of memory");
  else
    st = pe_write_atomic(dirname(d), basename(f), buf, len);
  free(d);
  free(f);
  free(buf);
  if (st) return fail(st, err, errlen);
  if (bytes) *bytes = len;
  return 0;
}

typedef struct entries {
  pe_ckpt_entry *e;
  int n;
} entries;

int pe_params_file_read(const char *path, pe_params_file *out, char *err, size_t errlen) {
  *out = (pe_params_file){0};
  if (!path || !*path) return snprintf(err, errlen, "params file: no path"), -1;
  uint8_t *buf = NULL;
  size_t len = 0;
  pe_status *st = pe_read_file(path, PARAMS_FILE_MAX, &buf, &len);
  entries *en = st ? NULL : calloc(1, sizeof *en);
  if (!st && !en) st = pe_error(PE_ENOMEM, "out of memory");
  if (!st) st = pe_ckpt_decode(buf, len, path, &en->e, &en->n, NULL);
  free(buf);
  if (st) {
    free(en);
    return fail(st, err, errlen);
  }
  out->impl = en;
  out->n = (size_t)en->n;
  out->t = calloc(out->n ? out->n : 1, sizeof *out->t);
  if (!out->t) {
    pe_params_file_free(out);
    return snprintf(err, errlen, "out of memory for %d tensors", en->n), -1;
  }
  for (int i = 0; i < en->n; i++) {
    const pe_tensor *v = &en->e[i].t;
    pe_client_tensor *c = &out->t[i];
    c->name = en->e[i].name;
    c->dtype = (pe_b_dtype)v->dtype;
    c->ndim = v->shape.ndim;
    memcpy(c->shape, v->shape.d, sizeof(int64_t) * (size_t)v->shape.ndim);
    c->data = v->data;
    c->nbytes = (size_t)pe_shape_numel(&v->shape) * pe_dtype_size(v->dtype);
  }
  return 0;
}

void pe_params_file_free(pe_params_file *p) {
  if (!p) return;
  entries *en = p->impl;
  if (en) pe_ckpt_entries_free(en->e, en->n);
  free(en);
  free(p->t);
  *p = (pe_params_file){0};
}
