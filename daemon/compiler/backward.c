/* The backward pass: append gradient ops for the loss to the main block.
 *
 * 1. Forward reachability. Trainable leaves are float variables that are
 *    persistable or feeds and not stop_gradient. An op is "active" when one of
 *    its differentiable inputs (slot not PE_SLOT_NO_GRAD) is reachable; its
 *    float, non-stop_gradient outputs become reachable. Ops flagged
 *    PE_OP_NO_GRAD (metrics, creation, optimizers) stop the flow.
 * 2. Relevance. Walking back from the loss, an active op that writes a
 *    relevant variable is on the gradient path, and its reachable
 *    differentiable inputs become relevant. Everything else (labels,
 *    stop_gradient inputs, branches that do not reach the loss) is pruned.
 *    A relevant variable written twice on the path (in-place update, reuse of
 *    a name) would make name@GRAD ambiguous, so it is rejected.
 * 3. Generation. fill_constant writes loss@GRAD = 1 (the loss's shape); then,
 *    in reverse program order, each path op's gradient maker runs. Its
 *    "S@GRAD" outputs for irrelevant S are dropped (slot left with zero
 *    args); its "O@GRAD" inputs that no earlier grad op produced are dropped
 *    (kernels treat them as zeros). In a multi-argument slot, where dropping
 *    one argument would shift the others, a dropped output is written to a
 *    private "x@GRAD@DISCARD@n" instead and a missing input is replaced by
 *    "x@GRAD@ZERO" = scale(x, 0).
 * 4. Accumulation. A gradient written by more than one grad op (a variable
 *    read by several ops, or twice by one) is written to x@GRAD@RENAME@k by
 *    its k-th writer, and a sum op after the last writer produces x@GRAD.
 *    Consumers of x@GRAD are grad ops of x's writer, which come later.
 *    A sparse gradient (registry.h, PE_ROWS_SUFFIX) is not summed: one
 *    written twice is an error naming the variable.
 * 5. Every new variable is declared in the main block: dtype and shape of its
 *    forward variable (undeclared intermediates of custom makers, and a
 *    sparse gradient and its rows, whose row count is the batch's, are left
 *    to inference).
 * All walks follow program order and counters, so the output is
 * deterministic. The block is only modified once every grad op exists. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pass.h"
#include "ops/registry.h"

typedef struct op_list {
  int n, cap;
  pe_op_desc **v;
} op_list;

typedef struct bw {
  pe_program *p;
  pe_block *b;
  const char *loss;
  int n_fwd;
  char *active, *on_path; /* [n_fwd] */
  pe_strmap reach;        /* reachable from a trainable leaf */
  pe_strmap rel;          /* gradient needed (relevant to the loss) */
  pe_strmap produced;     /* grad names written so far -> producer count */
  pe_strmap zeros;        /* forward names with an @GRAD@ZERO op already made */
  op_list out;            /* grad ops in final order */
  int discard_seq;
} bw;

#define OOM() pe_error(PE_ENOMEM, "backward: out of memory")
#define SUFFIX PE_GRAD_SUFFIX
#define SUFFIX_LEN (sizeof(SUFFIX) - 1)

static pe_status *list_push(op_list *l, pe_op_desc *op) {
  if (l->n == l->cap) {
    int nc = l->cap ? l->cap * 2 : 32;
    pe_op_desc **nv = realloc(l->v, (size_t)nc * sizeof(*nv));
    if (!nv) return OOM();
    l->v = nv;
    l->cap = nc;
  }
  l->v[l->n++] = op;
  return NULL;
}

static void list_free(op_list *l) {
  for (int i = 0; i < l->n; i++) pe_op_desc_free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof(*l));
}

/* malloc'd "<a><b><n>" (n < 0: omitted). */
static char *name_join(const char *a, const char *b, int n) {
  size_t len = strlen(a) + strlen(b) + 16;
  char *s = malloc(len);
  if (!s) return NULL;
  if (n >= 0)
    snprintf(s, len, "%s%s%d", a, b, n);
  else
    snprintf(s, len, "%s%s", a, b);
  return s;
}

static bool is_float(pe_dtype dt) {
  return dt == PE_F32 || dt == PE_F64 || dt == PE_F16;
}

static bool differentiable_var(const bw *w, const char *name) {
  const pe_var_desc *v = pe_block_find_var(w->p, w->b, name);
  return v && is_float(v->dtype) && !v->stop_gradient;
}

static bool slot_differentiable(const pe_op_def *def, const char *slot) {
  int di = pe_op_input_index(def, slot);
  return di < 0 || !(def->inputs[di].flags & PE_SLOT_NO_GRAD);
}

/* Base name of "x@GRAD" (into buf); NULL if arg is not a plain grad name. */
static const char *grad_base(const char *arg, char *buf, size_t len) {
  size_t n = strlen(arg);
  if (n <= SUFFIX_LEN || strcmp(arg + n - SUFFIX_LEN, SUFFIX) != 0) return NULL;
  snprintf(buf, len, "%.*s", (int)(n - SUFFIX_LEN), arg);
  return buf;
}

static pe_status *mark(pe_strmap *m, const char *name) {
  return pe_strmap_put(m, name, (void *)1) ? NULL : OOM();
}

/* --- 1 + 2: which ops are on the gradient path ----------------------------- */

static pe_status *find_path(bw *w) {
  pe_block *b = w->b;
  for (int i = 0; i < b->n_vars; i++) {
    const pe_var_desc *v = b->vars[i];
    if ((v->persistable || v->is_feed) && differentiable_var(w, v->name))
      PE_TRY(mark(&w->reach, v->name));
  }
  for (int i = 0; i < w->n_fwd; i++) {
    const pe_op_desc *op = b->ops[i];
    const pe_op_def *def = pe_op_lookup(op->type);
    if (!def) return pe_error(PE_EUNKNOWN_OP, "backward: op #%d: unknown op '%s'", i, op->type);
    if (def->flags & PE_OP_NO_GRAD) continue;
    for (int s = 0; s < op->n_in && !w->active[i]; s++)
      if (slot_differentiable(def, op->in[s].name))
        for (int k = 0; k < op->in[s].n; k++)
          if (pe_strmap_has(&w->reach, op->in[s].args[k])) w->active[i] = 1;
    if (!w->active[i]) continue;
    for (int s = 0; s < op->n_out; s++)
      for (int k = 0; k < op->out[s].n; k++)
        if (differentiable_var(w, op->out[s].args[k])) PE_TRY(mark(&w->reach, op->out[s].args[k]));
  }
  if (!pe_strmap_has(&w->reach, w->loss))
    return pe_error(PE_ENOGRAD,
                    "backward: loss '%s' does not depend on any trainable variable (a float "
                    "persistable or feed that is not stop_gradient)",
                    w->loss);

  pe_strmap writer; /* relevant var -> 1 + index of its path writer */
  pe_strmap_init(&writer);
  pe_status *st = mark(&w->rel, w->loss);
  for (int i = w->n_fwd - 1; !st && i >= 0; i--) {
    if (!w->active[i]) continue;
    const pe_op_desc *op = b->ops[i];
    for (int s = 0; s < op->n_out && !w->on_path[i]; s++)
      for (int k = 0; k < op->out[s].n; k++)
        if (pe_strmap_has(&w->rel, op->out[s].args[k])) w->on_path[i] = 1;
    if (!w->on_path[i]) continue;
    for (int s = 0; !st && s < op->n_out; s++)
      for (int k = 0; !st && k < op->out[s].n; k++) {
        const char *v = op->out[s].args[k];
        if (!pe_strmap_has(&w->rel, v)) continue;
        intptr_t prev = (intptr_t)pe_strmap_get(&writer, v);
        if (prev && prev - 1 != i)
          st = pe_error(PE_EINVAL,
                        "backward: variable '%s' on the gradient path is written by op #%d (%s) "
                        "and op #%d (%s); give each write its own variable",
                        v, i, op->type, (int)(prev - 1), b->ops[prev - 1]->type);
        else if (!pe_strmap_put(&writer, v, (void *)(intptr_t)(i + 1)))
          st = OOM();
      }
    const pe_op_def *def = pe_op_lookup(op->type);
    for (int s = 0; !st && s < op->n_in; s++) {
      if (!slot_differentiable(def, op->in[s].name)) continue;
      for (int k = 0; !st && k < op->in[s].n; k++) {
        const char *v = op->in[s].args[k];
        if (!pe_strmap_has(&w->reach, v)) continue;
        if (pe_strmap_get(&writer, v) == (void *)(intptr_t)(i + 1))
          st = pe_error(PE_EINVAL,
                        "backward: op #%d (%s) reads and writes '%s' on the gradient path "
                        "(in-place); write a new variable instead",
                        i, op->type, v);
        else
          st = mark(&w->rel, v);
      }
    }
  }
  pe_strmap_destroy(&writer);
  return st;
}

/* --- 3: grad ops -------------------------------------------------------------- */

static pe_status *make_zero(bw *w, const char *base, const char *zname) {
  if (pe_strmap_has(&w->zeros, base)) return NULL;
  pe_op_desc *z = pe_op_desc_new("scale");
  if (!z) return OOM();
  pe_status *st = list_push(&w->out, z);
  if (st) {
    pe_op_desc_free(z);
    return st;
  }
  PE_TRY(pe_op_input1(z, "X", base));
  PE_TRY(pe_op_output1(z, "Out", zname));
  PE_TRY(pe_op_set_float(z, "scale", 0.0f));
  PE_TRY(pe_op_set_float(z, "bias", 0.0f));
  return mark(&w->zeros, base);
}

/* Drop "O@GRAD" inputs nobody produced (see the header comment). */
static pe_status *fix_inputs(bw *w, pe_op_desc *op) {
  char base[512];
  for (int s = 0; s < op->n_in; s++) {
    pe_slot *sl = &op->in[s];
    int present = 0, grads = 0;
    for (int k = 0; k < sl->n; k++) {
      if (!grad_base(sl->args[k], base, sizeof base)) continue;
      grads++;
      present += pe_strmap_has(&w->produced, sl->args[k]);
    }
    if (grads == 0 || present == grads) continue;
    if (present == 0 && grads == sl->n) {
      PE_TRY(pe_op_set_input(op, sl->name, 0, NULL));
      continue;
    }
    for (int k = 0; k < sl->n; k++) {
      if (!grad_base(sl->args[k], base, sizeof base) || pe_strmap_has(&w->produced, sl->args[k]))
        continue;
      char *z = name_join(sl->args[k], "@ZERO", -1);
      if (!z) return OOM();
      pe_status *st = make_zero(w, base, z);
      free(sl->args[k]);
      sl->args[k] = z;
      PE_TRY(st);
    }
  }
  return NULL;
}

/* Drop "S@GRAD" outputs whose S is not relevant; record the rest. */
static pe_status *fix_outputs(bw *w, pe_op_desc *op) {
  char base[512];
  for (int s = 0; s < op->n_out; s++) {
    pe_slot *sl = &op->out[s];
    int keep = 0, grads = 0;
    for (int k = 0; k < sl->n; k++) {
      if (!grad_base(sl->args[k], base, sizeof base)) continue;
      grads++;
      keep += pe_strmap_has(&w->rel, base);
    }
    if (grads && keep == 0 && grads == sl->n) {
      PE_TRY(pe_op_set_output(op, sl->name, 0, NULL));
      continue;
    }
    for (int k = 0; k < sl->n; k++) {
      if (!grad_base(sl->args[k], base, sizeof base)) continue;
      if (!pe_strmap_has(&w->rel, base)) {
        char *d = name_join(sl->args[k], "@DISCARD@", w->discard_seq++);
        if (!d) return OOM();
        free(sl->args[k]);
        sl->args[k] = d;
        continue;
      }
      intptr_t c = (intptr_t)pe_strmap_get(&w->produced, sl->args[k]);
      if (!pe_strmap_put(&w->produced, sl->args[k], (void *)(c + 1))) return OOM();
    }
  }
  return NULL;
}

static pe_status *seed_loss_grad(bw *w) {
  const pe_var_desc *lv = pe_block_find_var(w->p, w->b, w->loss);
  char sb[PE_SHAPE_STRLEN];
  if (lv->shape.ndim == 0 || pe_shape_numel(&lv->shape) < 0)
    return pe_error(PE_ESHAPE,
                    "backward: loss '%s' has shape %s; it needs a static shape (reduce it with "
                    "mean)",
                    w->loss, pe_shape_str(&lv->shape, sb, sizeof sb));
  pe_op_desc *f = pe_op_desc_new("fill_constant");
  if (!f) return OOM();
  pe_status *st = list_push(&w->out, f);
  if (st) {
    pe_op_desc_free(f);
    return st;
  }
  char *g = name_join(w->loss, SUFFIX, -1);
  if (!g) return OOM();
  st = pe_op_output1(f, "Out", g);
  if (!st) st = pe_op_set_ints(f, "shape", lv->shape.ndim, lv->shape.d);
  if (!st) st = pe_op_set_float(f, "value", 1.0f);
  if (!st) st = pe_op_set_int(f, "dtype", (int64_t)lv->dtype);
  if (!st && !pe_strmap_put(&w->produced, g, (void *)1)) st = OOM();
  free(g);
  return st;
}

static pe_status *make_grad_ops(bw *w) {
  PE_TRY(seed_loss_grad(w));
  for (int i = w->n_fwd - 1; i >= 0; i--) {
    if (!w->on_path[i]) continue;
    const pe_op_desc *op = w->b->ops[i];
    const pe_op_def *def = pe_op_lookup(op->type);
    if (!def->grad)
      return pe_error(PE_ENOGRAD,
                      "backward: op #%d (%s) is on the path to loss '%s' but has no gradient", i,
                      op->type, w->loss);
    pe_grad_ctx g;
    pe_grad_ctx_init(&g, def, op);
    pe_status *st = def->grad(&g);
    if (st) st = pe_status_wrap(st, "backward: gradient of op #%d (%s)", i, op->type);
    for (int k = 0; !st && k < g.n_ops; k++)
      if (!pe_op_lookup(g.ops[k]->type))
        st = pe_error(PE_ENOGRAD, "backward: gradient op '%s' of op #%d (%s) is not registered",
                      g.ops[k]->type, i, op->type);
    /* Take the ops one by one so that the ctx frees only what is left. */
    int k = 0;
    for (; !st && k < g.n_ops; k++) {
      pe_op_desc *gop = g.ops[k];
      st = fix_inputs(w, gop);
      if (!st) st = fix_outputs(w, gop);
      if (!st) st = list_push(&w->out, gop);
      if (!st) g.ops[k] = NULL;
    }
    pe_grad_ctx_destroy(&g); /* frees the ops not taken (NULLs are skipped) */
    PE_TRY(st);
  }
  return NULL;
}

/* --- 4: accumulate multiply-written gradients ------------------------------------ */

static pe_status *accumulate(bw *w) {
  pe_strmap seen; /* grad name -> occurrences renamed so far */
  pe_strmap_init(&seen);
  op_list res = {0};
  pe_status *st = NULL;
  int i = 0;
  for (; !st && i < w->out.n; i++) {
    pe_op_desc *op = w->out.v[i];
    st = list_push(&res, op);
    if (st) break;
    w->out.v[i] = NULL;
    for (int s = 0; !st && s < op->n_out; s++)
      for (int k = 0; !st && k < op->out[s].n; k++) {
        char *g = op->out[s].args[k];
        intptr_t total = (intptr_t)pe_strmap_get(&w->produced, g);
        if (total < 2) continue;
        if (pe_op_sparse_rows(op, g)) {
          st = pe_error(PE_EINVAL,
                        "backward: '%s' is a sparse gradient (%s with is_sparse) but %d ops "
                        "write it (the variable is read by several ops); sparse gradients are not "
                        "summed: set is_sparse false",
                        g, op->type, (int)total);
          break;
        }
        intptr_t nth = (intptr_t)pe_strmap_get(&seen, g);
        char *r = name_join(g, "@RENAME@", (int)nth);
        if (!r || !pe_strmap_put(&seen, g, (void *)(nth + 1))) {
          free(r);
          st = OOM();
          break;
        }
        op->out[s].args[k] = r;
        if (nth + 1 == total) {
          /* Last writer: sum the renamed parts into g, right after this op. */
          char **parts = calloc((size_t)total, sizeof(char *));
          pe_op_desc *sum = pe_op_desc_new("sum");
          for (intptr_t q = 0; parts && q < total; q++) parts[q] = name_join(g, "@RENAME@", (int)q);
          if (!parts || !sum) st = OOM();
          for (intptr_t q = 0; !st && q < total; q++)
            if (!parts[q]) st = OOM();
          if (!st) st = pe_op_set_input(sum, "X", (int)total, (const char *const *)parts);
          if (!st) st = pe_op_output1(sum, "Out", g);
          /* res ends with this op: the sum goes right behind it. */
          if (!st)
            st = list_push(&res, sum);
          else
            pe_op_desc_free(sum);
          for (intptr_t q = 0; parts && q < total; q++) free(parts[q]);
          free(parts);
        }
        free(g);
      }
  }
  /* On failure, ops not yet moved stay in w->out; moved slots are NULL. */
  list_free(&w->out);
  w->out = res;
  pe_strmap_destroy(&seen);
  return st;
}

/* --- 5: declare and append ------------------------------------------------------ */

static pe_status *declare_outputs(bw *w, const pe_op_desc *op) {
  for (int s = 0; s < op->n_out; s++)
    for (int k = 0; k < op->out[s].n; k++) {
      const char *name = op->out[s].args[k];
      if (pe_block_find_var(w->p, w->b, name)) continue;
      if (pe_is_sparse_rows_name(name) || pe_op_sparse_rows(op, name)) {
        pe_var_desc *v;
        PE_TRY(pe_block_add_var(w->b, name, PE_F32, NULL, &v)); /* inference sets both */
        v->stop_gradient = true;
        continue;
      }
      const char *at = strstr(name, SUFFIX);
      const pe_var_desc *fwd = NULL;
      if (at) {
        char base[512];
        snprintf(base, sizeof base, "%.*s", (int)(at - name), name);
        fwd = pe_block_find_var(w->p, w->b, base);
      }
      pe_var_desc *v;
      PE_TRY(pe_block_add_var(w->b, name, fwd ? fwd->dtype : PE_F32, fwd ? &fwd->shape : NULL, &v));
      v->stop_gradient = true;
    }
  return NULL;
}

static pe_status *append_all(bw *w) {
  for (int i = 0; i < w->out.n; i++) PE_TRY(declare_outputs(w, w->out.v[i]));
  for (int i = 0; i < w->out.n; i++) {
    pe_op_desc *slot;
    PE_TRY(pe_block_append_op(w->b, "x", &slot));
    pe_op_desc_free(slot);
    w->b->ops[w->b->n_ops - 1] = w->out.v[i];
    w->out.v[i] = NULL;
  }
  w->out.n = 0;
  return NULL;
}

pe_status *pe_pass_backward(pe_ir *ir) {
  pe_program *p = ir->prog;
  const pe_pass_opts *o = ir->opts;
  const char *loss = o && o->loss ? o->loss : p->loss;
  if (!loss) return pe_error(PE_EINVAL, "backward: the program has no loss");
  pe_block *b = pe_program_main(p);
  if (!b) return pe_error(PE_EINVAL, "backward: no main block");
  const pe_var_desc *lv = pe_block_find_var(p, b, loss);
  if (!lv) return pe_error(PE_EUNKNOWN_VAR, "backward: loss '%s' is not declared", loss);
  if (!is_float(lv->dtype))
    return pe_error(PE_EDTYPE, "backward: loss '%s' has dtype %s, expected a float type", loss,
                    pe_dtype_name(lv->dtype));
  char gname[512];
  snprintf(gname, sizeof gname, "%s" SUFFIX, loss);
  if (pe_block_find_var(p, b, gname))
    return pe_error(PE_EINVAL, "backward: '%s' already exists (backward ran twice?)", gname);

  bw w = {.p = p, .b = b, .loss = loss, .n_fwd = b->n_ops};
  pe_strmap_init(&w.reach);
  pe_strmap_init(&w.rel);
  pe_strmap_init(&w.produced);
  pe_strmap_init(&w.zeros);
  w.active = calloc((size_t)b->n_ops + 1, 1);
  w.on_path = calloc((size_t)b->n_ops + 1, 1);
  pe_status *st = (!w.active || !w.on_path) ? OOM() : NULL;
  if (!st) st = find_path(&w);
  if (!st) st = make_grad_ops(&w);
  if (!st) st = accumulate(&w);
  if (!st) st = append_all(&w);
  list_free(&w.out);
  free(w.active);
  free(w.on_path);
  pe_strmap_destroy(&w.reach);
  pe_strmap_destroy(&w.rel);
  pe_strmap_destroy(&w.produced);
  pe_strmap_destroy(&w.zeros);
  return st;
}
