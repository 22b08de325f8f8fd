/* A model's claimed dtypes and shapes (see registry/model_shapes.h). */
#include "server/registry/model_shapes.h"

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
  if (!st && claim && kind == PE_FIT_DECL) c->declared = true;
  pthread_mutex_unlock(&c->mu);
  return st;
}

/* Sorted, with the optimizer's and schedules' state ("fc_0.w@VELOCITY",
 * "@LR_DECAY_COUNTER@") after the parameters a user names. */
static int name_cmp(const void *a, const void *b) {
  const char *x = *(const char *const *)a, *y = *(const char *const *)b;
  int sx = strchr(x, '@') != NULL, sy = strchr(y, '@') != NULL;
  return sx != sy ? sx - sy : strcmp(x, y);
}

/* Up to `shown` of the claimed names, in name_cmp order, into buf ("a, b,
 * c and 4 more"; lock held). */
static void list_names(const pe_shape_claims *c, int shown, char *buf, size_t len) {
  const char **all = malloc((c->map.len ? c->map.len : 1) * sizeof *all);
  buf[0] = 0;
  if (!all) return;
  size_t n = 0;
  for (size_t i = 0; i < c->map.cap; i++)
    if (c->map.slots[i].key) all[n++] = c->map.slots[i].key;
  qsort(all, n, sizeof *all, name_cmp);
  size_t o = 0;
  for (size_t i = 0; i < n && i < (size_t)shown && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%.64s", i ? ", " : "", all[i]);
  if (n > (size_t)shown && o < len) snprintf(buf + o, len - o, " and %zu more", n - (size_t)shown);
  free(all);
}

pe_status *pe_shape_claims_known(pe_shape_claims *c, const char *model, const char *const *names,
                                 int n, bool any_one) {
  pthread_mutex_lock(&c->mu);
  int unknown = -1, known = 0;
  for (int i = 0; i < n && c->declared; i++) {
    if (pe_strmap_has(&c->map, names[i]))
      known++;
    else if (unknown < 0)
      unknown = i;
  }
  pe_status *st = NULL;
  if (unknown >= 0 && (!any_one || !known)) {
    char have[512];
    list_names(c, 8, have, sizeof have);
    st = any_one ? pe_error(PE_EUNKNOWN_VAR,
                            "none of its %d tensors ('%.64s'%s) is a variable of model '%s': no "
                            "program of the model declares them (the model has %s); a checkpoint "
                            "of another architecture?",
                            n, names[unknown], n > 1 ? ", ..." : "", model, have)
                 : pe_error(PE_EUNKNOWN_VAR,
                            "'%.64s' is not a variable of model '%s': no program of the model "
                            "declares it (the model has %s)",
                            names[unknown], model, have);
  }
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

int pe_shape_claims_largest_new(pe_shape_claims *c, const pe_var_info *items, int n, int *n_new) {
  int best = -1, count = 0;
  int64_t best_bytes = -1;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < n; i++) {
    if (pe_strmap_has(&c->map, items[i].name)) continue;
    count++;
    int64_t b = pe_var_info_bytes(&items[i]);
    if (b > best_bytes) {
      best = i;
      best_bytes = b;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (n_new) *n_new = count;
  return best;
}
