/* String-keyed open-addressing hash map (name -> pointer). Used at compile
 * time (name resolution); executors resolve names to pointers once so that
 * no run does a lookup. Keys are copied. Not thread-safe. */
#ifndef PE_CORE_STRMAP_H
#define PE_CORE_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct pe_strmap_entry {
  char *key; /* NULL: empty slot */
  void *value;
} pe_strmap_entry;

typedef struct pe_strmap {
  pe_strmap_entry *slots;
  size_t cap; /* power of two */
  size_t len;
} pe_strmap;

void pe_strmap_init(pe_strmap *m);
void pe_strmap_destroy(pe_strmap *m); /* frees keys, not values */
/* Insert or replace. Returns false on out of memory. */
bool pe_strmap_put(pe_strmap *m, const char *key, void *value);
void *pe_strmap_get(const pe_strmap *m, const char *key);
bool pe_strmap_has(const pe_strmap *m, const char *key);
/* Iterate: for (size_t i = 0; i < m->cap; i++) if (m->slots[i].key) ... */

#endif
