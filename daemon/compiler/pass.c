/* The pass table and manager (pass.h), plus the two small passes: validate
 * and inference. Passes are rows of a table (name, doc, run, rewrites); the
 * manager runs a comma-separated list, wraps each failure with the pass name,
 * and validates again after every pass that rewrites the program. */
#include "compiler/pass.h"

#include <stdio.h>
#include <string.h>

#include "compiler/validate.h"
#include "ops/registry.h"

static const pe_pass pass_table[] = {
    {"validate", "check ops, variables, arity, attributes, order; infer shapes", pe_pass_validate,
     false},
    {"backward", "append gradient ops for the loss; sum shared gradients; prune", pe_pass_backward,
     true},
    {"optimizer", "append one update op per trainable parameter; init state in startup",
     pe_pass_optimizer, true},
    {"inference", "set is_test on every op that has it (dropout, batch_norm)", pe_pass_inference,
     true},
};

#define N_PASSES ((int)(sizeof pass_table / sizeof pass_table[0]))

const pe_pass *pe_pass_table(int *n) {
  *n = N_PASSES;
  return pass_table;
}

const pe_pass *pe_pass_lookup(const char *name) {
  for (int i = 0; name && i < N_PASSES; i++)
    if (strcmp(pass_table[i].name, name) == 0) return &pass_table[i];
  return NULL;
}

static pe_status *run_one(pe_program *p, const pe_pass *ps, const pe_pass_opts *o) {
  pe_status *st = ps->run(p, o);
  if (st) return pe_status_wrap(st, "pass %s", ps->name);
  if (ps->rewrites) {
    st = pe_program_validate(p);
    if (st) return pe_status_wrap(st, "validate after pass %s", ps->name);
  }
  return NULL;
}

pe_status *pe_pass_run(pe_program *p, const char *name, const pe_pass_opts *o) {
  static const pe_pass_opts none = {0};
  if (!o) o = &none;
  const pe_pass *ps = pe_pass_lookup(name);
  if (!ps) return pe_error(PE_ENOTFOUND, "unknown pass '%s'", name ? name : "(null)");
  return run_one(p, ps, o);
}

pe_status *pe_passes_run(pe_program *p, const char *list, const pe_pass_opts *o) {
  for (const char *s = list; s && *s;) {
    const char *e = strchr(s, ',');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    char name[64];
    /* Tolerate spaces around names ("validate, backward"). */
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (n == 0 || n >= sizeof name)
      return pe_error(PE_EINVAL, "pass list '%s': empty or too long pass name", list);
    memcpy(name, s, n);
    name[n] = '\0';
    PE_TRY(pe_pass_run(p, name, o));
    s = e ? e + 1 : NULL;
  }
  return NULL;
}

pe_status *pe_program_compile(pe_program *p, bool for_test) {
  if (for_test) return pe_passes_run(p, "validate,inference", NULL);
  if (p->loss) return pe_passes_run(p, "validate,backward,optimizer", NULL);
  return pe_passes_run(p, "validate", NULL);
}

pe_status *pe_pass_validate(pe_program *p, const pe_pass_opts *o) {
  (void)o;
  return pe_program_validate(p);
}

pe_status *pe_pass_inference(pe_program *p, const pe_pass_opts *o) {
  (void)o;
  for (int bi = 0; bi < p->n_blocks; bi++) {
    pe_block *b = p->blocks[bi];
    for (int i = 0; i < b->n_ops; i++) {
      const pe_op_def *def = pe_op_lookup(b->ops[i]->type);
      const pe_attr_def *ad = def ? pe_op_attr_def(def, "is_test") : NULL;
      if (!ad) continue;
      if (ad->type == PE_ATTR_BOOL)
        PE_TRY(pe_op_set_bool(b->ops[i], "is_test", true));
      else
        PE_TRY(pe_op_set_int(b->ops[i], "is_test", 1));
    }
  }
  return NULL;
}
