/* oneDNN plumbing shared by the CPU kernels: the engine and stream of a
 * place, status conversion, and memory descriptors for pe_tensors.
 * Primitives are created once per op instance and shape and kept in the op's
 * state (see registry.h), never per call. */
#ifndef PE_OPS_CPU_DNNL_UTIL_H
#define PE_OPS_CPU_DNNL_UTIL_H

#include <oneapi/dnnl/dnnl.h>

#include "ops/device_ctx.h"
#include "ops/registry.h"

/* Engine and stream of the place (created on first use; owned by d). */
pe_status *pe_dnnl_get(pe_device_ctx *d, dnnl_engine_t *eng, dnnl_stream_t *strm);
void pe_dnnl_ctx_release(pe_device_ctx *d);
/* NULL if s == dnnl_success, else an error naming the op and `what`. */
pe_status *pe_dnnl_check(dnnl_status_t s, const pe_kernel_ctx *c, const char *what);
const char *pe_dnnl_status_str(dnnl_status_t s);

#endif
