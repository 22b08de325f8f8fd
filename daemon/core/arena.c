/* The arena (see arena.h). */
#include "core/arena.h"

#include <stdlib.h>
#include <string.h>

bool pe_arena_own(pe_arena *a, void *p, void (*dtor)(void *)) {
  if (!p) return false;
  if (a->n == a->cap) {
    int cap = a->cap ? 2 * a->cap : 32;
    void **ptrs = realloc(a->ptrs, (size_t)cap * sizeof *ptrs);
    if (!ptrs) goto fail;
    a->ptrs = ptrs;
    void (**d)(void *) = realloc(a->dtors, (size_t)cap * sizeof *d);
    if (!d) goto fail;
    a->dtors = d;
    a->cap = cap;
  }
  a->ptrs[a->n] = p;
  a->dtors[a->n] = dtor;
  a->n++;
  return true;
fail:
  if (dtor)
    dtor(p);
  else
    free(p);
  return false;
}

void *pe_arena_alloc(pe_arena *a, size_t size) {
  void *p = calloc(1, size ? size : 1);
  return pe_arena_own(a, p, NULL) ? p : NULL;
}

char *pe_arena_strdup(pe_arena *a, const char *s) {
  char *p = strdup(s ? s : "");
  return pe_arena_own(a, p, NULL) ? p : NULL;
}

void pe_arena_free(pe_arena *a) {
  for (int i = a->n - 1; i >= 0; i--) {
    if (a->dtors[i])
      a->dtors[i](a->ptrs[i]);
    else
      free(a->ptrs[i]);
  }
  free(a->ptrs);
  free(a->dtors);
  memset(a, 0, sizeof *a);
}
