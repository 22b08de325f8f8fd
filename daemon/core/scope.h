/* Scopes: name -> variable. A model scope holds persistables (parameters,
 * optimizer state, learning rate) and outlives programs; each executor has a
 * local scope for temporaries whose parent is the model scope. Lookups walk
 * to the parent. Variables are stable in memory until the scope is freed.
 * Not thread-safe: scopes are built at compile time and only read after. */
#ifndef PE_CORE_SCOPE_H
#define PE_CORE_SCOPE_H

#include <stdbool.h>

#include "strmap.h"
#include "tensor.h"

typedef struct pe_var {
  char *name;
  pe_tensor t;
  bool persistable;
} pe_var;

typedef struct pe_scope {
  struct pe_scope *parent;
  pe_strmap vars; /* name -> pe_var* */
  pe_var **order; /* creation order, for deterministic iteration */
  int n, cap;
} pe_scope;

pe_scope *pe_scope_new(pe_scope *parent);
void pe_scope_free(pe_scope *s); /* frees its own vars and their tensors */
/* Find in s or its ancestors; NULL if absent. */
pe_var *pe_scope_find(const pe_scope *s, const char *name);
/* Find in s only. */
pe_var *pe_scope_find_local(const pe_scope *s, const char *name);
/* Find in s or create in s. */
pe_status *pe_scope_var(pe_scope *s, const char *name, pe_var **out);

#endif
