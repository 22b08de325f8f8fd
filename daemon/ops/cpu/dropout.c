/* dropout and dropout_grad (f32).
 *
 * Training: element i is kept (Mask 1) when u_i >= p, where u_i is uniform in
 * [0, 1) from counter base + i of the program generator (seeded with the
 * op's seed attribute when it is non-zero: pe_kernel_rng).
 * So P(keep) = 1 - p, p == 0 keeps everything and p == 1 drops everything,
 * and the mask does not depend on the thread count.
 *
 *   implementation        train               test (is_test)
 *   upscale_in_train      x * mask / (1-p)     x
 *   downgrade_in_infer    x * mask             x * (1-p)
 *
 * With p == 1 the training scale is 0, never 1/0. In test mode the Mask is
 * all ones and no random numbers are drawn. The gradient is
 * X@GRAD = Out@GRAD * Mask * scale with the same scale as the forward.
 *
 * Gradient maker (custom): dropout_grad takes Mask and Out@GRAD only, so X
 * and Out need not stay alive for the backward pass. */
#include <stdio.h>
#include <string.h>

#include "ops/cpu/par_min.h"
#include "ops/op_tables.h"

enum { DROP_X = 0 };
enum { DROP_OUT = 0, DROP_MASK };
enum { DROP_G_MASK = 0, DROP_G_DOUT };
enum { DROP_G_DX = 0 };

typedef struct dropout_cfg {
  float p;
  bool is_test;
  bool upscale; /* upscale_in_train, else downgrade_in_infer */
} dropout_cfg;

/* Read the attributes; false with a message in err when one is invalid. */
static bool cfg_read(const pe_op_def *d, const pe_op_desc *op, dropout_cfg *cfg, char *err,
                     size_t len) {
  cfg->p = pe_attr_f(d, op, "dropout_prob");
  cfg->is_test = pe_attr_b(d, op, "is_test");
  const char *impl = pe_attr_s(d, op, "dropout_implementation");
  cfg->upscale = strcmp(impl, "upscale_in_train") == 0;
  if (!(cfg->p >= 0.0f && cfg->p <= 1.0f)) { /* NaN fails too */
    snprintf(err, len, "attribute 'dropout_prob' = %g is outside [0, 1]", cfg->p);
    return false;
  }
  if (!cfg->upscale && strcmp(impl, "downgrade_in_infer") != 0) {
    snprintf(err, len,
             "attribute 'dropout_implementation' = \"%s\"; use \"upscale_in_train\" or "
             "\"downgrade_in_infer\"",
             impl);
    return false;
  }
  return true;
}

static pe_status *cfg_infer(pe_infer_ctx *c, dropout_cfg *cfg) {
  char err[256];
  return cfg_read(c->def, c->desc, cfg, err, sizeof err) ? NULL
                                                         : pe_infer_error(c, PE_EATTR, "%s", err);
}

/* Kernels re-check: a kernel may run without inference in tests. */
static pe_status *cfg_kernel(pe_kernel_ctx *c, dropout_cfg *cfg) {
  char err[256];
  return cfg_read(c->def, c->desc, cfg, err, sizeof err) ? NULL
                                                         : pe_kernel_error(c, PE_EATTR, "%s", err);
}

/* Multiplier applied to kept elements (see the table above). */
static float cfg_scale(const dropout_cfg *cfg) {
  if (cfg->is_test) return cfg->upscale ? 1.0f : 1.0f - cfg->p;
  if (!cfg->upscale) return 1.0f;
  return cfg->p < 1.0f ? 1.0f / (1.0f - cfg->p) : 0.0f;
}

/* --- dropout ------------------------------------------------------------------ */

static pe_status *dropout_infer(pe_infer_ctx *c) {
  dropout_cfg cfg;
  PE_TRY(cfg_infer(c, &cfg));
  pe_meta *x = pe_in_meta(c, DROP_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "missing input X");
  PE_TRY(pe_infer_expect_dtype(c, DROP_X, 0, PE_F32));
  pe_infer_set(c, DROP_OUT, PE_F32, &x->shape);
  pe_infer_set(c, DROP_MASK, PE_U8, &x->shape);
  return NULL;
}

static pe_status *dropout_kernel(pe_kernel_ctx *c) {
  dropout_cfg cfg;
  PE_TRY(cfg_kernel(c, &cfg));
  pe_tensor *x = pe_kin(c, DROP_X, 0), *out = pe_kout(c, DROP_OUT, 0);
  pe_tensor *mask = pe_kout(c, DROP_MASK, 0);
  int64_t n = pe_tensor_numel(x);
  const float *px = pe_f32(x);
  float *po = out ? pe_f32(out) : NULL;
  uint8_t *pm = mask ? mask->data : NULL;
  float scale = cfg_scale(&cfg);
  int nt = pe_kernel_threads(c);

  if (cfg.is_test) {
    if (pm) memset(pm, 1, (size_t)n);
    if (po) {
#pragma omp parallel for num_threads(nt) if (pe_par_split(n)) schedule(static)
      for (int64_t i = 0; i < n; i++) po[i] = px[i] * scale;
    }
    return NULL;
  }

  /* Reserve the counters even when nothing is written, so that the
   * generator's offset after this op does not depend on which outputs the
   * program kept. */
  pe_rng *r = NULL;
  uint64_t seed = 0;
  PE_TRY(pe_kernel_rng(c, &r, &seed));
  uint64_t base = pe_rng_reserve(r, (uint64_t)n);
  double p = cfg.p;
#pragma omp parallel for num_threads(nt) if (pe_par_split(n)) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    bool keep = pe_rng_uniform(seed, base + (uint64_t)i) >= p;
    if (pm) pm[i] = keep;
    /* A dropped element is 0 even when x is inf or NaN. */
    if (po) po[i] = keep ? px[i] * scale : 0.0f;
  }
  return NULL;
}

/* --- dropout_grad ------------------------------------------------------------------ */

static pe_status *dropout_grad_maker(pe_grad_ctx *g) {
  const pe_op_desc *f = g->fwd;
  const char *x = pe_op_input_arg(f, "X"), *out = pe_op_output_arg(f, "Out");
  const char *mask = pe_op_output_arg(f, "Mask");
  if (!x || !out || !mask) return pe_error(PE_EARITY, "dropout gradient needs X, Out and Mask");
  pe_op_desc *op;
  PE_TRY(pe_grad_new_op(g, "dropout_grad", &op));
  char gname[512];
  PE_TRY(pe_op_input1(op, "Mask", mask));
  PE_TRY(pe_op_input1(op, "Out" PE_GRAD_SUFFIX, pe_grad_name(out, gname, sizeof gname)));
  PE_TRY(pe_op_output1(op, "X" PE_GRAD_SUFFIX, pe_grad_name(x, gname, sizeof gname)));
  for (int i = 0; i < f->n_attr; i++) PE_TRY(pe_op_set_attr(op, &f->attrs[i]));
  return NULL;
}

static pe_status *dropout_grad_infer(pe_infer_ctx *c) {
  dropout_cfg cfg;
  PE_TRY(cfg_infer(c, &cfg));
  pe_meta *mask = pe_in_meta(c, DROP_G_MASK, 0), *dout = pe_in_meta(c, DROP_G_DOUT, 0);
  if (!mask) return pe_infer_error(c, PE_EARITY, "missing input Mask");
  PE_TRY(pe_infer_expect_dtype(c, DROP_G_MASK, 0, PE_U8));
  if (dout) {
    PE_TRY(pe_infer_expect_dtype(c, DROP_G_DOUT, 0, PE_F32));
    if (!pe_shape_compatible(&dout->shape, &mask->shape)) {
      char sa[PE_SHAPE_STRLEN], sb[PE_SHAPE_STRLEN];
      return pe_infer_error(
          c, PE_ESHAPE, "Out@GRAD '%s' %s does not match Mask '%s' %s",
          pe_in_name(c, DROP_G_DOUT, 0), pe_shape_str(&dout->shape, sa, sizeof sa),
          pe_in_name(c, DROP_G_MASK, 0), pe_shape_str(&mask->shape, sb, sizeof sb));
    }
  }
  pe_infer_set(c, DROP_G_DX, PE_F32, &mask->shape);
  return NULL;
}

static pe_status *dropout_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, DROP_G_DX, 0);
  if (!dx) return NULL;
  pe_tensor *mask = pe_kin(c, DROP_G_MASK, 0), *dout = pe_kin(c, DROP_G_DOUT, 0);
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  dropout_cfg cfg;
  PE_TRY(cfg_kernel(c, &cfg));
  float scale = cfg_scale(&cfg);
  int64_t n = pe_tensor_numel(dx);
  const uint8_t *pm = mask->data;
  const float *pg = pe_f32(dout);
  float *pd = pe_f32(dx);
  int nt = pe_kernel_threads(c);
#pragma omp parallel for num_threads(nt) if (pe_par_split(n)) schedule(static)
  for (int64_t i = 0; i < n; i++) pd[i] = pm[i] ? pg[i] * scale : 0.0f;
  return NULL;
}

/* --- table ------------------------------------------------------------------------------ */

static const pe_slot_def dropout_in[] = {{"X", 1, 1, 0}, {NULL}};
static const pe_slot_def dropout_out[] = {{"Out", 1, 1, 0}, {"Mask", 1, 1, 0}, {NULL}};
static const pe_slot_def dropout_grad_in[] = {
    {"Mask", 1, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def dropout_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};

/* The grad op carries the forward attributes (copied by the maker). */
static const pe_attr_def dropout_attrs[] = {
    {"dropout_prob", PE_ATTR_FLOAT, false, 0.5, NULL},
    {"is_test", PE_ATTR_BOOL, false, 0, NULL},
    {"seed", PE_ATTR_INT, false, 0, NULL},
    {"dropout_implementation", PE_ATTR_STRING, false, 0, "upscale_in_train"},
    {NULL},
};

const pe_op_def pe_ops_dropout[] = {
    {.type = "dropout",
     .inputs = dropout_in,
     .outputs = dropout_out,
     .attrs = dropout_attrs,
     .flags = PE_OP_RANDOM,
     .infer = dropout_infer,
     .kernel_cpu = dropout_kernel,
     .grad = dropout_grad_maker},
    {.type = "dropout_grad",
     .inputs = dropout_grad_in,
     .outputs = dropout_grad_out,
     .attrs = dropout_attrs,
     .infer = dropout_grad_infer,
     .kernel_cpu = dropout_grad_kernel},
    {0},
};
