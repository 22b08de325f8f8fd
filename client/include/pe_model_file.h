/* Model files (conf/models/, format in conf/models/README.md): one layer per
 * line, parsed into a ProgramDesc through the program builder.
 *
 *   input image 784
 *   label label
 *   fc 256 act=relu
 *   fc 10
 *   loss softmax_with_cross_entropy
 *   accuracy
 *   optimizer momentum lr=0.1 mu=0.9
 *
 * The result is a pe_model_spec (pe_models.h), the same struct the built-in
 * models fill, so a trainer treats both alike. Errors carry the source and
 * the line: "cnn:7: unknown layer 'conv3d' (known: ...)". */
#ifndef PE_MODEL_FILE_H
#define PE_MODEL_FILE_H

#include <stddef.h>

#include "pe_models.h"
#include "pe_recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse len bytes of text; `source` names it in errors and is the model's
 * name unless a `name` line sets one. Returns 0 and *out (release with
 * pe_model_spec_release), or -1 with the message in err. */
int pe_model_file_parse(const char *text, size_t len, const char *source, pe_model_spec *out,
                        char *err, size_t errlen);

/* Read and parse the file at path; the source is the file's base name. */
int pe_model_file_load(const char *path, pe_model_spec *out, char *err, size_t errlen);

/* What a trainer's --model names: a model file when spec has a '/' or is an
 * existing regular file, else a built-in model (pe_model_spec_build), else
 * the file of that name in the installed models directory
 * (<prefix>/share/pe-executord/models, where `cmake --install` puts
 * conf/models: `--model resnet`). The error of an unknown name says that
 * a path is taken too and names the directory. */
int pe_model_resolve(const char *spec, pe_model_spec *out, char *err, size_t errlen);
/* The same with another models directory (NULL or "": none). */
int pe_model_resolve_in(const char *spec, const char *models_dir, pe_model_spec *out, char *err,
                        size_t errlen);

/* What a trainer changes in the model's program, applied by the builder
 * before it serialises (one pack; the bytes equal pe_train_recipe_apply's
 * and then pe_program_add_counter's on the plain model's). */
typedef struct pe_model_opts {
  const pe_train_recipe *recipe; /* NULL: the model's optimizer as it is */
  /* Declared (pe_builder_add_counter) when the program, recipe applied,
   * has an optimizer; NULL: none. */
  const char *counter;
  /* Optional; called once the model is parsed, before the recipe: m has
   * every field but bytes (NULL) and len, its optimizer the model's own.
   * With recipe set, r is a copy of it to adjust (step counts that depend
   * on the model's default batch), else NULL. Nonzero stops the resolve
   * (-1; the hook reports its own error). */
  int (*prepare)(const pe_model_spec *m, pe_train_recipe *r, void *arg);
  void *arg;
} pe_model_opts;

/* pe_model_resolve with o applied (NULL: none). */
int pe_model_resolve_opts(const char *spec, const pe_model_opts *o, pe_model_spec *out, char *err,
                          size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
