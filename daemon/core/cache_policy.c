/* The caching allocators' size classes and bound (cache_policy.h). */
#include "core/cache_policy.h"

#include <string.h>

void pe_cache_policy_init(pe_cache_policy *p, int min_shift, size_t limit) {
  memset(p, 0, sizeof *p);
  p->min_shift = min_shift;
  p->limit = limit;
}

size_t pe_cache_class_bytes(const pe_cache_policy *p, int k) {
  return (size_t)1 << (p->min_shift + k);
}

int pe_cache_class(const pe_cache_policy *p, size_t bytes, size_t *rounded) {
  if (bytes == 0) bytes = 1;
  if (bytes > pe_cache_class_bytes(p, PE_CACHE_CLASSES - 1)) return -1;
  int k = 0;
  while (pe_cache_class_bytes(p, k) < bytes) k++;
  *rounded = pe_cache_class_bytes(p, k);
  return k;
}

void pe_cache_put(pe_cache_policy *p, int k) {
  p->n[k]++;
  p->cached += pe_cache_class_bytes(p, k);
}

bool pe_cache_take(pe_cache_policy *p, int k) {
  if (!p->n[k]) return false;
  p->n[k]--;
  p->cached -= pe_cache_class_bytes(p, k);
  return true;
}

int pe_cache_victim(const pe_cache_policy *p) {
  if (p->cached <= p->limit) return -1;
  for (int k = PE_CACHE_CLASSES - 1; k >= 0; k--)
    if (p->n[k]) return k;
  return -1;
}
