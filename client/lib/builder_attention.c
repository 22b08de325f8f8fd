/* Attention layers of the program builder (see pe_builder.h): multi-head
 * self-attention and a pre-LN transformer block, made of the other layer
 * calls, reshape / transpose2 ops and, for softmax(scale Q Kᵀ + mask) V,
 * the fused scaled_dot_product_attention op, or with
 * pe_builder_attention_composed its composition of matmul_v2 / scale /
 * elementwise_add / softmax ops. The daemon differentiates them op by op. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "builder_internal.h"

/* A reshape of x to ndim/d (0 copies x's dim, as the op's attribute), as
 * "<layer>.<sfx>"; the declared shape is out. */
static const char *reshape_into(pe_builder *b, const char *x, int ndim, const int64_t *shape,
                                const int64_t *out, const char *layer, const char *sfx) {
  char o[B_NAME_LEN];
  b_var *ov = peb_tmp_var(b, peb_vname(o, layer, sfx), PE_B_F32, ndim, out);
  b_op *op = peb_op_add(b, &b->main, "reshape");
  peb_op_in(b, op, "X", x);
  peb_op_out(b, op, "Out", o);
  peb_attr_ints(b, op, "shape", ndim, shape);
  return b->err ? NULL : ov->name;
}

/* x [B, T, D] -> [B, H, T, D/H]: fc "<layer>.<which>", reshape, transpose. */
static const char *to_heads(pe_builder *b, const char *x, const char *layer, const char *which,
                            const int64_t *d, int64_t h) {
  char fcn[B_NAME_LEN], sfx[32];
  pe_b_fc_opts fo = {.name = peb_vname(fcn, layer, which), .num_col_dims = 2};
  const char *p = pe_builder_fc(b, x, d[2], &fo);
  if (!p) return NULL;
  snprintf(sfx, sizeof sfx, "%s_heads", which);
  const char *r = reshape_into(b, p, 4, (const int64_t[]){0, d[1], h, d[2] / h},
                               (const int64_t[]){d[0], d[1], h, d[2] / h}, layer, sfx);
  if (!r) return NULL;
  return pe_builder_transpose(b, r, 4, (const int64_t[]){0, 2, 1, 3});
}

/* softmax(scale q kᵀ + mask) v of the heads q, k, v [B, H, T, dh] (scores
 * sd), composed: matmul_v2, scale, elementwise_add, softmax, matmul_v2. */
static const char *composed_attention(pe_builder *b, const char *q, const char *k, const char *v,
                                      const char *mask, const int64_t sd[4], int64_t dh,
                                      const char *layer) {
  char buf[B_NAME_LEN], sc[B_NAME_LEN], ms[B_NAME_LEN];
  const char *s = pe_builder_matmul(b, q, k, false, true, peb_vname(buf, layer, "scores"));
  if (!s) return NULL;
  peb_tmp_var(b, peb_vname(sc, layer, "scaled"), PE_B_F32, 4, sd);
  b_op *op = peb_op_add(b, &b->main, "scale");
  peb_op_in(b, op, "X", s);
  peb_op_out(b, op, "Out", sc);
  peb_attr_float(b, op, "scale", (float)(1.0 / sqrt((double)dh)));
  const char *logits = sc;
  if (mask) {
    peb_tmp_var(b, peb_vname(ms, layer, "masked"), PE_B_F32, 4, sd);
    op = peb_op_add(b, &b->main, "elementwise_add");
    peb_op_in(b, op, "X", sc);
    peb_op_in(b, op, "Y", mask);
    peb_op_out(b, op, "Out", ms);
    peb_attr_int(b, op, "axis", -1);
    logits = ms;
  }
  if (b->err) return NULL;
  const char *p = pe_builder_softmax(b, logits);
  return p ? pe_builder_matmul(b, p, v, false, false, peb_vname(buf, layer, "context")) : NULL;
}

/* The same in one scaled_dot_product_attention op: "<layer>.context"
 * [B, H, T, dh] and the probabilities "<layer>.probs" (scores sd) that its
 * gradient reads. */
static const char *fused_attention(pe_builder *b, const char *q, const char *k, const char *v,
                                   const char *mask, const int64_t sd[4], int64_t dh,
                                   const char *layer) {
  char ctx[B_NAME_LEN], probs[B_NAME_LEN];
  b_var *cv = peb_tmp_var(b, peb_vname(ctx, layer, "context"), PE_B_F32, 4,
                          (const int64_t[]){sd[0], sd[1], sd[2], dh});
  peb_tmp_var(b, peb_vname(probs, layer, "probs"), PE_B_F32, 4, sd);
  b_op *op = peb_op_add(b, &b->main, "scaled_dot_product_attention");
  peb_op_in(b, op, "Q", q);
  peb_op_in(b, op, "K", k);
  peb_op_in(b, op, "V", v);
  /* pe_builder_causal_mask's mask of these scores is the op's causal flag */
  b_var *mv = mask ? peb_var_find(&b->main, mask) : NULL;
  bool causal = mv && mv->causal_mask && mv->d[2] == sd[2] && mv->d[3] == sd[3];
  if (mask && !causal) peb_op_in(b, op, "Mask", mask);
  peb_attr_bool(b, op, "causal", causal);
  peb_op_out(b, op, "Out", ctx);
  peb_op_out(b, op, "Softmax", probs);
  peb_attr_float(b, op, "scale", (float)(1.0 / sqrt((double)dh)));
  return b->err ? NULL : cv->name;
}

int pe_builder_attention_composed(pe_builder *b, bool composed) {
  if (!b || b->err) return -1;
  b->attn_composed = composed;
  return 0;
}

const char *pe_builder_multi_head_attention(pe_builder *b, const char *x, int num_heads,
                                            const char *mask, const char *name) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "attention", x);
  char layer[B_NAME_LEN], buf[B_NAME_LEN], sh[128], s2[128];
  if (!xv || !peb_layer_name(b, "attention", name, layer)) return NULL;
  if (xv->ndim != 3 || xv->dtype != PE_B_F32 || xv->d[1] <= 0 || xv->d[2] <= 0 || num_heads < 1 ||
      xv->d[2] % num_heads) {
    peb_fail(b,
             "attention '%s': input '%s' %s must be f32 [B, T, D] with T and D known and D "
             "divisible by num_heads %d",
             layer, x, peb_shape_str(xv, sh, sizeof sh), num_heads);
    return NULL;
  }
  int64_t d[3] = {xv->d[0], xv->d[1], xv->d[2]}, h = num_heads, t = d[1];
  b_var *mv = NULL;
  if (mask) {
    mv = peb_need(b, "attention", mask);
    if (!mv) return NULL;
    /* the scores are [B, H, T, T]: mask's dims align from the right */
    const int64_t sd[4] = {d[0], h, t, t};
    bool ok = mv->dtype == PE_B_F32 && mv->ndim >= 2 && mv->ndim <= 4;
    for (int i = 0; ok && i < mv->ndim; i++) {
      int64_t m = mv->d[i], s = sd[4 - mv->ndim + i];
      ok = m == 1 || m == s || (i == 0 && mv->ndim == 4 && (m == -1 || s == -1));
    }
    if (!ok) {
      peb_fail(b,
               "attention '%s': mask '%s' %s must be f32 and broadcast to the scores "
               "[%lld,%lld,%lld,%lld] (of '%s' %s)",
               layer, mask, peb_shape_str(mv, s2, sizeof s2), (long long)d[0], (long long)h,
               (long long)t, (long long)t, x, peb_shape_str(xv, sh, sizeof sh));
      return NULL;
    }
  }
  const char *q = to_heads(b, x, layer, "q", d, h);
  const char *k = q ? to_heads(b, x, layer, "k", d, h) : NULL;
  const char *v = k ? to_heads(b, x, layer, "v", d, h) : NULL;
  if (!v) return NULL;
  const int64_t sd[4] = {d[0], h, t, t};
  const char *ctx = b->attn_composed ? composed_attention(b, q, k, v, mask, sd, d[2] / h, layer)
                                     : fused_attention(b, q, k, v, mask, sd, d[2] / h, layer);
  const char *ct = ctx ? pe_builder_transpose(b, ctx, 4, (const int64_t[]){0, 2, 1, 3}) : NULL;
  const char *joined =
      ct ? reshape_into(b, ct, 3, (const int64_t[]){0, t, d[2]}, d, layer, "joined") : NULL;
  if (!joined) return NULL;
  pe_b_fc_opts fo = {.name = peb_vname(buf, layer, "out"), .num_col_dims = 2};
  return pe_builder_fc(b, joined, d[2], &fo);
}

const char *pe_builder_transformer_block(pe_builder *b, const char *x, int num_heads,
                                         int64_t ffn_dim, const char *mask, const char *name) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "transformer", x);
  char layer[B_NAME_LEN], buf[B_NAME_LEN], sh[128];
  if (!xv || !peb_layer_name(b, "transformer", name, layer)) return NULL;
  if (xv->ndim != 3 || xv->d[2] <= 0 || ffn_dim <= 0) {
    peb_fail(b,
             "transformer '%s': input '%s' %s must be [B, T, D] with D known, ffn_dim %lld "
             "positive",
             layer, x, peb_shape_str(xv, sh, sizeof sh), (long long)ffn_dim);
    return NULL;
  }
  int64_t dm = xv->d[2];
  const char *n1 = pe_builder_layer_norm(b, x, 2, 0, peb_vname(buf, layer, "ln1"));
  const char *a =
      n1 ? pe_builder_multi_head_attention(b, n1, num_heads, mask, peb_vname(buf, layer, "attn"))
         : NULL;
  const char *h = a ? pe_builder_add(b, x, a, PE_B_ACT_NONE, peb_vname(buf, layer, "res1")) : NULL;
  const char *n2 = h ? pe_builder_layer_norm(b, h, 2, 0, peb_vname(buf, layer, "ln2")) : NULL;
  pe_b_fc_opts f1 = {.name = peb_vname(buf, layer, "ffn1"), .num_col_dims = 2};
  const char *u = n2 ? pe_builder_fc(b, n2, ffn_dim, &f1) : NULL;
  const char *g = u ? pe_builder_gelu(b, u, false) : NULL;
  char f2n[B_NAME_LEN];
  pe_b_fc_opts f2 = {.name = peb_vname(f2n, layer, "ffn2"), .num_col_dims = 2};
  const char *f = g ? pe_builder_fc(b, g, dm, &f2) : NULL;
  return f ? pe_builder_add(b, h, f, PE_B_ACT_NONE, peb_vname(buf, layer, "res2")) : NULL;
}

const char *pe_builder_causal_mask(pe_builder *b, int64_t t, const char *name) {
  if (!b) return NULL;
  char layer[B_NAME_LEN], full[B_NAME_LEN], out[B_NAME_LEN];
  if (!peb_layer_name(b, "causal_mask", name, layer)) return NULL;
  if (t < 1 || t > (INT64_C(1) << 15)) {
    peb_fail(b, "causal_mask '%s': length %lld is not in [1, 32768]", layer, (long long)t);
    return NULL;
  }
  /* Made in the main block from constants: no feed (the daemon splits
   * every feed along dim 0) and no persistable state to checkpoint. */
  const int64_t d[4] = {1, 1, t, t};
  b_var *fv = peb_tmp_var(b, peb_vname(full, layer, "fill"), PE_B_F32, 4, d);
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), PE_B_F32, 4, d);
  if (b->err) return NULL;
  fv->stop_gradient = ov->stop_gradient = true;
  ov->causal_mask = true;
  b_op *op = peb_op_add(b, &b->main, "fill_constant");
  peb_op_out(b, op, "Out", full);
  peb_attr_ints(b, op, "shape", 4, d);
  peb_attr_float(b, op, "value", -1e9f);
  peb_attr_int(b, op, "dtype", PE_B_F32);
  op = peb_op_add(b, &b->main, "tril_triu");
  peb_op_in(b, op, "X", full);
  peb_op_out(b, op, "Out", out);
  peb_attr_int(b, op, "diagonal", 1);
  peb_attr_bool(b, op, "lower", false);
  return b->err ? NULL : ov->name;
}
