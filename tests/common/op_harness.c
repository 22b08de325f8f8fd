#include "op_harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ops/device_ctx.h"

static pe_device_ctx *harness_dev(void) {
  static __thread pe_device_ctx dev;
  static __thread int init;
  if (!init) {
    pe_device_ctx_init(&dev, pe_cpu_place(), 0);
    pe_device_ctx_bind(&dev);
    init = 1;
  }
  return &dev;
}

pe_tensor *ph_get(pe_scope *s, const char *name) {
  pe_var *v = pe_scope_find(s, name);
  return v ? &v->t : NULL;
}

static pe_tensor *set_raw(pe_scope *s, const char *name, pe_dtype dt, pe_shape shape,
                          const void *v) {
  pe_var *var;
  pe_status *st = pe_scope_var(s, name, &var);
  if (st) abort();
  st = pe_tensor_resize(&var->t, dt, &shape, name);
  if (st) abort();
  if (v) memcpy(var->t.data, v, pe_tensor_bytes(&var->t));
  return &var->t;
}

void ph_set_meta(pe_scope *s, const char *name, pe_dtype dt, pe_shape shape) {
  pe_var *v;
  if (pe_scope_var(s, name, &v)) abort();
  pe_tensor_release(&v->t);
  v->t.dtype = dt;
  v->t.shape = shape;
}

pe_tensor *ph_set_f32(pe_scope *s, const char *name, pe_shape shape, const float *v) {
  return set_raw(s, name, PE_F32, shape, v);
}
pe_tensor *ph_set_i64(pe_scope *s, const char *name, pe_shape shape, const int64_t *v) {
  return set_raw(s, name, PE_I64, shape, v);
}

pe_tensor *ph_set_uniform(pe_scope *s, const char *name, pe_shape shape, float lo, float hi,
                          uint64_t seed) {
  pe_tensor *t = set_raw(s, name, PE_F32, shape, NULL);
  float *p = pe_f32(t);
  for (int64_t i = 0; i < pe_tensor_numel(t); i++)
    p[i] = lo + (hi - lo) * (float)pe_rng_uniform(seed, (uint64_t)i);
  return t;
}

pe_status *ph_op_add_slots(pe_op_desc *op, va_list ap) {
  for (int pass = 0; pass < 2; pass++) {
    const char *slot;
    while ((slot = va_arg(ap, const char *))) {
      const char *arg = va_arg(ap, const char *);
      PE_TRY(pass ? pe_op_output1(op, slot, arg) : pe_op_input1(op, slot, arg));
    }
  }
  return NULL;
}

pe_op_desc *ph_op(const char *type, ...) {
  pe_op_desc *op = pe_op_desc_new(type);
  va_list ap;
  va_start(ap, type);
  pe_status *st = ph_op_add_slots(op, ap);
  va_end(ap);
  if (st) abort();
  return op;
}

/* Bound op: tensor lists and meta lists per def slot. */
typedef struct bound {
  const pe_op_def *def;
  pe_tensor_list in[16], out[16];
  pe_meta_list min[16], mout[16];
  pe_tensor *tin[16][16], *tout[16][16];
  pe_meta *pin[16][16], *pout[16][16];
  pe_meta vin[16][16], vout[16][16];
  const char *nin[16][16], *nout[16][16];
} bound;

static pe_status *bind(pe_scope *s, const pe_op_desc *op, bound *b, bool create_outputs) {
  memset(b, 0, sizeof(*b));
  b->def = pe_op_lookup(op->type);
  if (!b->def) return pe_error(PE_EUNKNOWN_OP, "unknown op '%s'", op->type);
  for (int i = 0; i < op->n_in; i++) {
    int di = pe_op_input_index(b->def, op->in[i].name);
    if (di < 0) return pe_error(PE_EARITY, "%s: no input slot %s", op->type, op->in[i].name);
    for (int k = 0; k < op->in[i].n; k++) {
      pe_var *v = pe_scope_find(s, op->in[i].args[k]);
      if (!v)
        return pe_error(PE_EUNKNOWN_VAR, "%s: input '%s' not set", op->type, op->in[i].args[k]);
      b->tin[di][k] = &v->t;
      b->vin[di][k] = (pe_meta){v->t.dtype, v->t.shape};
      b->pin[di][k] = &b->vin[di][k];
      b->nin[di][k] = op->in[i].args[k];
    }
    b->in[di] = (pe_tensor_list){op->in[i].n, b->tin[di]};
    b->min[di] = (pe_meta_list){op->in[i].n, b->nin[di], b->pin[di]};
  }
  for (int i = 0; i < op->n_out; i++) {
    int di = pe_op_output_index(b->def, op->out[i].name);
    if (di < 0) return pe_error(PE_EARITY, "%s: no output slot %s", op->type, op->out[i].name);
    for (int k = 0; k < op->out[i].n; k++) {
      pe_var *v = NULL;
      if (create_outputs) PE_TRY(pe_scope_var(s, op->out[i].args[k], &v));
      b->tout[di][k] = v ? &v->t : NULL;
      b->pout[di][k] = &b->vout[di][k];
      b->nout[di][k] = op->out[i].args[k];
    }
    b->out[di] = (pe_tensor_list){op->out[i].n, b->tout[di]};
    b->mout[di] = (pe_meta_list){op->out[i].n, b->nout[di], b->pout[di]};
  }
  return NULL;
}

pe_status *ph_infer_op(pe_scope *s, const pe_op_desc *op, pe_meta *out_metas, int max_out) {
  bound b;
  PE_TRY(bind(s, op, &b, false));
  pe_infer_ctx ic = {b.def, op, 0, false, b.min, b.mout};
  PE_TRY(b.def->infer(&ic));
  int n = 0;
  for (int o = 0; o < b.def->n_outputs; o++)
    for (int k = 0; k < b.mout[o].n && n < max_out; k++) out_metas[n++] = b.vout[o][k];
  return NULL;
}

/* Bind op to s's variables, infer, size the outputs and run the kernel with
 * op state *state, generator rng and device dev. */
static pe_status *run_bound(pe_scope *s, const pe_op_desc *op, void **state, pe_rng *rng,
                            pe_device_ctx *dev) {
  bound b;
  PE_TRY(bind(s, op, &b, true));
  pe_infer_ctx ic = {b.def, op, 0, true, b.min, b.mout};
  PE_TRY(b.def->infer(&ic));
  for (int o = 0; o < b.def->n_outputs; o++)
    for (int k = 0; k < b.out[o].n; k++)
      PE_TRY(pe_tensor_resize(b.tout[o][k], b.vout[o][k].dtype, &b.vout[o][k].shape, b.nout[o][k]));
  pe_kernel_ctx kc = {b.def, op, 0, b.in, b.out, state, rng, dev};
  if (!b.def->kernel_cpu) return pe_error(PE_EINTERNAL, "%s has no cpu kernel", op->type);
  return b.def->kernel_cpu(&kc);
}

static void free_state(const pe_op_def *def, void *state) {
  if (state && def && def->state_free) def->state_free(state);
}

pe_status *ph_run_op(pe_scope *s, const pe_op_desc *op, pe_rng *rng) {
  pe_rng local = {1234, 0};
  void *state = NULL;
  pe_status *st = run_bound(s, op, &state, rng ? rng : &local, harness_dev());
  free_state(pe_op_lookup(op->type), state);
  return st;
}

ph_op_inst *ph_op_inst_new(const pe_op_desc *op, pe_device_ctx *dev) {
  ph_op_inst *inst = calloc(1, sizeof(*inst));
  if (!inst) abort();
  inst->op = op;
  inst->def = pe_op_lookup(op->type);
  inst->dev = dev;
  return inst;
}

pe_status *ph_op_inst_run(ph_op_inst *inst, pe_scope *s, pe_rng *rng) {
  pe_rng local = {1234, 0};
  return run_bound(s, inst->op, &inst->state, rng ? rng : &local,
                   inst->dev ? inst->dev : harness_dev());
}

void ph_op_inst_free(ph_op_inst *inst) {
  if (!inst) return;
  free_state(inst->def, inst->state);
  free(inst);
}

static double weighted_loss(pe_scope *s, const char *const *outs, int n_outs) {
  double L = 0;
  for (int j = 0; j < n_outs; j++) {
    pe_tensor *t = ph_get(s, outs[j]);
    const float *p = pe_f32(t);
    for (int64_t i = 0; i < pe_tensor_numel(t); i++)
      L += (0.5 + pe_rng_uniform(977 + (uint64_t)j, (uint64_t)i)) * p[i];
  }
  return L;
}

pe_status *ph_grad_check(pe_scope *s, const pe_op_desc *fwd, const char *const *outs, int n_outs,
                         const char *const *wrt, int n_wrt, double eps, int max_elems,
                         ph_grad_report *rep) {
  memset(rep, 0, sizeof(*rep));
  const pe_op_def *def = pe_op_lookup(fwd->type);
  if (!def) return pe_error(PE_EUNKNOWN_OP, "unknown op '%s'", fwd->type);
  if (!def->grad) return pe_error(PE_ENOGRAD, "op '%s' has no gradient", fwd->type);
  pe_rng rng0 = {4321, 0}, rng = rng0;
  PE_TRY(ph_run_op(s, fwd, &rng));

  /* Seed output gradients: w for outputs in the loss, zeros for the others. */
  char gname[256];
  for (int i = 0; i < fwd->n_out; i++)
    for (int k = 0; k < fwd->out[i].n; k++) {
      const char *oname = fwd->out[i].args[k];
      pe_tensor *o = ph_get(s, oname);
      pe_grad_name(oname, gname, sizeof gname);
      int j = -1;
      for (int q = 0; q < n_outs; q++)
        if (!strcmp(outs[q], oname)) j = q;
      if (o->dtype != PE_F32) continue;
      pe_tensor *g = set_raw(s, gname, PE_F32, o->shape, NULL);
      for (int64_t e = 0; e < pe_tensor_numel(g); e++)
        pe_f32(g)[e] = j < 0 ? 0.0f : (float)(0.5 + pe_rng_uniform(977 + (uint64_t)j, (uint64_t)e));
    }

  pe_grad_ctx g;
  pe_grad_ctx_init(&g, def, fwd);
  pe_status *st = def->grad(&g);
  for (int i = 0; !st && i < g.n_ops; i++) st = ph_run_op(s, g.ops[i], &rng);
  pe_grad_ctx_destroy(&g);
  if (st) return st;

  for (int w = 0; w < n_wrt; w++) {
    pe_tensor *x = ph_get(s, wrt[w]);
    pe_grad_name(wrt[w], gname, sizeof gname);
    pe_tensor *ga = ph_get(s, gname);
    if (!ga) return pe_error(PE_ENOGRAD, "grad of %s: %s not produced", fwd->type, gname);
    if (!pe_shape_equal(&ga->shape, &x->shape))
      return pe_error(PE_ESHAPE, "grad of %s: %s has wrong shape", fwd->type, gname);
    /* Copy analytic grads: forward re-runs below may not touch them, but be safe. */
    int64_t n = pe_tensor_numel(x);
    float *an = malloc((size_t)n * sizeof(float));
    memcpy(an, ga->data, (size_t)n * sizeof(float));
    int64_t step = (max_elems > 0 && n > max_elems) ? (n + max_elems - 1) / max_elems : 1;
    for (int64_t i = 0; i < n; i += step) {
      float *px = pe_f32(x);
      float orig = px[i];
      px[i] = (float)(orig + eps);
      rng = rng0;
      if ((st = ph_run_op(s, fwd, &rng))) break;
      double lp = weighted_loss(s, outs, n_outs);
      px = pe_f32(x);
      px[i] = (float)(orig - eps);
      rng = rng0;
      if ((st = ph_run_op(s, fwd, &rng))) break;
      double lm = weighted_loss(s, outs, n_outs);
      px = pe_f32(x);
      px[i] = orig;
      double num = (lp - lm) / (2 * eps), a = an[i];
      double err = fabs(a - num) / fmax(1.0, fmax(fabs(a), fabs(num)));
      rep->checked++;
      if (err > rep->max_err || rep->checked == 1) {
        if (err >= rep->max_err) {
          rep->max_err = err;
          rep->worst = wrt[w];
          rep->worst_index = i;
          rep->analytic = a;
          rep->numeric = num;
        }
      }
    }
    free(an);
    if (st) return st;
  }
  rng = rng0;
  return ph_run_op(s, fwd, &rng); /* leave forward outputs at the unperturbed point */
}
