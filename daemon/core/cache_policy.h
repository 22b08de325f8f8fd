/* The cache policy of the caching allocators: the host one
 * (core/allocator.c, free lists inside the freed blocks) and the CUDA ones
 * (cuda/cuda_alloc.c, device and pinned memory, free lists out of band).
 *
 * Blocks are rounded up to a power-of-two size class; a freed block is
 * cached on its class's list for the next request of that class, so a
 * steady-state training loop reaches neither malloc nor cudaMalloc. The
 * cache holds at most `limit` bytes: past it, the largest cached blocks go
 * back to the system first (one large block frees the most memory for the
 * fewest future system calls), so the memory of one large run, or of a
 * freed executor, is not kept for good.
 *
 * This is the bookkeeping only (counts and bytes per class, which class
 * to evict next); the allocator keeps the blocks and the lock. Not
 * thread-safe: call under the allocator's lock. */
#ifndef PE_CORE_CACHE_POLICY_H
#define PE_CORE_CACHE_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PE_CACHE_CLASSES 41

typedef struct pe_cache_policy {
  int min_shift;                /* class 0 holds blocks of 2^min_shift bytes */
  size_t limit;                 /* bytes the cache may hold */
  size_t cached;                /* bytes it holds */
  uint64_t n[PE_CACHE_CLASSES]; /* cached blocks per class */
} pe_cache_policy;

void pe_cache_policy_init(pe_cache_policy *p, int min_shift, size_t limit);
/* The class of a request of `bytes` (0 counts as 1) and the class's block
 * size in *rounded; -1 when it is larger than the largest class. */
int pe_cache_class(const pe_cache_policy *p, size_t bytes, size_t *rounded);
size_t pe_cache_class_bytes(const pe_cache_policy *p, int k);
/* A freed block of class k enters the cache. */
void pe_cache_put(pe_cache_policy *p, int k);
/* A block of class k leaves it (reused or evicted); false (nothing
 * changes) when the class has none cached. */
bool pe_cache_take(pe_cache_policy *p, int k);
/* The class of the next block to evict, the largest cached class, while
 * the cache holds more than its limit; -1 when it fits. The caller takes
 * a block of that class off its list and calls pe_cache_take. */
int pe_cache_victim(const pe_cache_policy *p);

#endif
