/* The benchmark models as builder calls (see pe_models.h). A table row per
 * model: adding one is a row and a build function. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "pe_builder.h"
#include "pe_models.h"

typedef struct model_row {
  const char *name;
  int default_batch;
  /* Emit the layers; return the logits var (NULL on error). */
  const char *(*layers)(pe_builder *b, const char *image);
  int (*optimizer)(pe_builder *b);
  int image_ndim;
  int64_t image_dims[4];
} model_row;

static const char *mlp_layers(pe_builder *b, const char *image) {
  pe_b_fc_opts h = {.act = PE_B_ACT_RELU};
  const char *x = pe_builder_fc(b, image, 256, &h);
  x = pe_builder_fc(b, x, 128, &h);
  return pe_builder_fc(b, x, 10, NULL);
}

static int mlp_opt(pe_builder *b) {
  return pe_builder_momentum(b, 0.1f, 0.9f, false);
}

static const char *cnn_layers(pe_builder *b, const char *image) {
  pe_b_conv_opts c = {.pad = {2, 2}, .act = PE_B_ACT_RELU};
  pe_b_fc_opts h = {.act = PE_B_ACT_RELU};
  const char *x = pe_builder_conv2d(b, image, 32, 5, 5, &c);
  x = pe_builder_pool2d(b, x, 2, 2, NULL);
  x = pe_builder_conv2d(b, x, 64, 5, 5, &c);
  x = pe_builder_pool2d(b, x, 2, 2, NULL);
  x = pe_builder_fc(b, x, 1024, &h); /* flattens [N,64,7,7] via num_col_dims 1 */
  x = pe_builder_dropout(b, x, 0.4f, 0, NULL);
  return pe_builder_fc(b, x, 10, NULL);
}

static int cnn_opt(pe_builder *b) {
  return pe_builder_momentum(b, 0.01f, 0.9f, false);
}

static const model_row models[] = {
    {"mlp", 128, mlp_layers, mlp_opt, 2, {-1, 784}},
    {"cnn", 64, cnn_layers, cnn_opt, 4, {-1, 1, 28, 28}},
};

const char *pe_model_spec_names(void) {
  return "mlp|cnn";
}

static void copy_name(char *dst, const char *src) {
  snprintf(dst, PE_MODEL_NAME_LEN, "%s", src ? src : "");
}

static const model_row *find_row(const char *name) {
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
    if (name && strcmp(models[i].name, name) == 0) return &models[i];
  return NULL;
}

bool pec_model_builtin(const char *name) {
  return find_row(name) != NULL;
}

int pec_model_spec_build(const char *name, const pe_model_opts *o, pe_model_spec *out, char *err,
                         size_t errlen) {
  memset(out, 0, sizeof *out);
  const model_row *row = find_row(name);
  if (!row) {
    snprintf(err, errlen, "unknown model '%s' (known: %s)", name ? name : "(null)",
             pe_model_spec_names());
    return -1;
  }
  pe_builder *b = pe_builder_new();
  if (!b) {
    snprintf(err, errlen, "model %s: out of memory", name);
    return -1;
  }
  const char *image = pe_builder_data(b, "image", PE_B_F32, row->image_ndim, row->image_dims);
  const char *label = pe_builder_data(b, "label", PE_B_I64, PE_B_SHAPE(-1, 1));
  const char *logits = row->layers(b, image);
  const char *loss =
      pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, label, NULL));
  const char *acc = pe_builder_accuracy(b, logits, label, 1);
  pe_builder_append_backward(b, loss);
  row->optimizer(b);
  char msg[512];
  if (pe_builder_error(b)) {
    snprintf(err, errlen, "model %s: %s", name, pe_builder_error(b));
    pe_builder_free(b);
    return -1;
  }
  copy_name(out->name, row->name);
  copy_name(out->image, image);
  copy_name(out->label, label);
  copy_name(out->loss, loss);
  copy_name(out->accuracy, acc);
  /* the accuracy layer's outputs are "<layer>.out" / ".correct" / ".total" */
  snprintf(out->correct, PE_MODEL_NAME_LEN, "%.*s.correct", (int)(strlen(acc) - strlen(".out")),
           acc);
  out->image_ndim = row->image_ndim;
  memcpy(out->image_dims, row->image_dims, sizeof out->image_dims);
  out->default_batch = row->default_batch;
  int rc = pec_model_finish(b, o, out, msg, sizeof msg);
  if (rc) snprintf(err, errlen, "model %s: %s", name, msg);
  pe_builder_free(b);
  return rc;
}

int pe_model_spec_build(const char *name, pe_model_spec *out, char *err, size_t errlen) {
  return pec_model_spec_build(name, NULL, out, err, errlen);
}

void pe_model_spec_release(pe_model_spec *m) {
  if (!m) return;
  free(m->bytes);
  m->bytes = NULL;
  m->len = 0;
}
