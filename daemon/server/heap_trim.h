/* Giving the C heap's free memory back to the kernel after the compile or
 * the free of a large program.
 *
 * A register's compile allocates temporaries in proportion to the
 * program's ops (the decoded program, each pass's graphs and maps) on the
 * request thread that handles it, and a deregister frees the compiled
 * graphs on whichever thread drops the last reference. glibc keeps freed
 * memory in the arena it came from, and gives each thread an arena of its
 * own, so register+deregister cycles that land on different request
 * threads each left a few hundred MB resident for good (about 200 MB per
 * cycle at 100k ops). Two things give it back:
 *
 *  - malloc_trim(0) after such a compile or free returns the free pages
 *    inside every arena (madvise), at the cost of a walk over the arenas'
 *    free chunks: a few ms, small beside the compile or free it follows,
 *    and the reason it runs only past a program size.
 *  - malloc_trim leaves the free memory at the top of a thread's arena;
 *    only a free shrinks that, down to M_TRIM_THRESHOLD, which glibc
 *    raises to twice the largest mmapped block freed so far (tens of MB
 *    once a large program's arrays were freed): per request thread that
 *    was kept for good. The daemon fixes the threshold at a few MB. Fixing
 *    it also fixes M_MMAP_THRESHOLD, which would stay at 128 KiB (every
 *    mid-size block, such as a decoded request's, mapped and unmapped);
 *    blocks from a few MB up are mapped, and unmapped at their free.
 *
 * Capping the arenas (M_ARENA_MAX) instead would make the request and
 * pool threads' allocations contend on shared locks and still keep the
 * freed memory. Tensors come from the caching allocator, which trims on
 * its own (core/allocator.h).
 *
 * Threads: pe_heap_trim_setup at start-up, before other threads; the
 * other, any. */
#ifndef PE_SERVER_HEAP_TRIM_H
#define PE_SERVER_HEAP_TRIM_H

#include <stddef.h>

/* Programs of at least this many serialised bytes (a few thousand ops)
 * trim after their compile and their free. */
#define PE_HEAP_TRIM_PROGRAM_BYTES ((size_t)256 << 10)

/* The free memory at an arena's top that a free leaves in place
 * (M_TRIM_THRESHOLD), and the size from which blocks are mapped on their
 * own (M_MMAP_THRESHOLD). */
#define PE_HEAP_TRIM_TOP_BYTES ((size_t)4 << 20)
#define PE_HEAP_MMAP_BYTES ((size_t)4 << 20)

/* Set the thresholds above (start-up). */
void pe_heap_trim_setup(void);
/* After the compile or the free of a program of program_bytes. */
void pe_heap_trim_after_program(size_t program_bytes);

#endif
