/* The sequence-model words of model files (format: conf/models/README.md):
 * tokens and targets (i64 inputs and per-position labels), embedding,
 * pos_embedding, layer_norm, gelu, attention and transformer_block, and the
 * rows a per-position loss reads. The keyword table and the argument
 * readers are model_file.c. */
#include <stdio.h>
#include <string.h>

#include "builder_internal.h"
#include "model_file_internal.h"
#include "pe_builder.h"

/* The T of a tokens or targets line: the other one's, when it came first. */
static int seq_length(mf *m, bool other_set, const char *other, long *t) {
  if (mf_parse_long(m, "length", m->pos[1], 1, 1L << 15, t)) return -1;
  if (other_set && *t != m->seq_len)
    return mf_fail(m, "%s: length %ld differs from the %s' %lld", m->kw, *t, other,
                   (long long)m->seq_len);
  m->seq_len = *t;
  return 0;
}

/* tokens NAME T: i64 ids [-1, T], the model's input. */
int mf_h_tokens(mf *m) {
  if (m->image) return mf_fail(m, "tokens: a second input ('%s' is declared)", m->image);
  long t = 0;
  if (seq_length(m, m->targets, "targets", &t)) return -1;
  int64_t dims[4] = {-1, t};
  const char *ids = pe_builder_data(m->b, m->pos[0], PE_B_I64, 2, dims);
  if (mf_built(m, ids)) return -1;
  m->image = ids;
  m->image_ndim = 2;
  memcpy(m->image_dims, dims, sizeof dims);
  m->tokens = true;
  return 0;
}

/* targets NAME T: i64 [-1, T], the class of each position (the next
 * token); the loss and accuracy flatten positions into rows. */
int mf_h_targets(mf *m) {
  if (m->label) return mf_fail(m, "targets: a second label ('%s' is declared)", m->label);
  long t = 0;
  if (seq_length(m, m->tokens, "tokens", &t)) return -1;
  const char *cur = m->x;
  const char *l = pe_builder_data(m->b, m->pos[0], PE_B_I64, PE_B_SHAPE(-1, t));
  if (mf_built(m, l)) return -1;
  m->label = l;
  m->x = cur;
  m->targets = true;
  return 0;
}

/* --- sequence layers: embedding, pos_embedding, layer_norm, gelu, attention ------------- */

/* The current variable's rank (0 when unknown). */
static int cur_rank(mf *m) {
  const b_var *v = peb_var_find(&m->b->main, m->x);
  return v ? v->ndim : 0;
}

int mf_h_embedding(mf *m) {
  long vocab = 0, dim = 0, pad = -1;
  if (mf_need_input(m) || mf_parse_long(m, "vocab", m->pos[0], 1, 1L << 30, &vocab) ||
      mf_parse_long(m, "dim", m->pos[1], 1, 1L << 20, &dim) ||
      mf_opt_long(m, "padding_idx", 0, vocab - 1, &pad))
    return -1;
  pe_b_embedding_opts o = {.name = mf_opt_str(m, "name"), .is_sparse = mf_opt_flag(m, "sparse")};
  return mf_built(m, pe_builder_embedding_ex(m->b, m->x, vocab, dim, pad, &o));
}

int mf_h_pos_embedding(mf *m) {
  if (mf_need_input(m)) return -1;
  return mf_built(m, pe_builder_position_embedding(m->b, m->x, mf_opt_str(m, "name")));
}

/* layer_norm over the last dim unless begin_norm_axis says otherwise. */
int mf_h_layer_norm(mf *m) {
  long axis = 0;
  float eps = 0;
  if (mf_need_input(m) || mf_opt_long(m, "begin_norm_axis", 1, 7, &axis) ||
      mf_opt_float_in(m, "epsilon", 0, 1, OPEN_MIN, &eps))
    return -1;
  if (!axis) axis = cur_rank(m) > 1 ? cur_rank(m) - 1 : 1;
  return mf_built(m, pe_builder_layer_norm(m->b, m->x, (int)axis, eps, mf_opt_str(m, "name")));
}

int mf_h_gelu(mf *m) {
  if (mf_need_input(m)) return -1;
  return mf_built(m, pe_builder_gelu(m->b, m->x, mf_opt_flag(m, "approximate")));
}

/* The mask of a `causal` line: one for the model, made at the first. */
static const char *causal_mask(mf *m) {
  if (!m->causal_mask) {
    const b_var *v = peb_var_find(&m->b->main, m->x);
    int64_t t = v && v->ndim == 3 ? v->d[1] : -1;
    if (t <= 0) {
      char sh[128];
      mf_fail(m, "%s: causal needs an input [B, T, D] with T known ('%s' is %s)", m->kw, m->x,
              v ? peb_shape_str(v, sh, sizeof sh) : "undeclared");
      return NULL;
    }
    m->causal_mask = pe_builder_causal_mask(m->b, t, NULL);
    if (!m->causal_mask) {
      mf_built(m, NULL);
      return NULL;
    }
  }
  return m->causal_mask;
}

int mf_h_attention(mf *m) {
  long heads = 0;
  if (mf_need_input(m) || mf_parse_long(m, "heads", m->pos[0], 1, 1024, &heads)) return -1;
  bool causal = mf_opt_flag(m, "causal");
  const char *mask = causal ? causal_mask(m) : NULL;
  if (causal && !mask) return -1;
  return mf_built(
      m, pe_builder_multi_head_attention(m->b, m->x, (int)heads, mask, mf_opt_str(m, "name")));
}

int mf_h_transformer_block(mf *m) {
  long heads = 0, ff = 0;
  if (mf_need_input(m) || mf_parse_long(m, "heads", m->pos[0], 1, 1024, &heads) ||
      mf_parse_long(m, "ffn_dim", m->pos[1], 1, 1L << 24, &ff))
    return -1;
  bool causal = mf_opt_flag(m, "causal");
  const char *mask = causal ? causal_mask(m) : NULL;
  if (causal && !mask) return -1;
  return mf_built(
      m, pe_builder_transformer_block(m->b, m->x, (int)heads, ff, mask, mf_opt_str(m, "name")));
}

/* Per-position targets: logits [B, T, C] and targets [B, T] become rows
 * [B*T, C] and [B*T, 1], the shapes the loss and accuracy ops take; the
 * flattened targets are m->label_rows. Returns the flattened logits. */
const char *mf_seq_rows(mf *m) {
  const b_var *v = peb_var_find(&m->b->main, m->x);
  if (!v || v->ndim != 3 || v->d[1] != m->seq_len) {
    char sh[128];
    mf_fail(m, "loss: logits '%s' %s must be [B, %lld, C] for the targets '%s' [-1,%lld]", m->x,
            v ? peb_shape_str(v, sh, sizeof sh) : "(undeclared)", (long long)m->seq_len, m->label,
            (long long)m->seq_len);
    return NULL;
  }
  m->label_rows = pe_builder_flatten(m->b, m->label, 2);
  if (!m->label_rows) return NULL;
  return pe_builder_flatten(m->b, m->x, 2);
}
