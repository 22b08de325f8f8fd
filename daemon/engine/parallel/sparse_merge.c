/* The sparse_merge node (PE_NODE_SPARSE_MERGE, graph.h): one sparse
 * gradient (registry.h, PE_ROWS_SUFFIX) merged across the places, as
 * Paddle merges SelectedRows: no dense gradient is formed.
 *
 * Each place holds values [n_p, ...] and rows [n_p] (i64, ascending,
 * distinct, -1 after the last). The merge walks the places' rows together
 * in id order; a row several places hold gets the sum of their values in
 * place order, the order of every cpu/sim all-reduce (par_sum_block). A row
 * a place does not hold is 0 in its dense gradient and x + 0 is x, so the
 * merged values are, bit for bit, the dense all-reduce's sums on those rows
 * (whatever the strategy: every one uses this node), and the dense sums
 * are 0 on every other row. The result, M rows, is sized [M, ...] and [M]
 * into the outputs: every place's (in place) or the owner's.
 *
 * One chunk (par_coll_run, or the root's comm stream on sim): the merge
 * reads every place's gradient before any output is resized, through the
 * node's scratch (kept across runs). A place with no sample holds [0, ...]
 * and [0] (par_zero_grads).
 *
 * Threads: the node's one chunk, on one thread. */
#include <stdlib.h>
#include <string.h>

#include "engine/op_run.h"
#include "engine/parallel/executor_internal.h"

struct par_sparse {
  float *vals;   /* merged values, [cap_rows * width] */
  int64_t *rows; /* merged rows, [cap_rows] */
  int64_t cap_rows;
};

pe_status *par_sparse_compile(pe_par_exec *e, xnode *x) {
  const pe_graph_node *n = x->n;
  int np = e->n_places, outs = n->root >= 0 ? 1 : np;
  if (n->width != 2 || n->n_in_lv != 2 * np || n->n_out_lv != 2 * outs || n->root >= np)
    return pe_error(PE_EINTERNAL, "node %d %s: malformed sparse_merge (%d inputs, %d outputs)",
                    x->id, n->name, n->n_in_lv, n->n_out_lv);
  x->sparse = calloc(1, sizeof(*x->sparse));
  return x->sparse ? NULL : pe_error(PE_ENOMEM, "parallel executor: out of memory");
}

void par_sparse_free(xnode *x) {
  if (!x->sparse) return;
  free(x->sparse->vals);
  free(x->sparse->rows);
  free(x->sparse);
  x->sparse = NULL;
}

/* Place p's values and rows agree with each other and with place 0's row
 * shape; *width = elements per row. Metadata only. */
static pe_status *check_place(const xnode *x, int p, int64_t *width) {
  const pe_graph *g = x->e->g;
  const pe_tensor *v = x->cin[2 * p], *r = x->cin[2 * p + 1], *v0 = x->cin[0];
  const char *vn = g->lvars[x->n->in_lv[2 * p]].name, *rn = g->lvars[x->n->in_lv[2 * p + 1]].name;
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  if (v->dtype != PE_F32 || r->dtype != PE_I64 || v->shape.ndim < 1 || r->shape.ndim != 1 ||
      v->shape.d[0] != r->shape.d[0] || (!v->data && pe_tensor_numel(v) > 0) ||
      (!r->data && pe_tensor_numel(r) > 0))
    return pe_error(PE_ESHAPE,
                    "node %d %s: sparse gradient '%s' %s %s with rows '%s' %s %s on place %d: "
                    "values f32 [n, ...] and rows i64 [n] expected",
                    x->id, x->n->name, vn, pe_dtype_name(v->dtype),
                    pe_shape_str(&v->shape, s1, sizeof s1), rn, pe_dtype_name(r->dtype),
                    pe_shape_str(&r->shape, s2, sizeof s2), p);
  bool same = v->shape.ndim == v0->shape.ndim;
  for (int d = 1; same && d < v->shape.ndim; d++) same = v->shape.d[d] == v0->shape.d[d];
  if (!same)
    return pe_error(PE_ESHAPE, "node %d %s: sparse gradient '%s' on place %d is %s, place 0 has %s",
                    x->id, x->n->name, vn, p, pe_shape_str(&v->shape, s1, sizeof s1),
                    pe_shape_str(&v0->shape, s2, sizeof s2));
  *width = pe_shape_prod(&v->shape, 1, v->shape.ndim);
  return NULL;
}

pe_status *par_sparse_prepare(xnode *x) {
  int64_t width = 0;
  for (int p = 0; p < x->e->n_places; p++) PE_TRY(check_place(x, p, &width));
  x->counts[0] = width;
  x->n_chunks = 1;
  return NULL;
}

/* Place p's rows that name a row: the prefix before the first -1, checked
 * ascending and distinct (the merge relies on it). */
static pe_status *valid_rows(const xnode *x, int p, int64_t *count) {
  const pe_tensor *r = x->cin[2 * p + 1];
  const int64_t *rows = pe_i64(r);
  int64_t n = r->shape.d[0], k = 0;
  while (k < n && rows[k] >= 0) {
    if (k > 0 && rows[k] <= rows[k - 1]) break;
    k++;
  }
  for (int64_t q = k; q < n; q++)
    if (rows[q] != -1)
      return pe_error(PE_EINVAL,
                      "node %d %s: rows '%s' on place %d hold %lld at %lld: a sparse gradient's "
                      "rows are ascending, distinct, with -1 only after the last",
                      x->id, x->n->name, x->e->g->lvars[x->n->in_lv[2 * p + 1]].name, p,
                      (long long)rows[q], (long long)q);
  *count = k;
  return NULL;
}

/* Merge every place's rows into the scratch; *m = merged rows. */
static pe_status *merge(xnode *x, int64_t width, int64_t *m) {
  int np = x->e->n_places;
  par_sparse *sp = x->sparse;
  int64_t len[PE_MAX_PLACES], at[PE_MAX_PLACES] = {0}, total = 0;
  for (int p = 0; p < np; p++) {
    PE_TRY(valid_rows(x, p, &len[p]));
    total += len[p];
  }
  if (total > sp->cap_rows) {
    float *v = realloc(sp->vals, (size_t)(total * width + 1) * sizeof(float)); /* +1: never 0 */
    if (v) sp->vals = v;
    int64_t *r = realloc(sp->rows, (size_t)total * sizeof(int64_t));
    if (r) sp->rows = r;
    if (!v || !r)
      return pe_error(PE_ENOMEM, "node %d %s: out of memory merging %lld rows of %lld floats",
                      x->id, x->n->name, (long long)total, (long long)width);
    sp->cap_rows = total;
  }
  int64_t k = 0;
  for (;;) {
    int64_t id = -1;
    for (int p = 0; p < np; p++) {
      const int64_t *rows = pe_i64(x->cin[2 * p + 1]);
      if (at[p] < len[p] && (id < 0 || rows[at[p]] < id)) id = rows[at[p]];
    }
    if (id < 0) break;
    float *dst = sp->vals + k * width;
    bool first = true;
    for (int p = 0; p < np; p++) {
      const int64_t *rows = pe_i64(x->cin[2 * p + 1]);
      if (at[p] >= len[p] || rows[at[p]] != id) continue;
      const float *src = pe_f32(x->cin[2 * p]) + at[p] * width;
      if (first)
        memcpy(dst, src, (size_t)width * sizeof(float));
      else
        for (int64_t j = 0; j < width; j++) dst[j] += src[j];
      first = false;
      at[p]++;
    }
    sp->rows[k++] = id;
  }
  *m = k;
  return NULL;
}

pe_status *par_sparse_chunk(xnode *x) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  const pe_graph *g = e->g;
  int64_t width = x->counts[0], m = 0;
  PE_TRY(merge(x, width, &m));
  const pe_shape *vs = &x->cin[0]->shape;
  pe_shape vals = *vs, rows = PE_SHAPE(m);
  vals.d[0] = m;
  for (int i = 0; i < n->n_out_lv / 2; i++) {
    int place = g->lvars[n->out_lv[2 * i]].place;
    pe_allocator *a = pe_device_allocator(e->dev[place]);
    pe_tensor *ov = x->cout[2 * i], *orow = x->cout[2 * i + 1];
    PE_TRY(pe_tensor_fit(ov, a, PE_F32, &vals, g->lvars[n->out_lv[2 * i]].name));
    PE_TRY(pe_tensor_fit(orow, a, PE_I64, &rows, g->lvars[n->out_lv[2 * i + 1]].name));
    if (m > 0) {
      memcpy(ov->data, x->sparse->vals, (size_t)(m * width) * sizeof(float));
      memcpy(orow->data, x->sparse->rows, (size_t)m * sizeof(int64_t));
    }
  }
  return NULL;
}
