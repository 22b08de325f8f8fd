/* pec_model_finish (model_internal.h): a model's program with a trainer's
 * pe_model_opts, serialised once. The builder holds the optimizer, so its
 * kind is known without unpacking anything. */
#include <stdio.h>
#include <string.h>

#include "builder_internal.h"
#include "model_internal.h"

static void set_optimizer(const pe_builder *b, pe_model_spec *out) {
  const char *kind = pe_optimizer_kind(b->opt_type);
  snprintf(out->optimizer, sizeof out->optimizer, "%s", kind ? kind : "");
}

static void set_feed(const pe_builder *b, const char *name, pe_model_feed *out) {
  const b_var *v = name[0] ? peb_var_find(&b->main, name) : NULL;
  *out = (pe_model_feed){0};
  if (!v || !v->is_feed || v->ndim > (int)(sizeof out->dims / sizeof out->dims[0])) return;
  out->dtype = v->dtype;
  out->ndim = v->ndim;
  memcpy(out->dims, v->d, sizeof(int64_t) * (size_t)v->ndim);
}

int pec_model_finish(pe_builder *b, const pe_model_opts *o, pe_model_spec *out, char *err,
                     size_t errlen) {
  set_optimizer(b, out);
  set_feed(b, out->image, &out->image_feed);
  set_feed(b, out->label, &out->label_feed);
  pe_train_recipe r;
  if (o && o->recipe) r = *o->recipe;
  if (o && o->prepare && o->prepare(out, o->recipe ? &r : NULL, o->arg)) {
    snprintf(err, errlen, "refused by the caller (pe_model_opts.prepare)");
    return -1;
  }
  if (o && o->recipe) {
    pe_builder_apply_recipe(b, &r);
    set_optimizer(b, out);
  }
  if (o && o->counter && out->optimizer[0]) pe_builder_add_counter(b, o->counter);
  if (pe_builder_finish(b, &out->bytes, &out->len)) {
    snprintf(err, errlen, "%s", pe_builder_error(b));
    return -1;
  }
  return 0;
}
