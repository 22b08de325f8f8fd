/* The recipe's changes to an OptimizerDesc, shared by pe_train_recipe_apply
 * (recipe.c: a packed program, unpacked) and pe_builder_apply_recipe
 * (builder_recipe.c: a builder before it packs), so that both routes give
 * one program. Not installed. */
#ifndef PE_CLIENT_RECIPE_INTERNAL_H
#define PE_CLIENT_RECIPE_INTERNAL_H

#include <stddef.h>

#include "pe_recipe.h"
#include "program.pb-c.h"

/* r's optimizer kind into *type (a static string; NULL: r names none).
 * Returns 0, or -1 with a message in err (an unknown kind). */
int pec_recipe_kind(const pe_train_recipe *r, const char **type, char *err, size_t errlen);

/* r applied to od, a program's optimizer (od->type "" when the program has
 * a loss and no optimizer); type is pec_recipe_kind's. od->type may be
 * pointed at a static kind name and od->lr_schedule at *ls: the caller
 * restores them before freeing an unpacked od. r->no_decay_1d is the
 * caller's (it marks variables). Returns 0, or -1 with a message in err
 * (no optimizer to keep, a value out of range). */
int pec_recipe_apply_opt(const pe_train_recipe *r, const char *type, Pe__OptimizerDesc *od,
                         Pe__LrSchedule *ls, char *err, size_t errlen);

#endif
