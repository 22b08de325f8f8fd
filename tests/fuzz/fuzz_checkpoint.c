/* Checkpoint files (server/checkpoint/file.h): the reader that Load, a
 * register's restore and pe-client import run over a file from disk. Each
 * input is read twice: as it is (magic, version, CRC, the truncation
 * report), and with its last four bytes replaced by the CRC of the rest,
 * so that the records behind the CRC are reached. A file the reader
 * accepts then goes where a loaded one goes before it reaches a model: its
 * shapes are matched against a declaration (server/registry/model_shapes.h, the
 * register's check), its values scanned as a save scans them, and it is
 * written again: reading that back gives the same bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/finite.h"
#include "server/checkpoint/file.h"
#include "server/registry/model_shapes.h"

static void fail(const char *what) {
  fprintf(stderr, "fuzz_checkpoint: %s\n", what);
  abort();
}

/* What the register's restore and a save do with each value. */
static void use_entries(const pe_ckpt_entry *e, int n) {
  for (int i = 0; i < n; i++) {
    const pe_shape *s = &e[i].t.shape;
    if (pe_shape_numel(s) < 0) fail("a read shape has an unknown dimension");
    for (int d = 0; d <= s->ndim; d++) {
      (void)pe_shape_prod(s, 0, d);
      (void)pe_shape_prod(s, d, s->ndim);
    }
    pe_var_info have = {e[i].name, e[i].t.dtype, *s};
    pe_var_info want = {e[i].name, PE_F32, PE_SHAPE(-1, 784)};
    char why[2 * PE_SHAPE_STRLEN + 256];
    (void)pe_var_misfit(&have, &want, PE_FIT_DECL, why, sizeof why);
    (void)pe_var_misfit(&have, &have, PE_FIT_VALUE, why, sizeof why);
    int64_t first;
    if (pe_tensor_nonfinite(&e[i].t, &first) > 0) (void)pe_tensor_nonfinite_str(&e[i].t, first);
  }
}

/* Written again and read back: the same tensors and mark, so the same bytes. */
static void round_trip(const pe_ckpt_entry *e, int n, const pe_model_mark *mark) {
  uint8_t *a = NULL, *b = NULL;
  size_t alen = 0, blen = 0;
  pe_status *st = pe_ckpt_encode(e, n, mark, &a, &alen);
  if (st) fail(pe_status_msg(st));
  pe_ckpt_entry *e2 = NULL;
  int n2 = 0;
  pe_model_mark mark2;
  st = pe_ckpt_decode(a, alen, "round trip", &e2, &n2, &mark2);
  if (st) fail(pe_status_msg(st));
  st = pe_ckpt_encode(e2, n2, &mark2, &b, &blen);
  if (st) fail(pe_status_msg(st));
  if (n2 != n || alen != blen || memcmp(a, b, alen)) fail("a written file reads back differently");
  pe_ckpt_entries_free(e2, n2);
  pe_model_mark_release(&mark2);
  free(a);
  free(b);
}

static void read_one(const uint8_t *buf, size_t len) {
  pe_ckpt_entry *e = NULL;
  int n = 0;
  pe_model_mark mark;
  pe_status *st = pe_ckpt_decode(buf, len, "fuzz", &e, &n, &mark);
  if (st) {
    pe_status_free(st);
    return;
  }
  use_entries(e, n);
  round_trip(e, n, &mark);
  pe_ckpt_entries_free(e, n);
  pe_model_mark_release(&mark);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  read_one(data, size);
  if (size < 4) return 0;
  uint8_t *fixed = malloc(size);
  if (!fixed) return 0;
  memcpy(fixed, data, size);
  uint32_t crc = pe_crc32(fixed, size - 4);
  for (int i = 0; i < 4; i++) fixed[size - 4 + (size_t)i] = (uint8_t)(crc >> (8 * i));
  read_one(fixed, size);
  free(fixed);
  return 0;
}
