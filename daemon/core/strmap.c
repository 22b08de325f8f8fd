#include "strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

void pe_strmap_init(pe_strmap *m) { memset(m, 0, sizeof(*m)); }

void pe_strmap_destroy(pe_strmap *m) {
  for (size_t i = 0; i < m->cap; i++) free(m->slots[i].key);
  free(m->slots);
  pe_strmap_init(m);
}

static pe_strmap_entry *find_slot(pe_strmap_entry *slots, size_t cap, const char *key) {
  size_t i = (size_t)hash_str(key) & (cap - 1);
  while (slots[i].key && strcmp(slots[i].key, key) != 0) i = (i + 1) & (cap - 1);
  return &slots[i];
}

static bool grow(pe_strmap *m) {
  size_t ncap = m->cap ? m->cap * 2 : 16;
  pe_strmap_entry *ns = calloc(ncap, sizeof(*ns));
  if (!ns) return false;
  for (size_t i = 0; i < m->cap; i++)
    if (m->slots[i].key) *find_slot(ns, ncap, m->slots[i].key) = m->slots[i];
  free(m->slots);
  m->slots = ns;
  m->cap = ncap;
  return true;
}

bool pe_strmap_put(pe_strmap *m, const char *key, void *value) {
  if ((m->len + 1) * 4 > m->cap * 3 && !grow(m)) return false;
  pe_strmap_entry *e = find_slot(m->slots, m->cap, key);
  if (!e->key) {
    e->key = strdup(key);
    if (!e->key) return false;
    m->len++;
  }
  e->value = value;
  return true;
}

void *pe_strmap_get(const pe_strmap *m, const char *key) {
  if (!m->cap) return NULL;
  pe_strmap_entry *e = find_slot(m->slots, m->cap, key);
  return e->key ? e->value : NULL;
}

bool pe_strmap_has(const pe_strmap *m, const char *key) {
  if (!m->cap) return false;
  return find_slot(m->slots, m->cap, key)->key != NULL;
}
