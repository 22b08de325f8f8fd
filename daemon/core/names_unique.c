/* A repeated name in a list, found with a hash set (see names_unique.h). */
#include "core/names_unique.h"

#include <stdint.h>
#include <string.h>

#include "core/strmap.h"

/* Up to this many names, comparing each pair is cheaper than the set. */
#define PAIRWISE_MAX 8

const char *pe_name_at_str(const void *list, size_t i) {
  return ((const char *const *)list)[i];
}

static pe_status *repeated(const char *what, const char *name, size_t first, size_t again) {
  return pe_error(PE_EINVAL, "%s '%.64s' is repeated (entries %zu and %zu); give each once", what,
                  name, first, again);
}

pe_status *pe_names_unique(const void *list, size_t n, pe_name_at_fn *at, const char *what) {
  if (n <= PAIRWISE_MAX) {
    for (size_t j = 1; j < n; j++) {
      const char *b = at(list, j);
      for (size_t i = 0; b && i < j; i++) {
        const char *a = at(list, i);
        if (a && !strcmp(a, b)) return repeated(what, b, i, j);
      }
    }
    return NULL;
  }
  pe_strmap seen; /* name -> its first entry's index + 1 */
  pe_strmap_init(&seen);
  pe_status *st = NULL;
  for (size_t j = 0; j < n && !st; j++) {
    const char *b = at(list, j);
    if (!b) continue;
    uintptr_t first = (uintptr_t)pe_strmap_get(&seen, b);
    if (first)
      st = repeated(what, b, (size_t)(first - 1), j);
    else if (!pe_strmap_put(&seen, b, (void *)(uintptr_t)(j + 1)))
      st = pe_error(PE_ENOMEM, "out of memory checking %zu %s names for repeats", n, what);
  }
  pe_strmap_destroy(&seen);
  return st;
}
