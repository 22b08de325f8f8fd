#define _GNU_SOURCE
#include "device_ctx.h"

#include <omp.h>
#include <sched.h>
#include <string.h>

#include "ops/cpu/dnnl_util.h"

int pe_cpu_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return 1;
}

pe_status *pe_device_ctx_init(pe_device_ctx *d, pe_place place, int threads) {
  memset(d, 0, sizeof(*d));
  d->place = place;
  d->threads = threads > 0 ? threads : pe_cpu_cores();
  return NULL;
}

void pe_device_ctx_destroy(pe_device_ctx *d) {
  pe_dnnl_ctx_release(d);
  memset(d, 0, sizeof(*d));
}

void pe_device_ctx_bind(const pe_device_ctx *d) { omp_set_num_threads(d->threads); }
