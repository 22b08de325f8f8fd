/* The dtype and shape of each persistable of a model ("claims"), so that a
 * program, a SetParams, a Load or a restart's restore that does not fit the
 * model is refused up front, naming the model, the variable and both shapes,
 * instead of binding and failing inside a kernel at every run (or training
 * the model's old shapes while the program's reply lists others).
 *
 * A name is claimed by the first program published under the model that
 * declares it (its VarDesc's dtype and shape) or by the first value set for
 * it (SetParams, Load, restore), whichever comes first; a claim stays for
 * the model's life. Every value of the model therefore has its claim's
 * dtype and shape: Init and runs write only persistables of published
 * programs, and a set is checked before it is applied. So the check never
 * reads a value, which is engine-ordered storage: it reads this table under
 * its own lock.
 *
 * Names. Once a program has been published under the model (a declaration
 * claimed), the model's variables are known: a value for a name that no
 * program declared and the model does not hold is a mistake (a typo, a
 * layer of another architecture), refused rather than added
 * (pe_shape_claims_known). Before that, the first value claims the name.
 *
 * Threads: any; the lock is a leaf (held for lookups only, taken inside the
 * registry lock and inside a model's init_mu). */
#ifndef PE_SERVER_MODEL_SHAPES_H
#define PE_SERVER_MODEL_SHAPES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "core/strmap.h"

/* A declared or held variable: name, dtype and shape (-1: any size). */
typedef struct pe_var_info {
  char *name;
  pe_dtype dtype;
  pe_shape shape;
} pe_var_info;

/* What is checked against a claim: a program's declaration or a value;
 * it words the message ("the program declares" / "the value has"). */
typedef enum pe_fit_kind { PE_FIT_DECL, PE_FIT_VALUE } pe_fit_kind;

/* PE_OK when `want` fits `have` (same dtype, each dim equal or -1 in
 * either); else PE_EDTYPE or PE_ESHAPE and, in buf, "'fc_0.w' has shape
 * [784,256], the program declares [784,512]" (or "'x' is f32 [2], the value
 * is f64 [2]"). */
pe_code pe_var_misfit(const pe_var_info *have, const pe_var_info *want, pe_fit_kind kind, char *buf,
                      size_t len);

typedef struct pe_shape_claims {
  pthread_mutex_t mu;
  pe_strmap map; /* name -> pe_var_info * (malloc'd, with its own name copy) */
  bool declared; /* a program's declarations were claimed (PE_FIT_DECL) */
} pe_shape_claims;

void pe_shape_claims_init(pe_shape_claims *c);
void pe_shape_claims_destroy(pe_shape_claims *c);

/* Check items (n of them) against the claims of model `model`: the first
 * misfit is returned as "model 'm': 'fc_0.w' has shape [784,256], the
 * program declares [784,512]" (PE_ESHAPE or PE_EDTYPE). With claim, and
 * when every item fits, the items not claimed yet are claimed, in the same
 * hold of the lock, so two conflicting claimers cannot both pass. */
pe_status *pe_shape_claims_check(pe_shape_claims *c, const char *model, const pe_var_info *items,
                                 int n, pe_fit_kind kind, bool claim);

/* Whether values for names (n) may be set, by the rule above: NULL when
 * no program has declared anything yet, or when every name (any_one: at
 * least one; a checkpoint's tensors) is claimed; else PE_EUNKNOWN_VAR
 * naming the first unknown name and a few of the model's, sorted
 * ("'nosuch' is not a variable of model 'm': no program of the model
 * declares it (the model has fc_0.b, fc_0.w, ... and 3 more)"). */
pe_status *pe_shape_claims_known(pe_shape_claims *c, const char *model, const char *const *names,
                                 int n, bool any_one);

/* Bytes of the persistables the claims describe, with items (n; may be 0)
 * not claimed yet counted as if claimed; *added (may be NULL) gets those
 * items' part. A dim of -1 makes a variable's size unknown: it counts 0.
 * Saturates at INT64_MAX (a program may declare any dims). */
int64_t pe_shape_claims_bytes(pe_shape_claims *c, const pe_var_info *items, int n, int64_t *added);
/* The largest of items (n) not claimed yet, by the count above: its
 * index, or -1 when every one is claimed; *n_new (may be NULL) gets how
 * many are not. */
int pe_shape_claims_largest_new(pe_shape_claims *c, const pe_var_info *items, int n, int *n_new);
/* The bytes of one declaration, as counted above. */
int64_t pe_var_info_bytes(const pe_var_info *v);
/* a + b for byte counts >= 0, saturating at INT64_MAX. */
static inline int64_t pe_bytes_add(int64_t a, int64_t b) {
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}

#endif
