/* Per-place execution resources that kernels use on the CPU: the oneDNN
 * engine and stream, and the intra-op thread budget.
 *
 * Threading choice: oneDNN here is built on OpenMP. An executor thread that
 * runs kernels for a place calls pe_device_ctx_bind once; it sets that
 * thread's OpenMP team size (omp_set_num_threads is per calling thread) to the
 * place's budget (cores / max(places, pool workers) on the parallel
 * executor's cpu places), so that pool threads x OpenMP threads never exceed
 * the cores. Hand-written kernels use the same budget. */
#ifndef PE_OPS_DEVICE_CTX_H
#define PE_OPS_DEVICE_CTX_H

#include "core/place.h"
#include "core/status.h"

struct pe_device_ctx {
  pe_place place;
  int threads;       /* intra-op budget, >= 1 */
  void *dnnl_engine; /* dnnl_engine_t, created lazily, owned */
  void *dnnl_stream; /* dnnl_stream_t, created lazily, owned */
  /* dnnl_stream_t for a kernel's second thread when it runs two primitives
   * side by side (a stream is not shared between threads); lazily, owned. */
  void *dnnl_side_stream;
  /* cuda places: the stream's pe_cuda_ctx (daemon/cuda/cuda_ctx.h: cudaStream_t,
   * cuBLAS and cuDNN handles), owned by the cuda device; NULL elsewhere. */
  void *cuda;
};

typedef struct pe_device_ctx pe_device_ctx;

/* threads <= 0: all online cores. */
pe_status *pe_device_ctx_init(pe_device_ctx *d, pe_place place, int threads);
void pe_device_ctx_destroy(pe_device_ctx *d);
/* Call on the thread that will run this place's kernels. */
void pe_device_ctx_bind(const pe_device_ctx *d);
/* Online cores of this machine (sched_getaffinity). */
int pe_cpu_cores(void);

#endif
