#include "ops/cpu/conv_weights_pass.h"

#include <string.h>

bool pe_conv_weights_pass_pads(const_dnnl_primitive_desc_t pd) {
  const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
  return md && md->ndims == 4 && md->padded_dims[1] > md->dims[1];
}

/* One pass's primitive desc; an error when oneDNN has no implementation
 * for these layouts. */
static pe_status *pass_pd(pe_kernel_ctx *c, dnnl_alg_kind_t alg, const dnnl_memory_desc_t *src,
                          const dnnl_memory_desc_t *wei, const dnnl_memory_desc_t *bias,
                          const dnnl_memory_desc_t *dst, const dnnl_dims_t strides,
                          const dnnl_dims_t dilates, const dnnl_dims_t pad,
                          const_dnnl_primitive_desc_t hint, const char *what,
                          dnnl_primitive_desc_t *pd) {
  dnnl_convolution_desc_t cd;
  PE_TRY(pe_dnnl_check(dnnl_dilated_convolution_backward_weights_desc_init(
                           &cd, alg, src, wei, bias, dst, strides, dilates, pad, pad),
                       c, what));
  return pe_dnnl_pd(c, &cd, hint, what, pd);
}

pe_status *pe_conv_weights_pass_pd(pe_kernel_ctx *c, dnnl_alg_kind_t alg,
                                   const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                                   const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                                   const dnnl_dims_t strides, const dnnl_dims_t dilates,
                                   const dnnl_dims_t pad, const_dnnl_primitive_desc_t hint,
                                   const char *what, dnnl_primitive_desc_t *pd) {
  PE_TRY(pass_pd(c, alg, src, wei, bias, dst, strides, dilates, pad, hint, what, pd));
  if (src->format_kind != dnnl_format_kind_any || src->ndims != 4 || dst->ndims != 4 ||
      !pe_conv_weights_pass_pads(*pd))
    return NULL;
  dnnl_memory_desc_t src_nhwc, dst_nhwc;
  if (dnnl_memory_desc_init_by_tag(&src_nhwc, 4, src->dims, dnnl_f32, dnnl_acdb) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&dst_nhwc, 4, dst->dims, dnnl_f32, dnnl_acdb) != dnnl_success)
    return NULL;
  dnnl_primitive_desc_t nhwc = NULL;
  pe_status *st =
      pass_pd(c, alg, &src_nhwc, wei, bias, &dst_nhwc, strides, dilates, pad, hint, what, &nhwc);
  if (st) { /* no such implementation: oneDNN's own choice stands */
    pe_status_free(st);
    return NULL;
  }
  /* oneDNN's reference kernels take any layout, 100x slower. */
  if (pe_conv_weights_pass_pads(nhwc) || strncmp(pe_dnnl_impl_name(nhwc), "ref", 3) == 0) {
    dnnl_primitive_desc_destroy(nhwc);
    return NULL;
  }
  dnnl_primitive_desc_destroy(*pd);
  *pd = nhwc;
  return NULL;
}
