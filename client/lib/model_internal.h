/* The model builders with pe_model_opts (pe_model_file.h): the built-in
 * models (models.c), model files (model_file.c, model_resolve.c) and what
 * both do before they serialise (model_opts.c). Not installed; the public
 * calls pass NULL options. */
#ifndef PE_CLIENT_MODEL_INTERNAL_H
#define PE_CLIENT_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "pe_builder.h"
#include "pe_model_file.h"

/* The last step of a model: o applied to b (the prepare hook, the recipe,
 * the counter), then out->bytes serialised. out's other fields are filled
 * already but its optimizer, set here. Returns 0, or -1 with the bare
 * message in err (the caller names the model). */
int pec_model_finish(pe_builder *b, const pe_model_opts *o, pe_model_spec *out, char *err,
                     size_t errlen);

/* name is a built-in model (pe_model_spec_names). */
bool pec_model_builtin(const char *name);
int pec_model_spec_build(const char *name, const pe_model_opts *o, pe_model_spec *out, char *err,
                         size_t errlen);
int pec_model_file_parse(const char *text, size_t len, const char *source, const pe_model_opts *o,
                         pe_model_spec *out, char *err, size_t errlen);
int pec_model_file_load(const char *path, const pe_model_opts *o, pe_model_spec *out, char *err,
                        size_t errlen);

#endif
