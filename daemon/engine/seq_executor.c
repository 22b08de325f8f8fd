/* The sequential executor (seq_executor.h): the reference every other
 * executor is checked against.
 *
 * Compile binds every slot argument to a tensor once. Persistables live in
 * the model scope (created there and marked persistable when absent); every
 * other variable lives in the executor's local scope, a child of the model
 * scope, so two executors never share temporaries. Per op it keeps the row,
 * the tensor lists and meta lists laid out per row slot (what infer and the
 * kernel index by slot), the op's state slot, and ready-made infer/kernel
 * contexts. A run then does no allocation after the first run with a given
 * batch size and no name lookups besides matching feeds and fetches.
 *
 * Ownership: the executor owns the local scope, the per-op arrays, the op
 * states (freed with the row's state_free), the device ctx and the program
 * generator. It borrows the program (read-only, must outlive it) and the
 * model scope (unless it created one because none was given). */
#include "engine/seq_executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/validate.h"
#include "core/fpenv.h"
#include "engine/op_finite.h"
#include "engine/op_run.h"
#include "ops/registry.h"

typedef struct exec_op {
  const pe_op_def *def;
  const pe_op_desc *desc;
  pe_tensor_list *tl; /* [n_inputs + n_outputs]: inputs then outputs */
  pe_meta_list *ml;   /* same layout */
  pe_tensor **tensors;
  pe_meta *metas;
  pe_meta **mptrs;
  const char **names;
  int n_args;
  void *state;
  pe_infer_ctx ic;
  pe_kernel_ctx kc;
} exec_op;

typedef struct exec_feed {
  const pe_var_desc *var;
  pe_tensor *t;
} exec_feed;

struct pe_seq_exec {
  const pe_program *p;
  const pe_block *b;
  pe_scope *model;
  bool own_model;
  pe_scope *local;
  int n_ops;
  exec_op *ops;
  int n_feeds;
  exec_feed *feeds;
  pe_device_ctx dev;
  bool dev_init;
  bool keep_denormals; /* pe_exec_opts.keep_denormals */
  bool check_nan_inf;  /* pe_exec_opts.check_nan_inf */
  pe_rng own_rng;      /* the program generator unless opts->rng */
  pe_rng *rng;         /* the one drawn from: advances across runs */
};

/* --- compile ------------------------------------------------------------------ */

static pe_status *bind_var(pe_seq_exec *e, const char *name, int op_index, const char *type,
                           pe_tensor **out) {
  const pe_var_desc *v = pe_program_resolve_var(e->p, e->b, name, NULL);
  if (!v)
    return pe_error(PE_EUNKNOWN_VAR, "block %d: op #%d (%s): variable '%s' is not declared",
                    e->b->idx, op_index, type, name);
  pe_var *var;
  if (v->persistable) {
    PE_TRY(pe_scope_var(e->model, name, &var));
    var->persistable = true;
  } else {
    PE_TRY(pe_scope_var(e->local, name, &var));
  }
  *out = &var->t;
  return NULL;
}

static pe_status *compile_op(pe_seq_exec *e, int i) {
  exec_op *x = &e->ops[i];
  const pe_op_desc *op = e->b->ops[i];
  x->desc = op;
  x->def = pe_op_lookup(op->type);
  if (!x->def)
    return pe_error(PE_EUNKNOWN_OP, "block %d: op #%d: unknown op type '%s'", e->b->idx, i,
                    op->type);
  if (!x->def->kernel_cpu)
    return pe_error(PE_EUNKNOWN_OP, "block %d: op #%d (%s): no CPU kernel", e->b->idx, i, op->type);
  const pe_op_def *def = x->def;
  int nl = def->n_inputs + def->n_outputs;
  for (int s = 0; s < op->n_in; s++) x->n_args += op->in[s].n;
  for (int s = 0; s < op->n_out; s++) x->n_args += op->out[s].n;
  size_t na = (size_t)(x->n_args ? x->n_args : 1);
  x->tl = calloc((size_t)(nl ? nl : 1), sizeof(*x->tl));
  x->ml = calloc((size_t)(nl ? nl : 1), sizeof(*x->ml));
  x->tensors = calloc(na, sizeof(*x->tensors));
  x->metas = calloc(na, sizeof(*x->metas));
  x->mptrs = calloc(na, sizeof(*x->mptrs));
  x->names = calloc(na, sizeof(*x->names));
  if (!x->tl || !x->ml || !x->tensors || !x->metas || !x->mptrs || !x->names)
    return pe_error(PE_ENOMEM, "executor: out of memory");
  int at = 0;
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *slots = dir ? op->out : op->in;
    int n = dir ? op->n_out : op->n_in;
    for (int s = 0; s < n; s++) {
      int di = dir ? pe_op_output_index(def, slots[s].name) : pe_op_input_index(def, slots[s].name);
      if (di < 0)
        return pe_error(PE_EARITY, "block %d: op #%d (%s): unknown %s slot '%s'", e->b->idx, i,
                        op->type, dir ? "output" : "input", slots[s].name);
      int li = dir ? def->n_inputs + di : di;
      x->tl[li] = (pe_tensor_list){slots[s].n, &x->tensors[at]};
      x->ml[li] = (pe_meta_list){slots[s].n, &x->names[at], &x->mptrs[at]};
      for (int k = 0; k < slots[s].n; k++, at++) {
        PE_TRY(bind_var(e, slots[s].args[k], i, op->type, &x->tensors[at]));
        x->names[at] = slots[s].args[k];
        x->mptrs[at] = &x->metas[at];
      }
    }
  }
  x->ic = (pe_infer_ctx){def, op, i, true, x->ml, x->ml + def->n_inputs};
  x->kc = (pe_kernel_ctx){def,
                          op,
                          i,
                          x->tl,
                          x->tl + def->n_inputs,
                          &x->state,
                          (def->flags & PE_OP_RANDOM) ? e->rng : NULL,
                          &e->dev};
  return NULL;
}

static pe_status *compile_feeds(pe_seq_exec *e) {
  const pe_block *b = e->b;
  e->feeds = calloc((size_t)(b->n_vars ? b->n_vars : 1), sizeof(*e->feeds));
  if (!e->feeds) return pe_error(PE_ENOMEM, "executor: out of memory");
  for (int i = 0; i < b->n_vars; i++) {
    const pe_var_desc *v = b->vars[i];
    if (!v->is_feed) continue;
    pe_tensor *t = NULL;
    PE_TRY(bind_var(e, v->name, -1, "feed", &t));
    e->feeds[e->n_feeds++] = (exec_feed){v, t};
  }
  return NULL;
}

pe_status *pe_seq_exec_new(const pe_program *p, int block, pe_scope *model_scope,
                           const pe_exec_opts *opts, pe_seq_exec **out) {
  *out = NULL;
  if (block < 0 || block >= p->n_blocks)
    return pe_error(PE_EINVAL, "executor: block %d out of range (%d blocks)", block, p->n_blocks);
  pe_seq_exec *e = calloc(1, sizeof(*e));
  if (!e) return pe_error(PE_ENOMEM, "executor: out of memory");
  e->p = p;
  e->b = p->blocks[block];
  e->model = model_scope;
  if (!e->model) {
    e->model = pe_scope_new(NULL);
    e->own_model = true;
  }
  e->local = e->model ? pe_scope_new(e->model) : NULL;
  uint64_t seed = opts && opts->seed ? opts->seed : 1;
  pe_rng_init(&e->own_rng, seed);
  e->rng = opts && opts->rng ? opts->rng : &e->own_rng;
  e->keep_denormals = opts && opts->keep_denormals;
  e->check_nan_inf = opts && opts->check_nan_inf;
  pe_status *st = NULL;
  if (!e->model || !e->local) st = pe_error(PE_ENOMEM, "executor: out of memory");
  if (!st) st = pe_device_ctx_init(&e->dev, pe_cpu_place(), opts ? opts->threads : 0);
  if (!st) e->dev_init = true;
  if (!st && e->b->n_ops) {
    e->ops = calloc((size_t)e->b->n_ops, sizeof(*e->ops));
    if (!e->ops) st = pe_error(PE_ENOMEM, "executor: out of memory");
  }
  for (int i = 0; !st && i < e->b->n_ops; i++) {
    e->n_ops = i + 1; /* free() releases what compile_op built so far */
    st = compile_op(e, i);
  }
  if (!st) st = compile_feeds(e);
  if (st) {
    pe_seq_exec_free(e);
    return st;
  }
  *out = e;
  return NULL;
}

void pe_seq_exec_free(pe_seq_exec *e) {
  if (!e) return;
  for (int i = 0; i < e->n_ops; i++) {
    exec_op *x = &e->ops[i];
    if (x->state && x->def && x->def->state_free) x->def->state_free(x->state);
    free(x->tl);
    free(x->ml);
    free(x->tensors);
    free(x->metas);
    free(x->mptrs);
    free(x->names);
  }
  free(e->ops);
  free(e->feeds);
  pe_scope_free(e->local);
  if (e->own_model) pe_scope_free(e->model);
  if (e->dev_init) pe_device_ctx_destroy(&e->dev);
  free(e);
}

/* --- run -------------------------------------------------------------------------- */

static pe_status *load_feeds(pe_seq_exec *e, const pe_feed *feeds, int n_feeds) {
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  for (int f = 0; f < n_feeds; f++) {
    bool known = false;
    for (int j = 0; j < e->n_feeds && !known; j++)
      known = !strcmp(e->feeds[j].var->name, feeds[f].name);
    if (!known)
      return pe_error(PE_EUNKNOWN_VAR, "feed '%s' is not a feed variable of block %d",
                      feeds[f].name ? feeds[f].name : "(null)", e->b->idx);
  }
  for (int j = 0; j < e->n_feeds; j++) {
    const pe_var_desc *v = e->feeds[j].var;
    const pe_tensor *src = NULL;
    for (int f = 0; f < n_feeds && !src; f++)
      if (!strcmp(feeds[f].name, v->name)) src = feeds[f].t;
    if (!src)
      return pe_error(PE_EMISSING_FEED, "feed '%s' (%s %s) of block %d was not supplied", v->name,
                      pe_dtype_name(v->dtype), pe_shape_str(&v->shape, s1, sizeof s1), e->b->idx);
    if (src->dtype != v->dtype)
      return pe_error(PE_EDTYPE, "feed '%s': got %s %s, declared %s %s", v->name,
                      pe_dtype_name(src->dtype), pe_shape_str(&src->shape, s1, sizeof s1),
                      pe_dtype_name(v->dtype), pe_shape_str(&v->shape, s2, sizeof s2));
    bool shape_ok = v->shape.ndim == 0 || pe_shape_compatible(&v->shape, &src->shape);
    int64_t numel = pe_shape_numel(&src->shape);
    if (!shape_ok || numel < 0)
      return pe_error(PE_ESHAPE, "feed '%s': got shape %s, declared %s", v->name,
                      pe_shape_str(&src->shape, s1, sizeof s1),
                      pe_shape_str(&v->shape, s2, sizeof s2));
    if (numel > 0 && !src->data)
      return pe_error(PE_EINVAL, "feed '%s': tensor %s has no data", v->name,
                      pe_shape_str(&src->shape, s1, sizeof s1));
    if (e->check_nan_inf) PE_TRY(pe_feed_check_finite(v->name, src, ""));
    PE_TRY(pe_tensor_copy(e->feeds[j].t, src, v->name));
  }
  return NULL;
}

/* Prefix an op's failure with where it happened, without repeating the
 * "op #i (type)" that pe_infer_error / pe_kernel_error already put there. */
static pe_status *op_failed(const pe_seq_exec *e, int i, pe_status *st) {
  char prefix[160];
  int n = snprintf(prefix, sizeof prefix, "op #%d (%s)", i, e->ops[i].desc->type);
  if (n > 0 && (size_t)n < sizeof prefix && strncmp(pe_status_msg(st), prefix, (size_t)n) == 0)
    return pe_status_wrap(st, "run block %d", e->b->idx);
  return pe_status_wrap(st, "run block %d: %s", e->b->idx, prefix);
}

static pe_status *run_op(pe_seq_exec *e, int i) {
  exec_op *x = &e->ops[i];
  return pe_op_run(x->def, x->def->kernel_cpu, x->tl, x->ml, &x->ic, &x->kc, NULL,
                   e->check_nan_inf);
}

static pe_status *run_block(pe_seq_exec *e, const pe_feed *feeds, int n_feeds,
                            const char *const *fetch, int n_fetch, const pe_tensor **fetched) {
  if (n_feeds < 0 || n_fetch < 0 || (n_feeds && !feeds) || (n_fetch && (!fetch || !fetched)))
    return pe_error(PE_EINVAL, "executor: bad feed/fetch arguments");
  for (int f = 0; f < n_feeds; f++)
    if (!feeds[f].name || !feeds[f].t)
      return pe_error(PE_EINVAL, "executor: feed %d has no name or tensor", f);
  pe_device_ctx_bind(&e->dev);
  PE_TRY(load_feeds(e, feeds, n_feeds));
  for (int i = 0; i < e->n_ops; i++) {
    pe_status *st = run_op(e, i);
    if (st) return op_failed(e, i, st);
  }
  for (int f = 0; f < n_fetch; f++) {
    pe_var *v = fetch[f] ? pe_scope_find(e->local, fetch[f]) : NULL;
    if (!v) {
      PE_TRY(pe_fetch_fused_error(e->p, e->b, fetch[f]));
      return pe_error(PE_EUNKNOWN_VAR, "fetch '%s' is not a variable of block %d",
                      fetch[f] ? fetch[f] : "(null)", e->b->idx);
    }
    fetched[f] = &v->t;
  }
  return NULL;
}

/* Kernels run on the caller's thread: flush denormals for the run only and
 * give the caller back its own setting (core/fpenv.h: a dead unit's
 * momentum decays into denormals, which x86 processes in microcode). */
pe_status *pe_seq_exec_run(pe_seq_exec *e, const pe_feed *feeds, int n_feeds,
                           const char *const *fetch, int n_fetch, const pe_tensor **fetched) {
  if (e->keep_denormals) return run_block(e, feeds, n_feeds, fetch, n_fetch, fetched);
  pe_fpenv_state saved = pe_fpenv_save();
  pe_fpenv_flush_denormals(true);
  pe_status *st = run_block(e, feeds, n_feeds, fetch, n_fetch, fetched);
  pe_fpenv_restore(saved);
  return st;
}
