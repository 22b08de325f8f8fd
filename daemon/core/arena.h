/* An arena of heap blocks freed in one go: everything a request handler
 * hangs off its Reply (server/dispatch.h) is allocated from one and freed
 * after the reply is packed. Each block has its destructor (NULL: free()).
 * Threads: one arena is used by one thread at a time. */
#ifndef PE_CORE_ARENA_H
#define PE_CORE_ARENA_H

#include <stdbool.h>
#include <stddef.h>

typedef struct pe_arena {
  void **ptrs;
  int n, cap;
  void (**dtors)(void *); /* parallel to ptrs; NULL: free() */
} pe_arena;

/* calloc'd, owned by the arena; NULL on out of memory. */
void *pe_arena_alloc(pe_arena *a, size_t size);
char *pe_arena_strdup(pe_arena *a, const char *s);
/* Take ownership of p (freed with dtor, or free() when dtor is NULL).
 * Returns false (and frees p) on out of memory. */
bool pe_arena_own(pe_arena *a, void *p, void (*dtor)(void *));
void pe_arena_free(pe_arena *a);

#endif
