/* The checkpoint file format (see format/checkpoint_format.h). */
#include "format/checkpoint_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Version 02 added the run origins, 03 the generator offset; 01 and 02
 * files still load (without what they lack). */
static const char ckpt_magic[8] = {'P', 'E', 'C', 'K', 'P', 'T', '0', '3'};
static const char ckpt_magic_v2[8] = {'P', 'E', 'C', 'K', 'P', 'T', '0', '2'};
static const char ckpt_magic_v1[8] = {'P', 'E', 'C', 'K', 'P', 'T', '0', '1'};
#define ORIGIN_BYTES 20 /* client u64, request u64, steps u32 */

void pe_ckpt_entries_free(pe_ckpt_entry *e, int n) {
  if (!e) return;
  for (int i = 0; i < n; i++) {
    free(e[i].name);
    pe_tensor_release(&e[i].t);
  }
  free(e);
}

uint32_t pe_crc32(const uint8_t *p, size_t n) {
  return (uint32_t)crc32_z(0, p, n);
}

/* --- encode ---------------------------------------------------------------- */
typedef struct wbuf {
  uint8_t *p;
  size_t len, cap;
  bool oom;
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
  if (w->oom) return;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < w->len + n) cap *= 2;
    uint8_t *p = realloc(w->p, cap);
    if (!p) {
      w->oom = true;
      return;
    }
    w->p = p;
    w->cap = cap;
  }
  memcpy(w->p + w->len, src, n);
  w->len += n;
}

static void put_u32(wbuf *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  put(w, b, 4);
}

static void put_u64(wbuf *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(w, b, 8);
}

static int cmp_entry_name(const void *a, const void *b) {
  const pe_ckpt_entry *x = *(const pe_ckpt_entry *const *)a, *y = *(const pe_ckpt_entry *const *)b;
  return strcmp(x->name, y->name);
}

pe_status *pe_ckpt_encode(const pe_ckpt_entry *e, int n, const pe_model_mark *mark, uint8_t **buf,
                          size_t *len) {
  const pe_model_mark none = {0};
  if (!mark) mark = &none;
  const pe_ckpt_entry **order = calloc(n ? (size_t)n : 1, sizeof *order);
  if (!order) return pe_error(PE_ENOMEM, "checkpoint: out of memory sorting %d tensors", n);
  for (int i = 0; i < n; i++) order[i] = &e[i];
  qsort(order, (size_t)n, sizeof *order, cmp_entry_name);
  wbuf w = {0};
  put(&w, ckpt_magic, sizeof ckpt_magic);
  put_u32(&w, (uint32_t)n);
  for (int i = 0; i < n; i++) {
    const pe_ckpt_entry *x = order[i];
    size_t nl = strlen(x->name);
    put_u32(&w, (uint32_t)nl);
    put(&w, x->name, nl);
    put_u32(&w, (uint32_t)x->t.dtype);
    put_u32(&w, (uint32_t)x->t.shape.ndim);
    for (int d = 0; d < x->t.shape.ndim; d++) put_u64(&w, (uint64_t)x->t.shape.d[d]);
    size_t nb = pe_tensor_bytes(&x->t);
    put_u64(&w, nb);
    if (nb) put(&w, x->t.data, nb);
  }
  free(order);
  put_u32(&w, (uint32_t)mark->n_origins);
  for (int i = 0; i < mark->n_origins; i++) {
    put_u64(&w, mark->origins[i].client);
    put_u64(&w, mark->origins[i].request);
    put_u32(&w, mark->origins[i].steps);
  }
  put_u32(&w, mark->has_rng ? 1u : 0u);
  put_u64(&w, mark->has_rng ? mark->rng_offset : 0);
  if (!w.oom) put_u32(&w, pe_crc32(w.p, w.len));
  if (w.oom) {
    free(w.p);
    return pe_error(PE_ENOMEM, "checkpoint: out of memory encoding %d tensors", n);
  }
  *buf = w.p;
  *len = w.len;
  return NULL;
}

/* --- decode ---------------------------------------------------------------- */
typedef struct rbuf {
  const uint8_t *p;
  size_t len, off;
} rbuf;

static bool get(rbuf *r, void *dst, size_t n) {
  if (n > r->len - r->off) return false;
  memcpy(dst, r->p + r->off, n);
  r->off += n;
  return true;
}

static bool get_u32(rbuf *r, uint32_t *v) {
  uint8_t b[4];
  if (!get(r, b, 4)) return false;
  *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  return true;
}

static bool get_u64(rbuf *r, uint64_t *v) {
  uint8_t b[8];
  if (!get(r, b, 8)) return false;
  *v = 0;
  for (int i = 0; i < 8; i++) *v |= (uint64_t)b[i] << (8 * i);
  return true;
}

/* A header byte as a message may show it. */
static char printable(uint8_t c) {
  return c >= 0x20 && c < 0x7f ? (char)c : '?';
}

/* --- a file cut short ------------------------------------------------------- */
/* A file's fields read in order, at offsets that may lie past its end: the
 * first that does not fit says how long the file would have to be. */
typedef struct walk {
  const uint8_t *p;
  size_t len;
  uint64_t off;
  bool cut;      /* a field ran past the end */
  uint64_t need; /* then: the end of that field */
} walk;

/* Skip n bytes (the tensors' data, names). */
static void walk_skip(walk *w, uint64_t n) {
  if (w->cut) return;
  w->off += n;
  if (w->off > w->len) {
    w->cut = true;
    w->need = w->off;
  }
}

/* A little-endian field of `bytes` bytes (0 once cut). */
static uint64_t walk_uint(walk *w, int bytes) {
  uint64_t at = w->off, v = 0;
  walk_skip(w, (uint64_t)bytes);
  if (!w->cut)
    for (int i = 0; i < bytes; i++) v |= (uint64_t)w->p[at + (uint64_t)i] << (8 * i);
  return v;
}

/* The file fails its CRC: is it the start of a well-formed one (a copy or
 * a write cut short)? Walks the records over all len bytes, skipping the
 * tensors' data, checking that each record holds together (a name length,
 * dtype, rank and dims, and a byte count that matches them), until a field
 * runs past the end. Yes: *need is the least length the file must have
 * had (that field's end, plus 21 bytes for each tensor after it and the
 * trailer of its version without run origins), *tensor the tensor it ran
 * out in (-1: the trailer) and *count their number. No (a record that
 * does not hold together, or every field there): a corrupt byte, said as
 * the CRC mismatch. */
static bool cut_short(const uint8_t *buf, size_t len, bool v1, bool v2, uint64_t *need,
                      int64_t *tensor, uint32_t *count) {
  enum { MIN_TENSOR = 21 }; /* name length, a 1-byte name, dtype, rank, byte count */
  walk w = {buf, len, sizeof ckpt_magic, false, 0};
  /* After the tensors: the run origins' count (02, 03), the generator
   * record (03), the CRC. */
  const uint64_t trailer = (v1 ? 0 : 4) + (v1 || v2 ? 0 : 12) + 4;
  uint32_t n = (uint32_t)walk_uint(&w, 4);
  *tensor = -1;
  for (uint32_t i = 0; i < n && !w.cut; i++) {
    *tensor = i;
    uint64_t nl = walk_uint(&w, 4);
    if (!w.cut && (nl == 0 || nl > 4096)) return false;
    walk_skip(&w, nl);
    uint64_t dt = walk_uint(&w, 4), nd = walk_uint(&w, 4);
    if (!w.cut && (!pe_dtype_valid((int)dt) || nd > PE_MAX_DIMS)) return false;
    uint64_t numel = 1;
    for (uint64_t d = 0; d < nd && !w.cut; d++) {
      uint64_t v = walk_uint(&w, 8);
      if (!w.cut && v > (uint64_t)1 << 40) return false;
      numel = v == 0 || numel <= UINT64_MAX / v ? numel * v : UINT64_MAX;
    }
    uint64_t nb = walk_uint(&w, 8), es = pe_dtype_size((pe_dtype)dt);
    if (!w.cut && (numel > UINT64_MAX / es || nb != numel * es)) return false;
    walk_skip(&w, nb);
  }
  if (w.cut) {
    *need = w.need + (uint64_t)(n - (uint32_t)*tensor - 1) * MIN_TENSOR + trailer;
  } else {
    /* Every tensor is there: a file that ends before the run origins'
     * count is cut short; past it, a count that does not fit is as likely
     * a corrupt count (said as the CRC mismatch). */
    *tensor = -1;
    if (w.off + trailer <= len) return false;
    *need = w.off + trailer;
  }
  *count = n;
  return true;
}

/* The magic and the CRC: the file's version (*v1, *v2; neither: 03), and
 * that its bytes are the ones written. */
static pe_status *decode_check(const uint8_t *buf, size_t len, const char *what, bool *v1_out,
                               bool *v2_out) {
  bool v1 = len >= sizeof ckpt_magic && !memcmp(buf, ckpt_magic_v1, sizeof ckpt_magic_v1);
  bool v2 = len >= sizeof ckpt_magic && !memcmp(buf, ckpt_magic_v2, sizeof ckpt_magic_v2);
  bool v3 = len >= sizeof ckpt_magic && !memcmp(buf, ckpt_magic, sizeof ckpt_magic);
  /* Another version is told apart from junk before the CRC: a newer
   * daemon's file may check itself differently. */
  if (len >= sizeof ckpt_magic && !v1 && !v2 && !v3 && !memcmp(buf, ckpt_magic, 6))
    return pe_error(PE_ECORRUPT,
                    "checkpoint %s: format version '%c%c', this daemon reads versions 01 to %c%c "
                    "(written by another pe-executord version?)",
                    what, printable(buf[6]), printable(buf[7]), ckpt_magic[6], ckpt_magic[7]);
  if (len < sizeof ckpt_magic + 8 || (!v1 && !v2 && !v3))
    return pe_error(PE_ECORRUPT, "checkpoint %s: not a pe checkpoint (bad magic or %zu bytes)",
                    what, len);
  rbuf crc_r = {buf, len, len - 4};
  uint32_t want;
  get_u32(&crc_r, &want);
  uint32_t got = pe_crc32(buf, len - 4);
  uint64_t need;
  int64_t at;
  uint32_t count;
  if (got != want && cut_short(buf, len, v1, v2, &need, &at, &count)) {
    char where[64] = "in its trailer";
    if (at >= 0) snprintf(where, sizeof where, "in tensor %lld of %u", (long long)at + 1, count);
    return pe_error(PE_ECORRUPT,
                    "checkpoint %s: truncated: %zu of at least %llu bytes (the file ends %s; a "
                    "copy or write cut short?)",
                    what, len, (unsigned long long)need, where);
  }
  if (got != want)
    return pe_error(PE_ECORRUPT, "checkpoint %s: CRC mismatch (stored %08x, computed %08x)", what,
                    want, got);
  *v1_out = v1;
  *v2_out = v2;
  return NULL;
}

/* Tensor i's record at r into *e: its name, dtype, shape (every range of
 * it within PE_MAX_NUMEL) and data. On error *e holds what it got (the
 * caller frees it). */
static pe_status *decode_tensor(rbuf *r, const char *what, uint32_t i, pe_ckpt_entry *e) {
  uint32_t nl, dt, nd;
  if (!get_u32(r, &nl) || nl == 0 || nl > 4096 || nl > r->len - r->off)
    return pe_error(PE_ECORRUPT, "checkpoint %s: tensor %u: bad name length", what, i);
  e->name = malloc(nl + 1);
  if (!e->name) return pe_error(PE_ENOMEM, "checkpoint %s: out of memory", what);
  get(r, e->name, nl);
  e->name[nl] = 0;
  if (memchr(e->name, 0, nl))
    return pe_error(PE_ECORRUPT, "checkpoint %s: tensor %u: NUL in name", what, i);
  if (!get_u32(r, &dt) || !pe_dtype_valid((int)dt) || !get_u32(r, &nd) || nd > PE_MAX_DIMS)
    return pe_error(PE_ECORRUPT, "checkpoint %s: tensor '%s': bad dtype or rank", what, e->name);
  pe_shape shape = {.ndim = (int)nd};
  bool ok = true;
  for (uint32_t d = 0; d < nd && ok; d++) {
    uint64_t v;
    ok = get_u64(r, &v) && v <= (uint64_t)PE_MAX_NUMEL;
    shape.d[d] = ok ? (int64_t)v : 0;
  }
  /* Every range of the shape has a product that fits, so the code that
   * takes the values (pe_shape_prod of the inner dims) cannot overflow. */
  char tensor[160];
  snprintf(tensor, sizeof tensor, "tensor '%.128s'", e->name);
  pe_status *bad = ok ? pe_shape_check(&shape, PE_MAX_NUMEL, tensor) : NULL;
  if (bad) {
    pe_status *st = pe_error(PE_ECORRUPT, "checkpoint %s: %s", what, pe_status_msg(bad));
    pe_status_free(bad);
    return st;
  }
  uint64_t numel = ok ? (uint64_t)pe_shape_numel(&shape) : 0, nb;
  if (!ok || !get_u64(r, &nb) || nb != numel * pe_dtype_size((pe_dtype)dt) || nb > r->len - r->off)
    return pe_error(PE_ECORRUPT, "checkpoint %s: tensor '%s': bad shape or byte count", what,
                    e->name);
  pe_status *st = pe_tensor_resize(&e->t, (pe_dtype)dt, &shape, e->name);
  if (st) return st;
  if (nb) get(r, e->t.data, nb);
  return NULL;
}

/* After the tensors: the run origins (02, 03) and the generator record (03),
 * then nothing. mark (may be NULL) gets them only when all is well. */
static pe_status *decode_trailer(rbuf *r, const char *what, bool v1, bool v2, pe_model_mark *mark) {
  pe_status *st = NULL;
  uint32_t no = 0;
  pe_run_origin *o = NULL;
  if (!v1) {
    if (!get_u32(r, &no) || (size_t)no > (r->len - r->off) / ORIGIN_BYTES)
      st = pe_error(PE_ECORRUPT, "checkpoint %s: bad run origin count", what);
    else if (!(o = calloc(no ? no : 1, sizeof *o)))
      st = pe_error(PE_ENOMEM, "checkpoint %s: out of memory for %u run origins", what, no);
    for (uint32_t k = 0; !st && k < no; k++)
      if (!get_u64(r, &o[k].client) || !get_u64(r, &o[k].request) || !get_u32(r, &o[k].steps))
        st = pe_error(PE_ECORRUPT, "checkpoint %s: run origin %u truncated", what, k);
  }
  uint32_t has_rng = 0;
  uint64_t rng_offset = 0;
  if (!st && !v1 && !v2 && (!get_u32(r, &has_rng) || has_rng > 1 || !get_u64(r, &rng_offset)))
    st = pe_error(PE_ECORRUPT, "checkpoint %s: bad generator record", what);
  if (!st && r->off != r->len)
    st = pe_error(PE_ECORRUPT, "checkpoint %s: %zu trailing bytes", what, r->len - r->off);
  if (st) {
    free(o);
    return st;
  }
  if (mark) {
    mark->origins = o;
    mark->n_origins = (int)no;
    mark->has_rng = has_rng;
    mark->rng_offset = rng_offset;
  } else {
    free(o);
  }
  return NULL;
}

pe_status *pe_ckpt_decode(const uint8_t *buf, size_t len, const char *what, pe_ckpt_entry **out,
                          int *out_n, pe_model_mark *mark) {
  *out = NULL;
  *out_n = 0;
  if (mark) *mark = (pe_model_mark){0};
  bool v1 = false, v2 = false;
  pe_status *st = decode_check(buf, len, what, &v1, &v2);
  if (st) return st;
  rbuf r = {buf, len - 4, sizeof ckpt_magic};
  uint32_t n;
  if (!get_u32(&r, &n)) return pe_error(PE_ECORRUPT, "checkpoint %s: truncated header", what);
  /* Each entry takes at least 20 bytes: a count larger than that is a lie. */
  if ((size_t)n > (r.len - r.off) / 20 + 1)
    return pe_error(PE_ECORRUPT, "checkpoint %s: %u tensors cannot fit in %zu bytes", what, n, len);
  pe_ckpt_entry *e = calloc(n ? n : 1, sizeof *e);
  if (!e) return pe_error(PE_ENOMEM, "checkpoint %s: out of memory for %u tensors", what, n);
  for (uint32_t i = 0; i < n && !st; i++) st = decode_tensor(&r, what, i, &e[i]);
  if (!st) st = decode_trailer(&r, what, v1, v2, mark);
  if (st) {
    pe_ckpt_entries_free(e, (int)n);
    return st;
  }
  *out = e;
  *out_n = (int)n;
  return NULL;
}
