/* lookup_table_v2 (Paddle's embedding) and its gradient.
 *
 * Out[..., :] = W[Ids[...], :]: Ids (i64, any shape) picks rows of W
 * [vocab, dim], Out is Ids' shape plus [dim]. The row padding_idx (-1:
 * none) reads as zeros and gets no gradient. An id outside [0, vocab) is an
 * error naming the op, Ids, the id, where it is and the vocabulary size;
 * nothing is read or written out of bounds.
 * The gradient is dense (W@GRAD has W's shape: zeros, then each id's
 * Out@GRAD row added to its row), in a function of its own so that a
 * sparse one can sit beside it. */
#include <string.h>

#include "ops/op_tables.h"

enum { EMB_W, EMB_IDS };
enum { EMB_OUT };
enum { EMBG_W, EMBG_IDS, EMBG_OUT, EMBG_DOUT };
enum { EMBG_DW };

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
  return pe_infer_grad_like_inputs(c);
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

static pe_status *emb_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *w = pe_kin(c, EMBG_W, 0), *ids = pe_kin(c, EMBG_IDS, 0);
  pe_tensor *dout = pe_kin(c, EMBG_DOUT, 0), *dw = pe_kout(c, EMBG_DW, 0);
  if (!dw) return NULL;
  if (!dout) {
    pe_tensor_zero(dw);
    return NULL;
  }
  int64_t vocab = w->shape.d[0], dim = w->shape.d[1], n = pe_tensor_numel(ids);
  if (pe_tensor_numel(dout) != n * dim)
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD has %lld elements, expected %lld",
                           (long long)pe_tensor_numel(dout), (long long)(n * dim));
  PE_TRY(emb_check_ids(c, ids, vocab));
  emb_grad_dense(pe_f32(dw), vocab, dim, pe_i64(ids), n, pe_f32(dout),
                 pe_attr_i(c->def, c->desc, "padding_idx"));
  return NULL;
}

/* --- rows ---------------------------------------------------------------------- */

static const pe_slot_def emb_in[] = {{"W", 1, 1}, {"Ids", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def emb_out[] = {{"Out", 1, 1}, {NULL}};
static const pe_slot_def emb_grad_in[] = {
    {"W", 1, 1}, {"Ids", 1, 1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def emb_grad_out[] = {{"W" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
/* is_sparse is Paddle's; the gradient is dense either way. */
static const pe_attr_def emb_attrs[] = {
    {"padding_idx", PE_ATTR_LONG, false, -1}, {"is_sparse", PE_ATTR_BOOL, false, 0}, {NULL}};

const pe_op_def pe_ops_embedding[] = {
    {.type = "lookup_table_v2",
     .inputs = emb_in,
     .outputs = emb_out,
     .attrs = emb_attrs,
     .infer = emb_infer,
     .kernel_cpu = emb_kernel,
     .grad = pe_grad_default},
    {.type = "lookup_table_v2_grad",
     .inputs = emb_grad_in,
     .outputs = emb_grad_out,
     .attrs = emb_attrs,
     .infer = emb_grad_infer,
     .kernel_cpu = emb_grad_kernel},
    {NULL},
};
