/* Learned absolute positions of the program builder (see pe_builder.h): a
 * [T, D] table added to every example of x [B, T, D], as GPT-2's wpe. The
 * add broadcasts the table over the batch (elementwise_add, numpy rule), so
 * no position ids are fed or made. */
#include <stdio.h>

#include "builder_internal.h"

const char *pe_builder_position_embedding(pe_builder *b, const char *x, const char *name) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "pos_embedding", x);
  char layer[B_NAME_LEN], w[B_NAME_LEN], out[B_NAME_LEN], sh[128];
  if (!xv || !peb_layer_name(b, "pos_embedding", name, layer)) return NULL;
  if (xv->ndim != 3 || xv->dtype != PE_B_F32 || xv->d[1] <= 0 || xv->d[2] <= 0) {
    peb_fail(b, "pos_embedding '%s': input '%s' %s must be f32 [B, T, D] with T and D known", layer,
             x, peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t t = xv->d[1], d = xv->d[2];
  /* initialised as an embedding table of T rows (pe_builder_embedding) */
  peb_param_add(b, peb_vname(w, layer, "w"), 2, (const int64_t[]){t, d},
                peb_init_or((pe_b_init){0}, PE_B_INIT_XAVIER), (double)t, (double)d, true);
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), PE_B_F32, 3, xv->d);
  b_op *op = peb_op_add(b, &b->main, "elementwise_add");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Y", w);
  peb_op_out(b, op, "Out", out);
  peb_attr_int(b, op, "axis", -1);
  return b->err ? NULL : ov->name;
}
