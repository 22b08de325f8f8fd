/* Caching allocator. Blocks are rounded up to a size class and kept on a
 * per-class free list when released, so a steady-state training loop does
 * no malloc/free. The free lists hold at most the cache limit: a release
 * that would cache more returns the largest cached blocks to the system
 * (and, past PE_ALLOC_TRIM_BYTES, glibc's free heap pages to the kernel),
 * so the memory of a large run, or of a freed executor, is not kept for
 * good. Thread-safe (one mutex; allocation is not on the per-op hot path
 * once buffers reach steady state). Memory is 64-byte aligned for oneDNN
 * and vector kernels. Device backends (sim, cuda) own allocators of the
 * same shape over their own memory. */
#ifndef PE_CORE_ALLOCATOR_H
#define PE_CORE_ALLOCATOR_H

#include <stddef.h>
#include <stdint.h>

typedef struct pe_allocator pe_allocator;

typedef struct pe_alloc_stats {
  size_t bytes_in_use;    /* handed out, not yet freed */
  size_t bytes_cached;    /* freed, kept for reuse */
  size_t peak_in_use;
  uint64_t n_alloc;       /* calls to pe_alloc */
  uint64_t n_system;      /* calls that reached the system allocator */
} pe_alloc_stats;

/* Default cache limit of an allocator: what a training step frees and
 * allocates again stays cached (a step's churn: fetches, feed copies,
 * kernel scratch), the memory of a freed executor does not. */
#define PE_ALLOC_CACHE_LIMIT ((size_t)256 << 20)
/* Evictions of at least this many bytes at once also trim the C heap. */
#define PE_ALLOC_TRIM_BYTES ((size_t)32 << 20)

pe_allocator *pe_allocator_new(void);
void pe_allocator_free(pe_allocator *a); /* all blocks must be released */
/* The process-wide host allocator. */
pe_allocator *pe_host_allocator(void);

/* Returns NULL on failure (callers turn that into PE_ENOMEM with context).
 * *cap receives the usable size of the block. */
void *pe_alloc(pe_allocator *a, size_t bytes, size_t *cap);
void pe_free(pe_allocator *a, void *p, size_t cap);
/* Return cached blocks to the system. */
void pe_allocator_trim(pe_allocator *a);
/* Bytes the free lists may hold (PE_ALLOC_CACHE_LIMIT at creation); a
 * lower limit evicts at the next release. No-op for impl allocators. */
void pe_allocator_set_cache_limit(pe_allocator *a, size_t bytes);
pe_alloc_stats pe_allocator_stats(pe_allocator *a);

/* An allocator whose blocks come from elsewhere (device memory: the cuda
 * backend's cache, daemon/cuda/cuda_alloc.h). pe_alloc, pe_free,
 * pe_allocator_trim, pe_allocator_stats and pe_allocator_free on it call
 * these with `self`, so tensors (pe_tensor_resize_with) can live in memory
 * the host cannot touch. */
typedef struct pe_allocator_impl {
  void *(*alloc)(void *self, size_t bytes, size_t *cap);
  void (*free)(void *self, void *p, size_t cap);
  void (*trim)(void *self);
  pe_alloc_stats (*stats)(void *self);
  void (*destroy)(void *self); /* by pe_allocator_free; may be NULL */
} pe_allocator_impl;
pe_allocator *pe_allocator_new_impl(const pe_allocator_impl *impl, void *self);

#endif
