/* pe_op_run (op_run.h): infer on concrete shapes, size outputs, call the
 * kernel, and in a --check-nan-inf run check its outputs. */
#include "engine/op_run.h"

#include "engine/op_finite.h"

pe_status *pe_tensor_fit(pe_tensor *t, pe_allocator *alloc, pe_dtype dt, const pe_shape *shape,
                         const char *name) {
  int64_t n = pe_shape_numel(shape);
  size_t bytes = n > 0 ? (size_t)n * pe_dtype_size(dt) : 0;
  if (!t->alloc && t->data && n >= 0 && bytes <= t->cap) { /* a view that fits: keep it */
    t->dtype = dt;
    t->shape = *shape;
    return NULL;
  }
  if (alloc && !t->alloc) return pe_tensor_resize_with(t, alloc, dt, shape, name);
  return pe_tensor_resize(t, dt, shape, name);
}

pe_status *pe_op_prepare(const pe_op_def *def, pe_tensor_list *tl, pe_meta_list *ml,
                         pe_infer_ctx *ic, pe_allocator *alloc) {
  char sb[PE_SHAPE_STRLEN];
  for (int li = 0; li < def->n_inputs; li++)
    for (int k = 0; k < tl[li].n; k++) {
      const pe_tensor *t = tl[li].t[k];
      if (!t->data && t->shape.ndim == 0)
        return pe_error(PE_EUSE_BEFORE_DEF,
                        "input %s '%s' has no value (not fed, not written by an earlier op, and "
                        "not initialised by the startup program)",
                        def->inputs[li].name, ml[li].names[k]);
      *ml[li].m[k] = (pe_meta){t->dtype, t->shape};
    }
  for (int o = 0; o < def->n_outputs; o++) {
    pe_tensor_list *otl = &tl[def->n_inputs + o];
    pe_meta_list *oml = &ml[def->n_inputs + o];
    for (int k = 0; k < otl->n; k++) *oml->m[k] = (pe_meta){otl->t[k]->dtype, otl->t[k]->shape};
  }
  if (def->infer) PE_TRY(def->infer(ic));
  for (int o = 0; o < def->n_outputs; o++) {
    pe_tensor_list *otl = &tl[def->n_inputs + o];
    pe_meta_list *oml = &ml[def->n_inputs + o];
    for (int k = 0; k < otl->n; k++) {
      const pe_meta *m = oml->m[k];
      if (m->shape.ndim == 0) continue; /* the row did not size it */
      if (pe_shape_numel(&m->shape) < 0)
        return pe_error(PE_ESHAPE, "output %s '%s': inferred shape %s is not concrete",
                        def->outputs[o].name, oml->names[k],
                        pe_shape_str(&m->shape, sb, sizeof sb));
      PE_TRY(pe_tensor_fit(otl->t[k], alloc, m->dtype, &m->shape, oml->names[k]));
    }
  }
  return NULL;
}

pe_status *pe_op_run(const pe_op_def *def, pe_kernel_fn kernel, pe_tensor_list *tl,
                     pe_meta_list *ml, pe_infer_ctx *ic, pe_kernel_ctx *kc, pe_allocator *alloc,
                     bool check_finite) {
  PE_TRY(pe_op_prepare(def, tl, ml, ic, alloc));
  if (!kernel) return pe_error(PE_EUNKNOWN_OP, "op '%s': no kernel for this place kind", def->type);
  PE_TRY(kernel(kc));
  return check_finite ? pe_op_check_finite(kc, ml) : NULL;
}
