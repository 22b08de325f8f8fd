/* Use-before-definition and cycle detection (validate.h's definition rule).
 *
 * A variable is defined at the start of a block when it is persistable, a
 * feed, or declared in an ancestor block (a control-flow sub-block reads its
 * parent's values); otherwise it is defined by the first op that writes it.
 * When op i reads a variable that is not yet defined, its first writer j
 * (j >= i) decides the kind of error: if j depends on i through data, the
 * program is cyclic (no order of its ops works); otherwise the ops are merely
 * out of order (use before definition). j == i (an op reading what only it
 * writes) is a cycle of length one.
 *
 * "Depends through data": a path i -> ... -> j where each step goes from an op
 * writing a variable to an op reading it. Variables defined at the start
 * (parameters, feeds) carry no such edges: reading a parameter reads its value
 * from before the run, whoever updates it later. This walk only runs once an
 * error is certain; it indexes the readers of each name, so that a large
 * program's error costs its size, not its size squared. */
#include <stdlib.h>
#include <string.h>

#include "compiler/validate_internal.h"

pe_status *pe_def_tracker_init(pe_def_tracker *t) {
  pe_strmap_init(&t->written);
  return NULL;
}

void pe_def_tracker_destroy(pe_def_tracker *t) {
  pe_strmap_destroy(&t->written);
}

pe_status *pe_def_tracker_write(pe_def_tracker *t, const pe_op_desc *op) {
  for (int s = 0; s < op->n_out; s++)
    for (int k = 0; k < op->out[s].n; k++)
      if (!pe_strmap_put(&t->written, op->out[s].args[k], t))
        return pe_error(PE_ENOMEM, "validate: out of memory");
  return NULL;
}

static bool defined_at_start(const pe_program *p, const pe_block *b, const char *name) {
  pe_var_scope_kind where;
  pe_var_desc *v = pe_program_resolve_var(p, b, name, &where);
  if (!v) return false;
  return v->persistable || v->is_feed || where == PE_VAR_ANCESTOR;
}

static bool op_writes(const pe_op_desc *op, const char *name) {
  for (int s = 0; s < op->n_out; s++)
    for (int k = 0; k < op->out[s].n; k++)
      if (strcmp(op->out[s].args[k], name) == 0) return true;
  return false;
}

/* The ops of a block that read one name, increasing; expanded once the
 * walk below has followed the name. */
typedef struct readers {
  int n, cap;
  int *ops;
  bool expanded;
} readers;

static void readers_free(pe_strmap *idx) {
  for (size_t i = 0; i < idx->cap; i++)
    if (idx->slots[i].key) {
      readers *r = idx->slots[i].value;
      free(r->ops);
      free(r);
    }
  pe_strmap_destroy(idx);
}

/* name -> its readers, for every input of b's ops. False on out of memory. */
static bool readers_index(const pe_block *b, pe_strmap *idx) {
  for (int y = 0; y < b->n_ops; y++) {
    const pe_op_desc *op = b->ops[y];
    for (int s = 0; s < op->n_in; s++)
      for (int k = 0; k < op->in[s].n; k++) {
        readers *r = pe_strmap_get(idx, op->in[s].args[k]);
        if (!r) {
          if (!(r = calloc(1, sizeof *r))) return false;
          if (!pe_strmap_put(idx, op->in[s].args[k], r)) {
            free(r);
            return false;
          }
        }
        if (r->n && r->ops[r->n - 1] == y) continue;
        if (r->n == r->cap) {
          int nc = r->cap ? 2 * r->cap : 4;
          int *no = realloc(r->ops, (size_t)nc * sizeof *no);
          if (!no) return false;
          r->ops = no;
          r->cap = nc;
        }
        r->ops[r->n++] = y;
      }
  }
  return true;
}

/* Does op `to` depend on op `from` through data? (from == to: yes.) A
 * breadth-first walk over the block's ops, each name's readers looked up
 * in an index: linear in the block's arguments. */
static bool depends_on(const pe_program *p, const pe_block *b, int from, int to) {
  if (from == to) return true;
  int n = b->n_ops;
  char *seen = calloc((size_t)n, 1);
  int *queue = malloc((size_t)n * sizeof(int));
  pe_strmap idx;
  pe_strmap_init(&idx);
  bool found = false;
  if (!seen || !queue || !readers_index(b, &idx)) goto out; /* out of memory: use-before-def */
  int head = 0, tail = 0;
  queue[tail++] = from;
  seen[from] = 1;
  while (head < tail && !found) {
    const pe_op_desc *x = b->ops[queue[head++]];
    for (int s = 0; s < x->n_out && !found; s++)
      for (int k = 0; k < x->out[s].n && !found; k++) {
        const char *v = x->out[s].args[k];
        readers *r = pe_strmap_get(&idx, v);
        if (!r || r->expanded || defined_at_start(p, b, v)) continue;
        r->expanded = true;
        for (int q = 0; q < r->n && !found; q++) {
          int y = r->ops[q];
          if (seen[y]) continue;
          if (y == to) found = true;
          seen[y] = 1;
          queue[tail++] = y;
        }
      }
  }
out:
  readers_free(&idx);
  free(seen);
  free(queue);
  return found;
}

pe_status *pe_def_tracker_check(pe_def_tracker *t, const pe_program *p, const pe_block *b, int i) {
  const pe_op_desc *op = b->ops[i];
  for (int s = 0; s < op->n_in; s++)
    for (int k = 0; k < op->in[s].n; k++) {
      const char *name = op->in[s].args[k];
      if (pe_strmap_has(&t->written, name) || defined_at_start(p, b, name)) continue;
      int j = -1;
      for (int q = i; q < b->n_ops && j < 0; q++)
        if (op_writes(b->ops[q], name)) j = q;
      if (j < 0)
        return pe_validate_op_error(
            b, i, op, PE_EUSE_BEFORE_DEF,
            "input %s '%s' is used before it is defined: no op of block %d writes it, and it is "
            "neither persistable nor a feed",
            op->in[s].name, name, b->idx);
      if (depends_on(p, b, i, j)) {
        if (j == i)
          return pe_validate_op_error(b, i, op, PE_ECYCLE,
                                      "input %s '%s' is only written by this op itself (cycle)",
                                      op->in[s].name, name);
        return pe_validate_op_error(
            b, i, op, PE_ECYCLE,
            "input %s '%s' is part of a cycle: its first writer op #%d (%s) depends on op #%d",
            op->in[s].name, name, j, b->ops[j]->type, i);
      }
      return pe_validate_op_error(
          b, i, op, PE_EUSE_BEFORE_DEF,
          "input %s '%s' is used before it is defined: its first writer is op #%d (%s), later in "
          "block %d",
          op->in[s].name, name, j, b->ops[j]->type, b->idx);
    }
  return NULL;
}
