/* Feeds and fetches of the parallel executor: the batch split along dim 0
 * onto the places (pe_split_count), the zero gradients of places that get
 * no sample, and the fetch rules of parallel/executor.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/op_finite.h"
#include "engine/op_run.h"
#include "engine/parallel/executor_internal.h"
#include "engine/place_io.h"
#include "engine/prefetch.h"

#define OOM() pe_error(PE_ENOMEM, "parallel executor: out of memory")

pe_status *par_feeds_compile(pe_par_exec *e) {
  const pe_graph *g = e->g;
  /* Gradient and parameter lvars per place, for par_zero_grads. */
  int np = g->n_params * e->n_places;
  e->grad_lv = calloc((size_t)(np ? np : 1), sizeof(int));
  e->param_lv = calloc((size_t)(np ? np : 1), sizeof(int));
  e->grad_sum_place = calloc((size_t)(g->n_params ? g->n_params : 1), sizeof(int));
  e->rows_lv = calloc((size_t)(np ? np : 1), sizeof(int));
  if (!e->grad_lv || !e->param_lv || !e->grad_sum_place || !e->rows_lv) return OOM();
  for (int i = 0; i < g->n_params; i++)
    for (int p = 0; p < e->n_places; p++) {
      e->grad_lv[i * e->n_places + p] = pe_graph_lvar_find(g, g->grads[i], p);
      e->param_lv[i * e->n_places + p] = pe_graph_lvar_find(g, g->params[i], p);
      e->rows_lv[i * e->n_places + p] = -1;
      char rows[600];
      snprintf(rows, sizeof rows, "%s" PE_ROWS_SUFFIX, g->grads[i]);
      if (pe_is_sparse_rows_name(rows))
        e->rows_lv[i * e->n_places + p] = pe_graph_lvar_find(g, rows, p);
    }
  /* Which node combines each gradient (none with one place: place 0). */
  for (int n = 0; n < g->n_nodes; n++) {
    const pe_graph_node *x = &g->nodes[n];
    bool owned = x->kind == PE_NODE_REDUCE || (x->kind == PE_NODE_SPARSE_MERGE && x->root >= 0);
    if (!owned && x->kind != PE_NODE_SHARDED_UPDATE) continue;
    for (int i = 0; i < g->n_params; i++)
      for (int k = 0; k < x->n_in_lv; k++)
        if (x->in_lv[k] == e->grad_lv[i * e->n_places]) /* its place-0 copy */
          e->grad_sum_place[i] = owned ? x->root : -1;
  }
  const pe_block *b = g->prog->blocks[g->block];
  e->feeds = calloc((size_t)(b->n_vars ? b->n_vars : 1), sizeof(*e->feeds));
  if (!e->feeds) return OOM();
  for (int i = 0; i < b->n_vars; i++) {
    const pe_var_desc *v = b->vars[i];
    if (!v->is_feed) continue;
    par_feedvar *f = &e->feeds[e->n_feeds];
    f->desc = v;
    f->lv = calloc((size_t)e->n_places, sizeof(int));
    if (!f->lv) return OOM();
    e->n_feeds++;
    for (int p = 0; p < e->n_places; p++) f->lv[p] = pe_graph_lvar_find(g, v->name, p);
  }
  return NULL;
}

/* A feed name the block does not declare as a feed is an error. */
static pe_status *check_known(const pe_par_exec *e, const char *name, int f) {
  if (!name) return pe_error(PE_EINVAL, "parallel executor: feed %d has no name", f);
  for (int j = 0; j < e->n_feeds; j++)
    if (!strcmp(e->feeds[j].desc->name, name)) return NULL;
  return pe_error(PE_EUNKNOWN_VAR, "feed '%s' is not a feed variable of block %d", name,
                  e->g->block);
}

/* Dtype, shape and data of one feed tensor against its declaration. */
static pe_status *check_tensor(const pe_var_desc *v, const pe_tensor *t, const char *where) {
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  if (t->dtype != v->dtype)
    return pe_error(PE_EDTYPE, "feed '%s'%s: got %s %s, declared %s %s", v->name, where,
                    pe_dtype_name(t->dtype), pe_shape_str(&t->shape, s1, sizeof s1),
                    pe_dtype_name(v->dtype), pe_shape_str(&v->shape, s2, sizeof s2));
  bool ok = v->shape.ndim == 0 || pe_shape_compatible(&v->shape, &t->shape);
  if (!ok || pe_shape_numel(&t->shape) < 0 || t->shape.ndim < 1)
    return pe_error(PE_ESHAPE, "feed '%s'%s: got shape %s, declared %s", v->name, where,
                    pe_shape_str(&t->shape, s1, sizeof s1), pe_shape_str(&v->shape, s2, sizeof s2));
  if (pe_tensor_numel(t) > 0 && !t->data)
    return pe_error(PE_EINVAL, "feed '%s'%s: tensor %s has no data", v->name, where,
                    pe_shape_str(&t->shape, s1, sizeof s1));
  return NULL;
}

static pe_status *missing(const pe_par_exec *e, const pe_var_desc *v) {
  char s1[PE_SHAPE_STRLEN];
  return pe_error(PE_EMISSING_FEED, "feed '%s' (%s %s) of block %d was not supplied", v->name,
                  pe_dtype_name(v->dtype), pe_shape_str(&v->shape, s1, sizeof s1), e->g->block);
}

/* Kernels (compute) and collectives (comm) see the feeds written on h2d. */
static pe_status *feeds_visible(pe_par_exec *e) {
  if (e->async && e->n_feeds)
    for (int p = 0; p < e->n_places; p++) {
      pe_stream *h2d = pe_device_stream(e->dev[p], PE_STREAM_H2D);
      PE_TRY(
          pe_device_sync_dep(e->sync, h2d, NULL, pe_device_stream(e->dev[p], PE_STREAM_COMPUTE)));
      PE_TRY(pe_device_sync_dep(e->sync, h2d, NULL, pe_device_stream(e->dev[p], PE_STREAM_COMM)));
    }
  return NULL;
}

/* After a split run the feed tensors are views of the caller's parts: drop
 * them before copying into the executor's own storage again. */
static void drop_feed_views(pe_par_exec *e) {
  if (!e->feeds_viewed) return;
  for (int j = 0; j < e->n_feeds; j++)
    for (int p = 0; p < e->n_places; p++) {
      int lv = e->feeds[j].lv[p];
      if (lv >= 0 && !e->lt[lv]->alloc) pe_tensor_init(e->lt[lv]);
    }
  e->feeds_viewed = false;
}

pe_status *par_feeds_load(pe_par_exec *e, const pe_feed *feeds, int n_feeds) {
  char s1[PE_SHAPE_STRLEN];
  const pe_graph *g = e->g;
  for (int f = 0; f < n_feeds; f++) {
    if (!feeds[f].t)
      return pe_error(PE_EINVAL, "parallel executor: feed %d has no name or tensor", f);
    PE_TRY(check_known(e, feeds[f].name, f));
  }
  const pe_tensor *src[e->n_feeds ? e->n_feeds : 1];
  int64_t batch = -1;
  const char *batch_from = NULL;
  for (int j = 0; j < e->n_feeds; j++) {
    const pe_var_desc *v = e->feeds[j].desc;
    src[j] = NULL;
    for (int f = 0; f < n_feeds && !src[j]; f++)
      if (!strcmp(feeds[f].name, v->name)) src[j] = feeds[f].t;
    const pe_tensor *t = src[j];
    if (!t) return missing(e, v);
    PE_TRY(check_tensor(v, t, ""));
    if (e->opts->check_nan_inf) PE_TRY(pe_feed_check_finite(v->name, t, ""));
    if (batch >= 0 && t->shape.d[0] != batch)
      return pe_error(PE_ESHAPE,
                      "feed '%s': batch %lld (shape %s) differs from feed '%s' (batch %lld)",
                      v->name, (long long)t->shape.d[0], pe_shape_str(&t->shape, s1, sizeof s1),
                      batch_from, (long long)batch);
    batch = t->shape.d[0];
    batch_from = v->name;
  }
  drop_feed_views(e);
  e->has_feeds = e->n_feeds > 0;
  e->batch = batch > 0 ? batch : 0;
  for (int p = 0; p < e->n_places; p++) e->n_rows[p] = pe_split_count(e->batch, e->n_places, p);
  PE_TRY(par_buffers_bind(e));
  /* Copy each place's rows on its h2d stream. */
  for (int j = 0; j < e->n_feeds; j++) {
    const pe_tensor *t = src[j];
    size_t row = t->shape.d[0] > 0 ? pe_tensor_bytes(t) / (size_t)t->shape.d[0] : 0;
    int64_t at = 0;
    for (int p = 0; p < e->n_places; p++) {
      int lv = e->feeds[j].lv[p];
      int64_t rows = e->n_rows[p];
      if (lv >= 0) {
        pe_tensor *dst = e->lt[lv];
        pe_shape sh = t->shape;
        sh.d[0] = rows;
        PE_TRY(
            pe_tensor_fit(dst, pe_device_allocator(e->dev[p]), t->dtype, &sh, g->lvars[lv].name));
        if (rows > 0)
          PE_TRY(pe_stream_copy(pe_device_stream(e->dev[p], PE_STREAM_H2D), dst->data,
                                (const char *)t->data + (size_t)at * row, (size_t)rows * row,
                                PE_COPY_H2D));
      }
      at += rows;
    }
  }
  return feeds_visible(e);
}

/* " (part of place p)" for an error message; formatted only on the error
 * path, as every step checks every part. */
static const char *part_where(char *buf, size_t n, int p) {
  snprintf(buf, n, " (part of place %d)", p);
  return buf;
}

pe_status *par_feeds_load_split(pe_par_exec *e, const pe_feed_split *feeds, int n_feeds) {
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN], where[48];
  for (int f = 0; f < n_feeds; f++) {
    if (!feeds[f].parts)
      return pe_error(PE_EINVAL, "parallel executor: split feed %d has no parts", f);
    PE_TRY(check_known(e, feeds[f].name, f));
  }
  const pe_feed_split *src[e->n_feeds ? e->n_feeds : 1];
  for (int j = 0; j < e->n_feeds; j++) {
    const pe_var_desc *v = e->feeds[j].desc;
    src[j] = NULL;
    for (int f = 0; f < n_feeds && !src[j]; f++)
      if (!strcmp(feeds[f].name, v->name)) src[j] = &feeds[f];
    if (!src[j]) return missing(e, v);
    for (int p = 0; p < e->n_places; p++) {
      const pe_tensor *t = src[j]->parts[p];
      if (!t)
        return pe_error(PE_EINVAL, "feed '%s'%s: no tensor", v->name,
                        part_where(where, sizeof where, p));
      pe_status *st = check_tensor(v, t, "");
      if (st) { /* the same check again, for the message that names the part */
        pe_status_free(st);
        return check_tensor(v, t, part_where(where, sizeof where, p));
      }
      if (e->opts->check_nan_inf)
        PE_TRY(pe_feed_check_finite(v->name, t, part_where(where, sizeof where, p)));
      const pe_tensor *t0 = src[0]->parts[p];
      if (j > 0 && t->shape.d[0] != t0->shape.d[0])
        return pe_error(PE_ESHAPE,
                        "feed '%s'%s: %lld rows (shape %s), feed '%s' has %lld (shape %s)", v->name,
                        part_where(where, sizeof where, p), (long long)t->shape.d[0],
                        pe_shape_str(&t->shape, s1, sizeof s1), src[0]->name,
                        (long long)t0->shape.d[0], pe_shape_str(&t0->shape, s2, sizeof s2));
    }
  }
  e->has_feeds = e->n_feeds > 0;
  e->batch = 0;
  for (int p = 0; p < e->n_places; p++) {
    e->n_rows[p] = e->n_feeds ? src[0]->parts[p]->shape.d[0] : 0;
    e->batch += e->n_rows[p];
  }
  PE_TRY(par_buffers_bind(e));
  /* The parts become the feed tensors (views, no copy). */
  for (int j = 0; j < e->n_feeds; j++)
    for (int p = 0; p < e->n_places; p++) {
      int lv = e->feeds[j].lv[p];
      if (lv < 0) continue;
      const pe_tensor *t = src[j]->parts[p];
      pe_tensor_view(e->lt[lv], t->dtype, &t->shape, t->data); /* kernels only read feeds */
    }
  e->feeds_viewed = true;
  return feeds_visible(e);
}

/* Storage of the buffers memory_plan shared between temporaries: one block
 * per buffer, sized for this run's rows on its place (capacity kept across
 * runs: steady state allocates nothing; twice the need or more is given
 * back, parallel/temps.c), and every member lvar a view of it.
 * A member whose runtime size exceeds the plan falls back to storage of its
 * own (pe_tensor_fit), re-attached here on the next run. The previous
 * run's stream work is done (par_drain), so the host may move blocks. */
pe_status *par_buffers_bind(pe_par_exec *e) {
  const pe_graph *g = e->g;
  par_temps_fit(e);
  for (int b = 0; b < g->n_buffers; b++) {
    const pe_graph_buffer *bf = &g->buffers[b];
    if (!bf->shared || bf->persistable) continue;
    int p = bf->place;
    int64_t need = pe_graph_buffer_bytes(g, b, e->has_feeds ? e->n_rows[p] : 1);
    if (need < 1) need = 1;
    if ((size_t)need > e->buf_cap[b] || par_buffer_oversized(e->buf_cap[b], need)) {
      if (e->buf_mem[b]) pe_device_free(e->dev[p], e->buf_mem[b], e->buf_cap[b]);
      e->buf_cap[b] = 0;
      e->buf_mem[b] = pe_device_alloc(e->dev[p], (size_t)need, &e->buf_cap[b]);
      if (!e->buf_mem[b])
        return pe_error(PE_ENOMEM,
                        "parallel executor: out of memory for buffer %d (%lld bytes, place %d)", b,
                        (long long)need, p);
    }
    for (int k = 0; k < bf->n_lvars; k++) {
      if (g->lvars[bf->lvars[k]].bucket >= 0 || g->lvars[bf->lvars[k]].persistable) continue;
      pe_tensor *t = &e->own[bf->lvars[k]];
      if (t->alloc) pe_tensor_release(t); /* a fallback of an earlier run */
      t->data = e->buf_mem[b];
      t->cap = e->buf_cap[b];
      t->alloc = NULL;
    }
  }
  return NULL;
}

/* A place with no sample contributes zero gradients to the collectives (a
 * sparse gradient: no rows, [0, ...] and [0]). The
 * previous run's stream work is done (par_drain), and pe_place_zero has
 * completed when it returns, so every stream's work launched afterwards
 * sees the zeros. */
void par_zero_grads(pe_par_exec *e) {
  const pe_graph *g = e->g;
  for (int p = 0; p < e->n_places; p++) {
    if (e->n_rows[p] > 0) continue;
    for (int b = 0; b < g->n_buckets; b++) {
      pe_status *st = pe_place_zero(e->dev[p], e->bucket_mem[b * e->n_places + p],
                                    (size_t)g->buckets[b].bytes, "fused gradient bucket");
      if (st) par_fail(e, st);
    }
    for (int i = 0; i < g->n_params; i++) {
      int lv = e->grad_lv[i * e->n_places + p], plv = e->param_lv[i * e->n_places + p];
      if (lv < 0 || plv < 0) continue;
      pe_tensor *t = e->lt[lv];
      const pe_tensor *w = e->lt[plv];
      if (!w->data && w->shape.ndim == 0) continue; /* uninitialised: the run fails elsewhere */
      int rlv = e->rows_lv[i * e->n_places + p];
      if (rlv >= 0) {
        pe_shape vs = w->shape, rs = PE_SHAPE(0);
        vs.d[0] = 0;
        pe_allocator *a = pe_device_allocator(e->dev[p]);
        pe_status *st = pe_tensor_fit(t, a, w->dtype, &vs, g->lvars[lv].name);
        if (!st) st = pe_tensor_fit(e->lt[rlv], a, PE_I64, &rs, g->lvars[rlv].name);
        if (st) par_fail(e, st);
        continue;
      }
      if (g->lvars[lv].bucket >= 0) {
        t->dtype = w->dtype;
        t->shape = w->shape;
        continue; /* zeroed with its bucket */
      }
      pe_status *st =
          pe_tensor_fit(t, pe_device_allocator(e->dev[p]), w->dtype, &w->shape, g->lvars[lv].name);
      if (!st) st = pe_place_zero(e->dev[p], t->data, pe_tensor_bytes(t), g->lvars[lv].name);
      if (st) par_fail(e, st);
    }
  }
}

/* --- fetch -------------------------------------------------------------------------- */

static bool has_value(const pe_tensor *t) {
  return t->data || t->shape.ndim > 0;
}

/* Parameter j whose gradient (or a sparse gradient's rows) on place 0 is
 * lvar lv, or -1. */
static int param_grad_index(const pe_par_exec *e, int lv) {
  for (int j = 0; j < e->g->n_params; j++)
    if (e->grad_lv[j * e->n_places] == lv || e->rows_lv[j * e->n_places] == lv) return j;
  return -1;
}

/* Place p's tensor t as the host sees it: t itself when the place's memory
 * is host memory, else a copy in the executor's staging tensor of p (valid
 * until the next call for p). The run waited for t's producer before
 * fetching (par_fetch_wait, or every stream). */
static pe_status *host_view(pe_par_exec *e, int p, const pe_tensor *t, const char *name,
                            const pe_tensor **out) {
  *out = t;
  if (pe_device_host_memory(e->dev[p])) return NULL;
  PE_TRY(pe_place_read(e->dev[p], t, &e->stage[p], name));
  *out = &e->stage[p];
  return NULL;
}

/* out = the places' gradients of parameter j summed in place order (the
 * all-reduce's order: the same bits AllReduce leaves on every place). */
static pe_status *fetch_grad_sum(pe_par_exec *e, int j, const char *name, pe_tensor *out) {
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  const float *b[PE_MAX_PLACES];
  const pe_tensor *t0 = e->lt[e->grad_lv[j * e->n_places]];
  for (int p = 0; p < e->n_places; p++) {
    int lv = e->grad_lv[j * e->n_places + p];
    const pe_tensor *t = lv >= 0 ? e->lt[lv] : NULL;
    if (!t || !has_value(t))
      return pe_error(PE_EUSE_BEFORE_DEF, "fetch '%s': no value on place %d", name, p);
    if (t->dtype != PE_F32 || !pe_shape_equal(&t->shape, &t0->shape))
      return pe_error(PE_ESHAPE, "fetch '%s': place %d has %s %s, place 0 %s %s (f32 expected)",
                      name, p, pe_dtype_name(t->dtype), pe_shape_str(&t->shape, s1, sizeof s1),
                      pe_dtype_name(t0->dtype), pe_shape_str(&t0->shape, s2, sizeof s2));
    PE_TRY(host_view(e, p, t, name, &t));
    b[p] = pe_f32(t);
  }
  PE_TRY(pe_tensor_resize(out, PE_F32, &t0->shape, name));
  par_sum_block(pe_f32(out), b, e->n_places, pe_tensor_numel(t0));
  return NULL;
}

/* lv[p] = fetch slot f's (name's) lvar on place p, or -1; whether any
 * place has it. Slot f remembers the last lookup. */
static bool fetch_lookup(pe_par_exec *e, int f, const char *name, int *lv) {
  int np = e->n_places;
  bool any = false;
  bool cached = f < PAR_FETCH_CACHE && name && e->fetch_name[f] && !strcmp(e->fetch_name[f], name);
  for (int p = 0; p < np; p++) {
    lv[p] = cached ? e->fetch_lv[f][p] : name ? pe_graph_lvar_find(e->g, name, p) : -1;
    any |= lv[p] >= 0;
  }
  if (!cached && any && f < PAR_FETCH_CACHE) {
    free(e->fetch_name[f]);
    if (!e->fetch_lv[f]) e->fetch_lv[f] = malloc((size_t)np * sizeof(int));
    e->fetch_name[f] = e->fetch_lv[f] ? strdup(name) : NULL;
    if (e->fetch_name[f]) memcpy(e->fetch_lv[f], lv, (size_t)np * sizeof(int));
  }
  return any;
}

/* Make d2h see lvar lv's final value: its last version's producer (any
 * stream, any place), or the write fence of a persistable. Feeds were
 * waited for with the h2d streams. */
static pe_status *d2h_wait_value(pe_par_exec *e, int lv, pe_stream *d2h) {
  const pe_graph *g = e->g;
  const pe_graph_lvar *l = &g->lvars[lv];
  if (e->lentry[lv]) PE_TRY(par_fence_wait(e, false, &e->lentry[lv]->fence[l->place], d2h));
  if (l->n_versions < 1) return NULL;
  int pr = g->vars[l->versions[l->n_versions - 1]].producer;
  if (pr < 0) return NULL;
  const xnode *y = &e->x[pr];
  for (int j = 0; j < y->n_ev; j++) PE_TRY(par_sync_dep(e, false, y->ev_stream[j], y->ev[j], d2h));
  return NULL;
}

pe_status *par_fetch_wait(pe_par_exec *e, const char *const *fetch, int n_fetch) {
  int lv[PE_MAX_PLACES];
  for (int f = 0; f < n_fetch; f++) {
    if (!fetch_lookup(e, f, fetch[f], lv)) continue; /* par_fetch names it */
    for (int p = 0; p < e->n_places; p++)
      if (lv[p] >= 0) PE_TRY(d2h_wait_value(e, lv[p], pe_device_stream(e->dev[p], PE_STREAM_D2H)));
  }
  /* The host reads after the d2h streams passed those waits (also where a
   * place's memory is host memory and no copy goes through d2h). */
  for (int p = 0; p < e->n_places; p++)
    PE_TRY(pe_stream_sync(pe_device_stream(e->dev[p], PE_STREAM_D2H)));
  return NULL;
}

/* lv[p] = fetch slot f's (name's) lvar on place p (-1: none); *first = the
 * first place that has it. An unknown name, or a variable whose buffer the
 * compiler reuses, is an error. */
static pe_status *fetch_resolve(pe_par_exec *e, int f, const char *name, int *lv, int *first) {
  const pe_graph *g = e->g;
  int np = e->n_places;
  if (!fetch_lookup(e, f, name, lv)) {
    PE_TRY(pe_fetch_fused_error(g->prog, g->prog->blocks[g->block], name));
    return pe_error(PE_EUNKNOWN_VAR, "fetch '%s' is not a variable of the graph",
                    name ? name : "(null)");
  }
  *first = lv[0] >= 0 ? 0 : -1;
  for (int p = 0; p < np && *first < 0; p++)
    if (lv[p] >= 0) *first = p;
  for (int p = 0; p < np; p++)
    if (lv[p] >= 0 && g->lvars[lv[p]].buffer >= 0 && g->buffers[g->lvars[lv[p]].buffer].shared)
      return pe_error(PE_EUNKNOWN_VAR,
                      "fetch '%s': not kept fetchable at compile time (its buffer is reused); add "
                      "it to the keep list",
                      name);
  return NULL;
}

/* The place whose value is the fetch's where one place's is: a gradient's
 * where it was summed (gj: its parameter), a persistable's home, else
 * `first`. l0: the lvar on `first`. */
static int fetch_value_place(const pe_par_exec *e, const int *lv, int first, int gj,
                             const pe_graph_lvar *l0) {
  if (gj >= 0 && lv[e->grad_sum_place[gj]] >= 0) first = e->grad_sum_place[gj];
  if (l0->persistable && e->lentry[lv[first]]) { /* the model's value: its home's */
    int h = atomic_load_explicit(&e->lentry[lv[first]]->home, memory_order_relaxed);
    if (h < e->n_places && lv[h] >= 0) first = h;
  }
  return first;
}

/* out = place p's value. */
static pe_status *fetch_from_place(pe_par_exec *e, int p, const int *lv, const char *name,
                                   pe_tensor *out) {
  const pe_tensor *t = e->lt[lv[p]];
  if (!has_value(t)) return pe_error(PE_EUSE_BEFORE_DEF, "fetch '%s': no value", name);
  return pe_place_read(e->dev[p], t, out, name);
}

/* A per-sample variable: the places' parts concatenated in place order. */
static pe_status *fetch_concat(pe_par_exec *e, const int *lv, const char *name, pe_tensor *out) {
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  int np = e->n_places;
  pe_shape sh = {0};
  int64_t rows = 0;
  const pe_tensor *proto = NULL;
  for (int p = 0; p < np; p++) {
    if (lv[p] < 0 || (e->has_feeds && e->n_rows[p] == 0)) continue;
    const pe_tensor *t = e->lt[lv[p]];
    if (!has_value(t) || t->shape.ndim < 1)
      return pe_error(PE_EUSE_BEFORE_DEF, "fetch '%s': no value on place %d", name, p);
    if (proto) {
      pe_shape a = t->shape, b = proto->shape;
      a.d[0] = b.d[0] = 0;
      if (t->dtype != proto->dtype || !pe_shape_equal(&a, &b))
        return pe_error(PE_ESHAPE, "fetch '%s': place %d has %s, an earlier place %s", name, p,
                        pe_shape_str(&t->shape, s1, sizeof s1),
                        pe_shape_str(&proto->shape, s2, sizeof s2));
    } else {
      proto = t;
      sh = t->shape;
    }
    rows += t->shape.d[0];
  }
  if (!proto) return pe_error(PE_EUSE_BEFORE_DEF, "fetch '%s': no value", name);
  sh.d[0] = rows;
  PE_TRY(pe_tensor_resize(out, proto->dtype, &sh, name));
  size_t at = 0;
  for (int p = 0; p < np; p++) {
    if (lv[p] < 0 || (e->has_feeds && e->n_rows[p] == 0)) continue;
    const pe_tensor *t = e->lt[lv[p]];
    size_t bytes = pe_tensor_bytes(t);
    if (bytes) {
      PE_TRY(host_view(e, p, t, name, &t));
      memcpy((char *)out->data + at, t->data, bytes);
    }
    at += bytes;
  }
  return NULL;
}

/* Counts: out = h[proto_p] + the later places' h[p] (NULL: no samples). */
static pe_status *fetch_count_sum(int np, const pe_tensor *const *h, int proto_p, int64_t n,
                                  const char *name, pe_tensor *out) {
  PE_TRY(pe_tensor_copy(out, h[proto_p], name));
  for (int p = proto_p + 1; p < np; p++) {
    const pe_tensor *t = h[p];
    if (!t) continue;
    for (int64_t i = 0; i < n; i++) {
      if (t->dtype == PE_I64)
        pe_i64(out)[i] += pe_i64(t)[i];
      else
        ((int32_t *)out->data)[i] += ((const int32_t *)t->data)[i];
    }
  }
  return NULL;
}

/* Any other variable: the mean over places with samples weighted n_p / N
 * (float), the sum (counts: i32, i64), else the first such place's value. */
static pe_status *fetch_mean(pe_par_exec *e, const int *lv, const char *name, pe_tensor *out) {
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  int np = e->n_places;
  /* h[p]: place p's value as the host sees it (NULL: the place does not
   * contribute). */
  const pe_tensor *h[PE_MAX_PLACES];
  const pe_tensor *proto = NULL;
  int proto_p = -1;
  for (int p = 0; p < np && !proto; p++)
    if (lv[p] >= 0 && (!e->has_feeds || e->n_rows[p] > 0) && has_value(e->lt[lv[p]])) {
      proto = e->lt[lv[p]];
      proto_p = p;
    }
  if (!proto) return pe_error(PE_EUSE_BEFORE_DEF, "fetch '%s': no value", name);
  bool counts = proto->dtype == PE_I64 || proto->dtype == PE_I32;
  if (!counts && proto->dtype != PE_F32 && proto->dtype != PE_F64)
    return pe_place_read(e->dev[proto_p], proto, out, name); /* neither: place's value */
  int64_t n = pe_tensor_numel(proto);
  double wgt[PE_MAX_PLACES]; /* each place's share; 0: it had no rows */
  for (int p = 0; p < np; p++) {
    h[p] = NULL;
    wgt[p] = e->has_feeds && e->batch > 0 ? (double)e->n_rows[p] / (double)e->batch : 1.0 / np;
    if (lv[p] < 0 || wgt[p] == 0 || (counts && p < proto_p)) continue;
    const pe_tensor *t = e->lt[lv[p]];
    if (t->dtype != proto->dtype || pe_tensor_numel(t) != n)
      return pe_error(PE_ESHAPE, "fetch '%s': place %d has %s %s, expected %s %s", name, p,
                      pe_dtype_name(t->dtype), pe_shape_str(&t->shape, s1, sizeof s1),
                      pe_dtype_name(proto->dtype), pe_shape_str(&proto->shape, s2, sizeof s2));
    PE_TRY(host_view(e, p, t, name, &h[p]));
  }
  if (counts) return fetch_count_sum(np, h, proto_p, n, name, out);
  PE_TRY(pe_tensor_resize(out, proto->dtype, &proto->shape, name));
  /* Element by element, places in order: no scratch buffer per run. */
  for (int64_t i = 0; i < n; i++) {
    double acc = 0;
    for (int p = 0; p < np; p++) {
      const pe_tensor *t = h[p];
      if (!t) continue;
      acc += wgt[p] * (t->dtype == PE_F32 ? (double)pe_f32(t)[i] : ((const double *)t->data)[i]);
    }
    if (proto->dtype == PE_F32)
      pe_f32(out)[i] = (float)acc;
    else
      ((double *)out->data)[i] = acc;
  }
  return NULL;
}

/* Fetch slot f (name) into out: a gradient summed over the places, one
 * place's value, the per-sample parts concatenated, or the places' mean. */
static pe_status *fetch_one(pe_par_exec *e, int f, const char *name, pe_tensor *out) {
  int lv[PE_MAX_PLACES], first = 0;
  PE_TRY(fetch_resolve(e, f, name, lv, &first));
  int np = e->n_places;
  const pe_graph_lvar *l0 = &e->g->lvars[lv[first]];
  int gj = np > 1 && first == 0 ? param_grad_index(e, lv[0]) : -1;
  if (gj >= 0 && e->grad_sum_place[gj] < 0) return fetch_grad_sum(e, gj, name, out);
  if (gj >= 0 || l0->persistable || np == 1)
    return fetch_from_place(e, fetch_value_place(e, lv, first, gj, l0), lv, name, out);
  if (l0->per_sample || l0->feed) return fetch_concat(e, lv, name, out);
  return fetch_mean(e, lv, name, out);
}

pe_status *par_fetch(pe_par_exec *e, const char *const *fetch, int n_fetch, pe_tensor *fetched) {
  for (int f = 0; f < n_fetch; f++) PE_TRY(fetch_one(e, f, fetch[f], &fetched[f]));
  return NULL;
}
