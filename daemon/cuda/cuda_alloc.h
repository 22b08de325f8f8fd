/* Caching allocator over a backend's alloc/free (device memory with
 * cudaMalloc, pinned host memory with cudaHostAlloc).
 *
 * core/allocator.c keeps its free lists inside the freed blocks, which a
 * device pointer cannot hold, so this cache keeps them out of band: blocks
 * are rounded to a power-of-two size class (>= 256 B, cudaMalloc's
 * alignment) and freed blocks go on the class's list of small nodes. A
 * steady-state training loop therefore never reaches cudaMalloc.
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

pe_cuda_cache *pe_cuda_cache_new(pe_cuda_backend b);
/* Returns every block to the backend; blocks in use are reported and kept. */
void pe_cuda_cache_free(pe_cuda_cache *c);
void *pe_cuda_cache_alloc(pe_cuda_cache *c, size_t bytes, size_t *cap);
void pe_cuda_cache_release(pe_cuda_cache *c, void *p, size_t cap);
/* Give cached blocks back to the backend (on an allocation failure, retry
 * after a trim). */
void pe_cuda_cache_trim(pe_cuda_cache *c);
pe_alloc_stats pe_cuda_cache_stats(pe_cuda_cache *c);

#endif
