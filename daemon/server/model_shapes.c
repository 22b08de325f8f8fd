/* A model's claimed dtypes and shapes (see model_shapes.h). */
#include "server/model_shapes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pe_code pe_var_misfit(const pe_var_info *have, const pe_var_info *want, pe_fit_kind kind, char *buf,
                      size_t len) {
  char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
  pe_shape_str(&have->shape, a, sizeof a);
  pe_shape_str(&want->shape, b, sizeof b);
  bool decl = kind == PE_FIT_DECL;
  if (have->dtype != want->dtype) {
    snprintf(buf, len, "'%s' is %s %s, %s %s %s", have->name, pe_dtype_name(have->dtype), a,
             decl ? "the program declares" : "the value is", pe_dtype_name(want->dtype), b);
    return PE_EDTYPE;
  }
  if (!pe_shape_compatible(&have->shape, &want->shape)) {
    snprintf(buf, len, "'%s' has shape %s, %s %s", have->name, a,
             decl ? "the program declares" : "the value has", b);
    return PE_ESHAPE;
  }
  return PE_OK;
}

void pe_shape_claims_init(pe_shape_claims *c) {
  pthread_mutex_init(&c->mu, NULL);
  pe_strmap_init(&c->map);
}

void pe_shape_claims_destroy(pe_shape_claims *c) {
  for (size_t i = 0; i < c->map.cap; i++)
    if (c->map.slots[i].key) {
      pe_var_info *v = c->map.slots[i].value;
      free(v->name);
      free(v);
    }
  pe_strmap_destroy(&c->map);
  pthread_mutex_destroy(&c->mu);
}

/* Claim `it` (lock held; not claimed yet). */
static pe_status *claim_one(pe_shape_claims *c, const pe_var_info *it) {
  pe_var_info *v = malloc(sizeof *v);
  char *name = strdup(it->name);
  if (!v || !name || !pe_strmap_put(&c->map, it->name, v)) {
    free(v);
    free(name);
    return pe_error(PE_ENOMEM, "out of memory recording the shape of '%s'", it->name);
  }
  *v = *it;
  v->name = name;
  return NULL;
}

pe_status *pe_shape_claims_check(pe_shape_claims *c, const char *model, const pe_var_info *items,
                                 int n, pe_fit_kind kind, bool claim) {
  pe_status *st = NULL;
  char why[2 * PE_SHAPE_STRLEN + 256];
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < n && !st; i++) {
    const pe_var_info *have = pe_strmap_get(&c->map, items[i].name);
    pe_code code = have ? pe_var_misfit(have, &items[i], kind, why, sizeof why) : PE_OK;
    if (code != PE_OK) st = pe_error(code, "model '%s': %s", model, why);
  }
  /* A claim that runs out of memory leaves the ones before it: they fit. */
  for (int i = 0; i < n && !st && claim; i++)
    if (!pe_strmap_has(&c->map, items[i].name)) st = claim_one(c, &items[i]);
  pthread_mutex_unlock(&c->mu);
  return st;
}

int64_t pe_var_info_bytes(const pe_var_info *v) {
  int64_t n = (int64_t)pe_dtype_size(v->dtype);
  for (int d = 0; d < v->shape.ndim; d++) {
    if (v->shape.d[d] < 0) return 0;
    if (v->shape.d[d] && n > INT64_MAX / v->shape.d[d]) return INT64_MAX;
    n *= v->shape.d[d];
  }
  return n;
}

int64_t pe_shape_claims_bytes(pe_shape_claims *c, const pe_var_info *items, int n, int64_t *added) {
  int64_t total = 0, extra = 0;
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->map.cap; i++)
    if (c->map.slots[i].key) total = pe_bytes_add(total, pe_var_info_bytes(c->map.slots[i].value));
  for (int i = 0; i < n; i++)
    if (!pe_strmap_has(&c->map, items[i].name))
      extra = pe_bytes_add(extra, pe_var_info_bytes(&items[i]));
  pthread_mutex_unlock(&c->mu);
  if (added) *added = extra;
  return pe_bytes_add(total, extra);
}
