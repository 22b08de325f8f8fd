#include "scope.h"

#include <stdlib.h>
#include <string.h>

pe_scope *pe_scope_new(pe_scope *parent) {
  pe_scope *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->parent = parent;
  pe_strmap_init(&s->vars);
  return s;
}

void pe_scope_free(pe_scope *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) {
    pe_tensor_release(&s->order[i]->t);
    free(s->order[i]->name);
    free(s->order[i]);
  }
  free(s->order);
  pe_strmap_destroy(&s->vars);
  free(s);
}

pe_var *pe_scope_find_local(const pe_scope *s, const char *name) {
  return pe_strmap_get(&s->vars, name);
}

pe_var *pe_scope_find(const pe_scope *s, const char *name) {
  for (; s; s = s->parent) {
    pe_var *v = pe_strmap_get(&s->vars, name);
    if (v) return v;
  }
  return NULL;
}

pe_status *pe_scope_var(pe_scope *s, const char *name, pe_var **out) {
  pe_var *v = pe_scope_find_local(s, name);
  if (v) {
    *out = v;
    return NULL;
  }
  if (s->n == s->cap) {
    int ncap = s->cap ? s->cap * 2 : 32;
    pe_var **no = realloc(s->order, (size_t)ncap * sizeof(*no));
    if (!no) return pe_error(PE_ENOMEM, "scope: out of memory adding '%s'", name);
    s->order = no;
    s->cap = ncap;
  }
  v = calloc(1, sizeof(*v));
  if (!v || !(v->name = strdup(name)) || !pe_strmap_put(&s->vars, name, v)) {
    if (v) free(v->name);
    free(v);
    return pe_error(PE_ENOMEM, "scope: out of memory adding '%s'", name);
  }
  s->order[s->n++] = v;
  *out = v;
  return NULL;
}
