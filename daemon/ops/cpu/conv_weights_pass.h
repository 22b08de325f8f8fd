/* The primitive of a convolution's weights pass (backward weights), with
 * the input's channels unpadded where oneDNN would pad them.
 *
 * Why: given format any, oneDNN's AVX2 weights pass stores the input in
 * blocks of 8 channels, so a first layer with one input channel (the
 * CNN's, [64,1,28,28] with 5x5 filters to 32 channels) does the work of 8:
 * 8.5 ms at two threads, 16.1 ms at one. The same pass on NHWC input and
 * output gradient takes 1.8 / 3.3 ms, plus 0.2 / 0.4 ms to reorder the
 * output gradient (standalone oneDNN 2.6, AVX2, best of 15). Where
 * oneDNN's choice does not pad (AVX-512 for one channel, AVX2 for three),
 * its choice is as fast or faster and is kept. The rule is a pure
 * function of the shape and the ISA, so a setting gives the same
 * arithmetic on every run. */
#ifndef PE_OPS_CPU_CONV_WEIGHTS_PASS_H
#define PE_OPS_CPU_CONV_WEIGHTS_PASS_H

#include <dnnl.h>
#include <stdbool.h>

#include "ops/cpu/dnnl_util.h"

/* The weights pass's primitive desc for src/wei/bias/dst (bias may be
 * NULL), hinted by the forward's `hint`. When src is format any and
 * oneDNN's choice pads its channels, the pass is built again with src and
 * dst in NHWC, and that one is kept if it exists, does not pad and is not
 * one of oneDNN's reference kernels. */
pe_status *pe_conv_weights_pass_pd(pe_kernel_ctx *c, dnnl_alg_kind_t alg,
                                   const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                                   const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                                   const dnnl_dims_t strides, const dnnl_dims_t dilates,
                                   const dnnl_dims_t pad, const_dnnl_primitive_desc_t hint,
                                   const char *what, dnnl_primitive_desc_t *pd);

/* True when the pass's input (DNNL_ARG_SRC) has more channels stored
 * than it has. */
bool pe_conv_weights_pass_pads(const_dnnl_primitive_desc_t pd);

#endif
