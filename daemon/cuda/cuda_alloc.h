/* Caching allocator over a backend's alloc/free (device memory with
 * cudaMalloc, pinned host memory with cudaHostAlloc).
 *
 * core/allocator.c keeps its free lists inside the freed blocks, which a
 * device pointer cannot hold, so this cache keeps them out of band: blocks
 * are rounded to a power-of-two size class (>= 256 B, cudaMalloc's
 * alignment) and freed blocks go on the class's list of small nodes. A
 * steady-state training loop therefore never reaches cudaMalloc. The
 * lists hold at most the cache's limit, as the host allocator's do
 * (core/cache_policy.h, shared): a release past it gives the largest
 * cached blocks back to the backend, so the memory of a large run or of a
 * freed executor returns to the device for other processes and models.
 * No CUDA call is made here: the code is tested on the CPU with a malloc
 * backend (core.test_cache_policy).
 *
 * Not stream-ordered: free a block only after the work using it completed
 * (device.h, "memory"). Thread-safe (one mutex). */
#ifndef PE_CUDA_CUDA_ALLOC_H
#define PE_CUDA_CUDA_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "core/allocator.h"

typedef struct pe_cuda_cache pe_cuda_cache;

typedef struct pe_cuda_backend {
  void *(*alloc)(size_t bytes, void *arg); /* NULL on failure */
  void (*free)(void *p, void *arg);
  void *arg;
} pe_cuda_backend;

/* Default bounds: device memory (a GPU step's churn, feed copies, fetches
 * and cuDNN workspaces, is larger than a host step's, and cudaFree
 * synchronises the device, so more stays cached) and pinned host memory
 * (as the host allocator, PE_ALLOC_CACHE_LIMIT). */
#define PE_CUDA_CACHE_LIMIT ((size_t)1 << 30)
#define PE_CUDA_PINNED_CACHE_LIMIT PE_ALLOC_CACHE_LIMIT

/* limit: the bytes the cache may hold. */
pe_cuda_cache *pe_cuda_cache_new(pe_cuda_backend b, size_t limit);
/* Returns every block to the backend; blocks in use are reported and kept. */
void pe_cuda_cache_free(pe_cuda_cache *c);
void *pe_cuda_cache_alloc(pe_cuda_cache *c, size_t bytes, size_t *cap);
void pe_cuda_cache_release(pe_cuda_cache *c, void *p, size_t cap);
/* Give cached blocks back to the backend (on an allocation failure, retry
 * after a trim). */
void pe_cuda_cache_trim(pe_cuda_cache *c);
/* A new bound; what the cache holds past it goes back now. */
void pe_cuda_cache_set_limit(pe_cuda_cache *c, size_t bytes);
pe_alloc_stats pe_cuda_cache_stats(pe_cuda_cache *c);

#endif
