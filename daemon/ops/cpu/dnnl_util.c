#include "dnnl_util.h"

pe_status *pe_dnnl_get(pe_device_ctx *d, dnnl_engine_t *eng, dnnl_stream_t *strm) {
  if (!d->dnnl_engine) {
    dnnl_engine_t e;
    dnnl_status_t s = dnnl_engine_create(&e, dnnl_cpu, 0);
    if (s != dnnl_success)
      return pe_error(PE_EBACKEND, "oneDNN: cannot create cpu engine: %s", pe_dnnl_status_str(s));
    d->dnnl_engine = e;
  }
  if (!d->dnnl_stream) {
    dnnl_stream_t st;
    dnnl_status_t s = dnnl_stream_create(&st, (dnnl_engine_t)d->dnnl_engine, dnnl_stream_default_flags);
    if (s != dnnl_success)
      return pe_error(PE_EBACKEND, "oneDNN: cannot create stream: %s", pe_dnnl_status_str(s));
    d->dnnl_stream = st;
  }
  *eng = (dnnl_engine_t)d->dnnl_engine;
  *strm = (dnnl_stream_t)d->dnnl_stream;
  return NULL;
}

void pe_dnnl_ctx_release(pe_device_ctx *d) {
  if (d->dnnl_stream) dnnl_stream_destroy((dnnl_stream_t)d->dnnl_stream);
  if (d->dnnl_engine) dnnl_engine_destroy((dnnl_engine_t)d->dnnl_engine);
  d->dnnl_stream = d->dnnl_engine = NULL;
}

const char *pe_dnnl_status_str(dnnl_status_t s) {
  switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_iterator_ends: return "iterator ends";
    case dnnl_runtime_error: return "runtime error";
    case dnnl_not_required: return "not required";
    default: return "unknown oneDNN status";
  }
}

pe_status *pe_dnnl_check(dnnl_status_t s, const pe_kernel_ctx *c, const char *what) {
  if (s == dnnl_success) return NULL;
  return pe_kernel_error(c, PE_EBACKEND, "oneDNN %s failed: %s", what, pe_dnnl_status_str(s));
}
