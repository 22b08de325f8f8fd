/* The op-fusion passes' shared index and questions (pass_fuse.h).
 *
 * The uses of one name in the block are indexed once, so that each
 * question a pass asks costs the name's uses, not a scan of the block
 * (which made a 48k-op program's register take minutes). The counts follow
 * every fusion; the op lists are never updated: they are searched only
 * after the op being fused, where each op is as built or dead. */
#include "compiler/pass_fuse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/registry.h"

typedef struct name_uses {
  int n_w, n_r;  /* live args writing / reading the name */
  int64_t sum_r; /* sum of the reading ops' indexes: the reader when n_r == 1 */
  int n_ops, cap_ops;
  int *ops; /* ops using it as built, increasing */
} name_uses;

static pe_status *oom(const pe_fuse_ctx *f) {
  return pe_error(PE_ENOMEM, "%s: out of memory", f->pass);
}

/* How many args of op name `name` among its inputs (or outputs). */
static int op_uses(const pe_op_desc *op, const char *name, bool writes) {
  int n = 0, ns = writes ? op->n_out : op->n_in;
  const pe_slot *sl = writes ? op->out : op->in;
  for (int s = 0; s < ns; s++)
    for (int a = 0; a < sl[s].n; a++) n += strcmp(sl[s].args[a], name) == 0;
  return n;
}

static name_uses *uses_get(pe_fuse_ctx *f, const char *name) {
  name_uses *u = pe_strmap_get(&f->uses, name);
  if (u) return u;
  u = calloc(1, sizeof *u);
  if (u && !pe_strmap_put(&f->uses, name, u)) {
    free(u);
    u = NULL;
  }
  return u;
}

/* Count op i's args into the index (sign 1) or out of it (-1); build also
 * lists op i under each name. False on out of memory. */
static bool index_op(pe_fuse_ctx *f, int i, int sign, bool build) {
  const pe_op_desc *op = f->b->ops[i];
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *sl = dir ? op->out : op->in;
    for (int s = 0; s < (dir ? op->n_out : op->n_in); s++)
      for (int a = 0; a < sl[s].n; a++) {
        name_uses *u = uses_get(f, sl[s].args[a]);
        if (!u) return false;
        if (dir) {
          u->n_w += sign;
        } else {
          u->n_r += sign;
          u->sum_r += sign * (int64_t)i;
        }
        if (!build || (u->n_ops && u->ops[u->n_ops - 1] == i)) continue;
        if (u->n_ops == u->cap_ops) {
          int nc = u->cap_ops ? 2 * u->cap_ops : 4;
          int *no = realloc(u->ops, (size_t)nc * sizeof *no);
          if (!no) return false;
          u->ops = no;
          u->cap_ops = nc;
        }
        u->ops[u->n_ops++] = i;
      }
  }
  return true;
}

static void index_free(pe_fuse_ctx *f) {
  for (size_t i = 0; i < f->uses.cap; i++)
    if (f->uses.slots[i].key) {
      name_uses *u = f->uses.slots[i].value;
      free(u->ops);
      free(u);
    }
  pe_strmap_destroy(&f->uses);
  free(f->dead);
}

static bool kept(const pe_fuse_ctx *f, const char *name) {
  return pe_strmap_has(&f->keep, name);
}

/* f->keep from the loss and the keep list: one lookup per question, as
 * the list may be as long as the program. False on out of memory. */
static bool index_keep(pe_fuse_ctx *f) {
  const char *loss = f->o && f->o->loss ? f->o->loss : f->p->loss;
  if (loss && !pe_strmap_put(&f->keep, loss, NULL)) return false;
  for (int k = 0; f->o && k < f->o->n_keep; k++)
    if (f->o->keep[k] && !pe_strmap_put(&f->keep, f->o->keep[k], NULL)) return false;
  return true;
}

const char *pe_fuse_arg1(const pe_slot *s) {
  return s && s->n == 1 ? s->args[0] : NULL;
}

int pe_fuse_sole_reader(const pe_fuse_ctx *f, const char *name) {
  const pe_var_desc *v = pe_block_find_var_local(f->b, name);
  if (!v || v->dtype != PE_F32 || v->persistable || v->is_feed || kept(f, name)) return -1;
  const name_uses *u = pe_strmap_get(&f->uses, name);
  return u && u->n_w == 1 && u->n_r == 1 ? (int)u->sum_r : -1;
}

bool pe_fuse_used_between(const pe_fuse_ctx *f, const char *name, int from, int to, bool reads) {
  const name_uses *u = pe_strmap_get(&f->uses, name);
  if (!u) return false;
  int lo = 0, hi = u->n_ops; /* the first listed op after from */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (u->ops[mid] <= from)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (int k = lo; k < u->n_ops && u->ops[k] < to; k++) {
    const pe_op_desc *op = f->b->ops[u->ops[k]];
    if (!f->dead[u->ops[k]] && (op_uses(op, name, true) || (reads && op_uses(op, name, false))))
      return true;
  }
  return false;
}

int pe_fuse_relu_after(const pe_fuse_ctx *f, int i, const char *t) {
  int k = pe_fuse_sole_reader(f, t);
  const pe_op_desc *relu = k > i ? f->b->ops[k] : NULL;
  if (!relu || strcmp(relu->type, "relu") != 0) return -1;
  const char *rx = pe_fuse_arg1(pe_op_find_input(relu, "X"));
  const char *out = pe_fuse_arg1(pe_op_find_output(relu, "Out"));
  if (!rx || strcmp(rx, t) != 0 || !out || pe_fuse_used_between(f, out, i, k, true)) return -1;
  return k;
}

pe_status *pe_fuse_note(pe_fuse_ctx *f, const char *name, const pe_op_desc *op, const char *out,
                        const char *what) {
  pe_var_desc *v = pe_block_find_var_local(f->b, name);
  if (!v) return NULL;
  char buf[256];
  snprintf(buf, sizeof buf, "%s writing '%.64s' (%s)", op->type, out, what);
  free(v->fused_into);
  if (!(v->fused_into = strdup(buf))) return oom(f);
  return NULL;
}

/* Uncounting finds every name indexed: it cannot fail. */
void pe_fuse_absorb(pe_fuse_ctx *f, int i, const int *absorbed, int n) {
  index_op(f, i, -1, false);
  for (int a = 0; a < n; a++)
    if (absorbed[a] >= 0) {
      index_op(f, absorbed[a], -1, false);
      f->dead[absorbed[a]] = true;
    }
}

pe_status *pe_fuse_recount(pe_fuse_ctx *f, int i) {
  return index_op(f, i, 1, false) ? NULL : oom(f);
}

/* Drop the dead ops, keeping the order. */
static void compact(pe_fuse_ctx *f) {
  pe_block *b = f->b;
  int w = 0;
  for (int i = 0; i < b->n_ops; i++) {
    if (f->dead[i])
      pe_op_desc_free(b->ops[i]);
    else
      b->ops[w++] = b->ops[i];
  }
  b->n_ops = w;
}

pe_status *pe_fuse_run(pe_ir *ir, const char *pass, pe_fuse_at_fn at, int *counts) {
  const pe_pass_opts *o = ir->opts;
  if (!o || !o->fuse_conv_act || o->place_kind == PE_PLACE_CUDA) return NULL;
  pe_program *p = ir->prog;
  pe_block *b = pe_program_main(p);
  if (!b || p->n_blocks > 2) return NULL;
  pe_fuse_ctx f = {p, b, o, pass};
  pe_strmap_init(&f.uses);
  pe_strmap_init(&f.keep);
  f.dead = calloc((size_t)b->n_ops + 1, sizeof *f.dead);
  pe_status *st = f.dead && index_keep(&f) ? NULL : oom(&f);
  for (int i = 0; i < b->n_ops && !st; i++)
    if (!index_op(&f, i, 1, true)) st = oom(&f);
  /* at marks ops after i dead only. */
  for (int i = 0; i < b->n_ops && !st; i++)
    if (!f.dead[i]) st = at(&f, i, counts);
  if (f.dead) compact(&f);
  index_free(&f);
  pe_strmap_destroy(&f.keep);
  return st;
}
