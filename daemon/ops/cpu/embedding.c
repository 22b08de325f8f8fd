/* lookup_table_v2 (Paddle's embedding) and its gradient.
 *
 * Out[..., :] = W[Ids[...], :]: Ids (i64, any shape) picks rows of W
 * [vocab, dim], Out is Ids' shape plus [dim]. The row padding_idx (-1:
 * none) reads as zeros and gets no gradient. An id outside [0, vocab) is an
 * error naming the op, Ids, the id, where it is and the vocabulary size;
 * nothing is read or written out of bounds.
 * The gradient is dense by default (W@GRAD has W's shape: zeros, then each
 * id's Out@GRAD row added to its row). With is_sparse it is sparse
 * (registry.h, PE_ROWS_SUFFIX): W@GRAD [n, dim] and W@GRAD@ROWS [n] for the
 * n ids of the batch; slot k holds the k-th smallest distinct id with the
 * sum of its Out@GRAD rows, added in batch order as the dense sum adds them
 * (the same bits); the slots after the last distinct id are rows -1, values
 * 0. padding_idx gets no row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op_tables.h"

enum { EMB_W, EMB_IDS };
enum { EMB_OUT };
enum { EMBG_W, EMBG_IDS, EMBG_OUT, EMBG_DOUT };
enum { EMBG_DW, EMBG_DW_ROWS };

static pe_status *emb_check(pe_infer_ctx *c, pe_shape *out) {
  pe_meta *w = pe_in_meta(c, EMB_W, 0), *ids = pe_in_meta(c, EMB_IDS, 0);
  if (!w || !ids) return pe_infer_error(c, PE_EARITY, "needs inputs W and Ids");
  PE_TRY(pe_infer_expect_dtype(c, EMB_W, 0, PE_F32));
  PE_TRY(pe_infer_expect_dtype(c, EMB_IDS, 0, PE_I64));
  char sb[PE_SHAPE_STRLEN];
  if (w->shape.ndim != 2)
    return pe_infer_error(c, PE_ESHAPE, "input W '%s' %s must be 2-D [vocab, dim]",
                          pe_in_name(c, EMB_W, 0), pe_shape_str(&w->shape, sb, sizeof sb));
  if (ids->shape.ndim + 1 > PE_MAX_DIMS)
    return pe_infer_error(c, PE_ESHAPE, "input Ids '%s' %s has too many dims (at most %d)",
                          pe_in_name(c, EMB_IDS, 0), pe_shape_str(&ids->shape, sb, sizeof sb),
                          PE_MAX_DIMS - 1);
  int64_t pad = pe_attr_i(c->def, c->desc, "padding_idx");
  if (pad < -1 || (pad >= 0 && w->shape.d[0] >= 0 && pad >= w->shape.d[0]))
    return pe_infer_error(c, PE_EATTR,
                          "padding_idx %lld is outside [0, %lld), the rows of W '%s' %s (-1: none)",
                          (long long)pad, (long long)w->shape.d[0], pe_in_name(c, EMB_W, 0),
                          pe_shape_str(&w->shape, sb, sizeof sb));
  *out = ids->shape;
  out->d[out->ndim++] = w->shape.d[1];
  return NULL;
}

static pe_status *emb_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(emb_check(c, &out));
  pe_infer_set(c, EMB_OUT, PE_F32, &out);
  return NULL;
}

static pe_status *emb_grad_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(emb_check(c, &out));
  pe_meta *w = pe_in_meta(c, EMBG_W, 0), *ids = pe_in_meta(c, EMBG_IDS, 0);
  if (!pe_attr_b(c->def, c->desc, "is_sparse")) {
    if (c->out[EMBG_DW_ROWS].n)
      return pe_infer_error(c, PE_EARITY,
                            "output W@GRAD@ROWS '%s' is a sparse gradient's; set is_sparse",
                            c->out[EMBG_DW_ROWS].names[0]);
    pe_infer_set(c, EMBG_DW, PE_F32, &w->shape);
    return NULL;
  }
  if (c->out[EMBG_DW].n && !c->out[EMBG_DW_ROWS].n)
    return pe_infer_error(c, PE_EARITY,
                          "is_sparse: output W@GRAD '%s' needs its rows in W@GRAD@ROWS",
                          c->out[EMBG_DW].names[0]);
  int64_t n = pe_shape_numel(&ids->shape); /* -1 while the batch is unknown */
  pe_shape vals = PE_SHAPE(n, w->shape.d[1]), rows = PE_SHAPE(n);
  pe_infer_set(c, EMBG_DW, PE_F32, &vals);
  pe_infer_set(c, EMBG_DW_ROWS, PE_I64, &rows);
  return NULL;
}

/* The sparse gradient's maker: the default one plus the rows output. */
static pe_status *emb_grad(pe_grad_ctx *g) {
  PE_TRY(pe_grad_default(g));
  if (!pe_attr_b(g->def, g->fwd, "is_sparse")) return NULL;
  const char *w = pe_op_input_arg(g->fwd, "W");
  char rows[512];
  snprintf(rows, sizeof rows, "%s" PE_GRAD_SUFFIX PE_ROWS_SUFFIX, w ? w : "");
  return pe_op_output1(g->ops[g->n_ops - 1], "W" PE_GRAD_SUFFIX PE_ROWS_SUFFIX, rows);
}

/* Every id in [0, vocab), else the error for the first one that is not. */
static pe_status *emb_check_ids(pe_kernel_ctx *c, const pe_tensor *ids, int64_t vocab) {
  const int64_t *id = pe_i64(ids);
  int64_t n = pe_tensor_numel(ids);
  for (int64_t i = 0; i < n; i++) {
    if (id[i] >= 0 && id[i] < vocab) continue;
    const pe_slot *sl = pe_op_find_input(c->desc, "Ids");
    /* Ids' dim 0 is the batch: name the row as the client fed it. */
    int64_t per_row = ids->shape.ndim > 1 ? pe_shape_prod(&ids->shape, 1, ids->shape.ndim) : 1;
    char sb[PE_SHAPE_STRLEN];
    return pe_kernel_error(
        c, PE_EINVAL,
        "input Ids '%s' %s holds id %lld at element %lld (batch row %lld), "
        "outside the vocabulary [0, %lld) of W",
        sl && sl->n ? sl->args[0] : "", pe_shape_str(&ids->shape, sb, sizeof sb), (long long)id[i],
        (long long)i, (long long)(c->batch_row0 + (per_row ? i / per_row : 0)), (long long)vocab);
  }
  return NULL;
}

static pe_status *emb_kernel(pe_kernel_ctx *c) {
  pe_tensor *w = pe_kin(c, EMB_W, 0), *ids = pe_kin(c, EMB_IDS, 0), *out = pe_kout(c, EMB_OUT, 0);
  int64_t vocab = w->shape.d[0], dim = w->shape.d[1], n = pe_tensor_numel(ids);
  int64_t pad = pe_attr_i(c->def, c->desc, "padding_idx");
  PE_TRY(emb_check_ids(c, ids, vocab));
  const int64_t *id = pe_i64(ids);
  const float *wp = pe_f32(w);
  float *o = pe_f32(out);
  for (int64_t i = 0; i < n; i++) {
    if (id[i] == pad)
      memset(o + i * dim, 0, (size_t)dim * sizeof(float));
    else
      memcpy(o + i * dim, wp + id[i] * dim, (size_t)dim * sizeof(float));
  }
  return NULL;
}

/* W@GRAD dense: zeros, plus each id's Out@GRAD row (padding_idx skipped). */
static void emb_grad_dense(float *dw, int64_t vocab, int64_t dim, const int64_t *id, int64_t n,
                           const float *dout, int64_t pad) {
  memset(dw, 0, (size_t)(vocab * dim) * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    if (id[i] == pad) continue;
    float *row = dw + id[i] * dim;
    const float *g = dout + i * dim;
    for (int64_t j = 0; j < dim; j++) row[j] += g[j];
  }
}

typedef struct emb_pos {
  int64_t id, pos;
} emb_pos;

static int emb_pos_cmp(const void *a, const void *b) {
  const emb_pos *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* W@GRAD sparse (the file's comment): sort (id, position) pairs, then sum
 * each id's rows in position order into the next slot. */
static pe_status *emb_grad_sparse(pe_kernel_ctx *c, float *vals, int64_t *rows, int64_t dim,
                                  const int64_t *id, int64_t n, const float *dout, int64_t pad) {
  emb_pos *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
  if (!order)
    return pe_kernel_error(c, PE_ENOMEM, "out of memory sorting %lld ids of Ids", (long long)n);
  for (int64_t i = 0; i < n; i++) order[i] = (emb_pos){id[i], i};
  qsort(order, (size_t)n, sizeof *order, emb_pos_cmp);
  int64_t k = 0;
  for (int64_t s = 0; s < n;) {
    int64_t e = s + 1;
    while (e < n && order[e].id == order[s].id) e++;
    if (order[s].id != pad) {
      float *row = vals + k * dim;
      memcpy(row, dout + order[s].pos * dim, (size_t)dim * sizeof(float));
      for (int64_t q = s + 1; q < e; q++) {
        const float *g = dout + order[q].pos * dim;
        for (int64_t j = 0; j < dim; j++) row[j] += g[j];
      }
      rows[k++] = order[s].id;
    }
    s = e;
  }
  free(order);
  for (int64_t q = k; q < n; q++) rows[q] = -1;
  memset(vals + k * dim, 0, (size_t)((n - k) * dim) * sizeof(float));
  return NULL;
}

static pe_status *emb_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *w = pe_kin(c, EMBG_W, 0), *ids = pe_kin(c, EMBG_IDS, 0);
  pe_tensor *dout = pe_kin(c, EMBG_DOUT, 0), *dw = pe_kout(c, EMBG_DW, 0);
  pe_tensor *rows = pe_kout(c, EMBG_DW_ROWS, 0);
  if (!dw) {
    if (rows) memset(rows->data, 0xff, pe_tensor_bytes(rows)); /* every slot empty: -1 */
    return NULL;
  }
  if (!dout) {
    pe_tensor_zero(dw);
    if (rows) memset(rows->data, 0xff, pe_tensor_bytes(rows));
    return NULL;
  }
  int64_t vocab = w->shape.d[0], dim = w->shape.d[1], n = pe_tensor_numel(ids);
  if (pe_tensor_numel(dout) != n * dim)
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD has %lld elements, expected %lld",
                           (long long)pe_tensor_numel(dout), (long long)(n * dim));
  PE_TRY(emb_check_ids(c, ids, vocab));
  int64_t pad = pe_attr_i(c->def, c->desc, "padding_idx");
  if (rows)
    return emb_grad_sparse(c, pe_f32(dw), pe_i64(rows), dim, pe_i64(ids), n, pe_f32(dout), pad);
  emb_grad_dense(pe_f32(dw), vocab, dim, pe_i64(ids), n, pe_f32(dout), pad);
  return NULL;
}

/* --- rows ---------------------------------------------------------------------- */

static const pe_slot_def emb_in[] = {{"W", 1, 1}, {"Ids", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def emb_out[] = {{"Out", 1, 1}, {NULL}};
static const pe_slot_def emb_grad_in[] = {
    {"W", 1, 1}, {"Ids", 1, 1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def emb_grad_out[] = {
    {"W" PE_GRAD_SUFFIX, 0, 1}, {"W" PE_GRAD_SUFFIX PE_ROWS_SUFFIX, 0, 1}, {NULL}};
/* is_sparse is Paddle's: W@GRAD sparse (the file's comment). */
static const pe_attr_def emb_attrs[] = {
    {"padding_idx", PE_ATTR_LONG, false, -1}, {"is_sparse", PE_ATTR_BOOL, false, 0}, {NULL}};

const pe_op_def pe_ops_embedding[] = {
    {.type = "lookup_table_v2",
     .inputs = emb_in,
     .outputs = emb_out,
     .attrs = emb_attrs,
     .infer = emb_infer,
     .kernel_cpu = emb_kernel,
     .grad = emb_grad},
    {.type = "lookup_table_v2_grad",
     .inputs = emb_grad_in,
     .outputs = emb_grad_out,
     .attrs = emb_attrs,
     .infer = emb_grad_infer,
     .kernel_cpu = emb_grad_kernel},
    {NULL},
};
