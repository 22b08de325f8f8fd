#include "dnnl_util.h"

#include <stdlib.h>
#include <string.h>

pe_status *pe_dnnl_get(pe_device_ctx *d, dnnl_engine_t *eng, dnnl_stream_t *strm) {
  if (!d->dnnl_engine) {
    dnnl_engine_t e;
    dnnl_status_t s = dnnl_engine_create(&e, dnnl_cpu, 0);
    if (s != dnnl_success)
      return pe_error(PE_EBACKEND, "oneDNN: cannot create cpu engine: %s", pe_dnnl_status_str(s));
    d->dnnl_engine = e;
  }
  if (!d->dnnl_stream) {
    dnnl_stream_t st;
    dnnl_status_t s =
        dnnl_stream_create(&st, (dnnl_engine_t)d->dnnl_engine, dnnl_stream_default_flags);
    if (s != dnnl_success)
      return pe_error(PE_EBACKEND, "oneDNN: cannot create stream: %s", pe_dnnl_status_str(s));
    d->dnnl_stream = st;
  }
  *eng = (dnnl_engine_t)d->dnnl_engine;
  *strm = (dnnl_stream_t)d->dnnl_stream;
  return NULL;
}

pe_status *pe_dnnl_side_stream(pe_device_ctx *d, dnnl_stream_t *strm) {
  dnnl_engine_t eng;
  dnnl_stream_t main_strm;
  PE_TRY(pe_dnnl_get(d, &eng, &main_strm));
  if (!d->dnnl_side_stream) {
    dnnl_stream_t st;
    dnnl_status_t s = dnnl_stream_create(&st, eng, dnnl_stream_default_flags);
    if (s != dnnl_success)
      return pe_error(PE_EBACKEND, "oneDNN: cannot create a side stream: %s",
                      pe_dnnl_status_str(s));
    d->dnnl_side_stream = st;
  }
  *strm = (dnnl_stream_t)d->dnnl_side_stream;
  return NULL;
}

void pe_dnnl_ctx_release(pe_device_ctx *d) {
  if (d->dnnl_side_stream) dnnl_stream_destroy((dnnl_stream_t)d->dnnl_side_stream);
  if (d->dnnl_stream) dnnl_stream_destroy((dnnl_stream_t)d->dnnl_stream);
  if (d->dnnl_engine) dnnl_engine_destroy((dnnl_engine_t)d->dnnl_engine);
  d->dnnl_side_stream = d->dnnl_stream = d->dnnl_engine = NULL;
}

const char *pe_dnnl_status_str(dnnl_status_t s) {
  switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_iterator_ends: return "iterator ends";
    case dnnl_runtime_error: return "runtime error";
    case dnnl_not_required: return "not required";
    default: return "unknown oneDNN status";
  }
}

pe_status *pe_dnnl_check(dnnl_status_t s, const pe_kernel_ctx *c, const char *what) {
  if (s == dnnl_success) return NULL;
  return pe_kernel_error(c, PE_EBACKEND, "oneDNN %s failed: %s", what, pe_dnnl_status_str(s));
}

/* --- memory descriptors ------------------------------------------------------ */

dnnl_status_t pe_dnnl_md_plain(dnnl_memory_desc_t *md, int ndims, const int64_t *dims) {
  static const dnnl_format_tag_t tags[] = {
      dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde, dnnl_abcdef};
  if (ndims < 1 || ndims > 6) return dnnl_invalid_arguments;
  dnnl_dims_t d;
  for (int i = 0; i < ndims; i++) d[i] = dims[i];
  return dnnl_memory_desc_init_by_tag(md, ndims, d, dnnl_f32, tags[ndims]);
}

dnnl_status_t pe_dnnl_md_of(dnnl_memory_desc_t *md, const pe_shape *s) {
  return pe_dnnl_md_plain(md, s->ndim, s->d);
}

dnnl_status_t pe_dnnl_md_matrix(dnnl_memory_desc_t *md, int64_t rows, int64_t cols,
                                bool transposed) {
  dnnl_dims_t d = {rows, cols};
  dnnl_dims_t st = {cols, 1};
  if (transposed) {
    st[0] = 1;
    st[1] = rows;
  }
  return dnnl_memory_desc_init_by_strides(md, 2, d, dnnl_f32, st);
}

/* --- primitive cache ------------------------------------------------------------ */

void pe_dnnl_key_val(int64_t *key, int *n, int64_t v) {
  if (*n < PE_DNNL_KEY_MAX) key[*n] = v;
  (*n)++; /* an overlong key is caught by pe_dnnl_cache_lookup */
}

void pe_dnnl_key_shape(int64_t *key, int *n, const pe_shape *s) {
  pe_dnnl_key_val(key, n, s->ndim);
  for (int i = 0; i < s->ndim; i++) pe_dnnl_key_val(key, n, s->d[i]);
}

void pe_dnnl_entry_clear(pe_dnnl_entry *e) {
  for (int p = 0; p < e->nprims; p++) {
    pe_dnnl_prim *pr = &e->prims[p];
    for (int a = 0; a < pr->nargs; a++)
      if (pr->args[a].memory) dnnl_memory_destroy(pr->args[a].memory);
    if (pr->prim) dnnl_primitive_destroy(pr->prim);
    free(pr->scratch);
  }
  for (int b = 0; b < e->nbufs; b++) free(e->bufs[b]);
  memset(e, 0, sizeof(*e));
}

pe_status *pe_dnnl_cache_lookup(pe_kernel_ctx *c, const int64_t *key, int nkey, pe_dnnl_entry **out,
                                bool *fresh) {
  if (nkey > PE_DNNL_KEY_MAX)
    return pe_kernel_error(c, PE_EINTERNAL, "primitive cache key too long (%d)", nkey);
  pe_dnnl_cache *cache = *c->state;
  if (!cache) {
    if (!(cache = calloc(1, sizeof(*cache))))
      return pe_kernel_error(c, PE_ENOMEM, "out of memory for the primitive cache");
    *c->state = cache;
  }
  cache->tick++;
  for (int i = 0; i < cache->n; i++) {
    pe_dnnl_entry *e = &cache->e[i];
    if (e->nkey == nkey && memcmp(e->key, key, (size_t)nkey * sizeof(int64_t)) == 0) {
      e->last_use = cache->tick;
      cache->stats.hits++;
      *out = e;
      *fresh = false;
      return NULL;
    }
  }
  pe_dnnl_entry *e;
  if (cache->n < PE_DNNL_CACHE_ENTRIES) {
    e = &cache->e[cache->n++];
  } else {
    e = &cache->e[0];
    for (int i = 1; i < cache->n; i++)
      if (cache->e[i].last_use < e->last_use) e = &cache->e[i];
    pe_dnnl_entry_clear(e);
    cache->stats.evictions++;
  }
  memset(e, 0, sizeof(*e));
  e->nkey = nkey;
  memcpy(e->key, key, (size_t)nkey * sizeof(int64_t));
  e->last_use = cache->tick;
  cache->stats.builds++;
  cache->stats.entries = cache->n;
  *out = e;
  *fresh = true;
  return NULL;
}

pe_status *pe_dnnl_cache_lookup_shape(pe_kernel_ctx *c, const pe_shape *s, pe_dnnl_entry **e,
                                      bool *fresh) {
  int64_t key[PE_DNNL_KEY_MAX];
  int nk = 0;
  pe_dnnl_key_shape(key, &nk, s);
  return pe_dnnl_cache_lookup(c, key, nk, e, fresh);
}

static void cache_drop(pe_kernel_ctx *c, pe_dnnl_entry *e) {
  pe_dnnl_cache *cache = *c->state;
  if (!cache) return;
  pe_dnnl_entry_clear(e);
  /* Keep the used entries contiguous: move the last one into the hole. */
  pe_dnnl_entry *last = &cache->e[cache->n - 1];
  if (e != last) {
    *e = *last;
    memset(last, 0, sizeof(*last));
  }
  cache->n--;
  cache->stats.entries = cache->n;
}

pe_status *pe_dnnl_cache_built(pe_kernel_ctx *c, pe_dnnl_entry *e, pe_status *st) {
  if (st) cache_drop(c, e);
  return st;
}

void pe_dnnl_cache_free(void *state) {
  pe_dnnl_cache *cache = state;
  if (!cache) return;
  for (int i = 0; i < cache->n; i++) pe_dnnl_entry_clear(&cache->e[i]);
  free(cache);
}

pe_dnnl_cache_stats pe_dnnl_cache_stats_of(const void *state) {
  const pe_dnnl_cache *cache = state;
  pe_dnnl_cache_stats st = {0};
  if (!cache) return st;
  st = cache->stats;
  for (int i = 0; i < cache->n; i++) st.reorders += cache->e[i].nreorders;
  return st;
}

const_dnnl_primitive_desc_t pe_dnnl_cache_pd(const void *state, int entry, int prim) {
  const pe_dnnl_cache *cache = state;
  if (!cache || entry < 0 || entry >= cache->n || prim < 0 || prim >= cache->e[entry].nprims)
    return NULL;
  const_dnnl_primitive_desc_t pd;
  if (dnnl_primitive_get_primitive_desc(cache->e[entry].prims[prim].prim, &pd) != dnnl_success)
    return NULL;
  return pd;
}

const char *pe_dnnl_impl_name(const_dnnl_primitive_desc_t pd) {
  const char *info = NULL;
  if (!pd || dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &info) != dnnl_success ||
      !info)
    return "";
  return info;
}

/* The attributes every primitive gets: a user-managed scratchpad, an
 * optional eltwise post-op (undef: none) and an optional output scale (1:
 * none). The caller destroys *attr. */
static pe_status *attr_make(pe_kernel_ctx *c, dnnl_alg_kind_t post_eltwise, float scale,
                            const char *what, dnnl_primitive_attr_t *attr) {
  PE_TRY(pe_dnnl_check(dnnl_primitive_attr_create(attr), c, what));
  pe_status *st = pe_dnnl_check(
      dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user), c, what);
  if (!st && post_eltwise != dnnl_alg_kind_undef) {
    dnnl_post_ops_t po;
    st = pe_dnnl_check(dnnl_post_ops_create(&po), c, what);
    if (!st) {
      st = pe_dnnl_check(dnnl_post_ops_append_eltwise(po, 1.f, post_eltwise, 0.f, 0.f), c, what);
      if (!st) st = pe_dnnl_check(dnnl_primitive_attr_set_post_ops(*attr, po), c, what);
      dnnl_post_ops_destroy(po);
    }
  }
  if (!st && scale != 1.0f)
    st = pe_dnnl_check(dnnl_primitive_attr_set_output_scales(*attr, 1, 0, &scale), c, what);
  if (st) {
    dnnl_primitive_attr_destroy(*attr);
    *attr = NULL;
  }
  return st;
}

static pe_status *pd_make(pe_kernel_ctx *c, const void *op_desc, const_dnnl_primitive_desc_t hint,
                          dnnl_alg_kind_t post_eltwise, float scale, const char *what,
                          dnnl_primitive_desc_t *pd) {
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  PE_TRY(pe_dnnl_get(c->dev, &eng, &strm));
  *pd = NULL;
  dnnl_primitive_attr_t attr;
  PE_TRY(attr_make(c, post_eltwise, scale, what, &attr));
  pe_status *st = pe_dnnl_check(dnnl_primitive_desc_create(pd, op_desc, attr, eng, hint), c, what);
  dnnl_primitive_attr_destroy(attr);
  return st;
}

/* True when the implementation behind p is named impl_prefix... */
static bool pd_impl_is(const_dnnl_primitive_desc_t p, const char *impl_prefix) {
  return strncmp(pe_dnnl_impl_name(p), impl_prefix, strlen(impl_prefix)) == 0;
}

pe_status *pe_dnnl_pd_impl(pe_kernel_ctx *c, const void *op_desc, const char *impl_prefix,
                           const char *what, dnnl_primitive_desc_t *pd) {
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  PE_TRY(pe_dnnl_get(c->dev, &eng, &strm));
  *pd = NULL;
  dnnl_primitive_attr_t attr;
  PE_TRY(attr_make(c, dnnl_alg_kind_undef, 1.0f, what, &attr));
  dnnl_primitive_desc_iterator_t it;
  pe_status *st =
      pe_dnnl_check(dnnl_primitive_desc_iterator_create(&it, op_desc, attr, eng, NULL), c, what);
  dnnl_primitive_attr_destroy(attr);
  PE_TRY(st);
  /* The iterator lists the implementations in oneDNN's order of
   * preference; the first is what pe_dnnl_pd would give. */
  dnnl_primitive_desc_t first = NULL;
  do {
    dnnl_primitive_desc_t p = dnnl_primitive_desc_iterator_fetch(it);
    if (!p) continue;
    if (pd_impl_is(p, impl_prefix)) {
      *pd = p;
      break;
    }
    if (!first)
      first = p;
    else
      dnnl_primitive_desc_destroy(p);
  } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
  dnnl_primitive_desc_iterator_destroy(it);
  if (*pd) {
    if (first) dnnl_primitive_desc_destroy(first);
    return NULL;
  }
  if (!first) return pe_kernel_error(c, PE_EBACKEND, "oneDNN %s: no implementation", what);
  *pd = first;
  return NULL;
}

pe_status *pe_dnnl_pd(pe_kernel_ctx *c, const void *op_desc, const_dnnl_primitive_desc_t hint,
                      const char *what, dnnl_primitive_desc_t *pd) {
  return pd_make(c, op_desc, hint, dnnl_alg_kind_undef, 1.0f, what, pd);
}

pe_status *pe_dnnl_pd_post(pe_kernel_ctx *c, const void *op_desc, const_dnnl_primitive_desc_t hint,
                           dnnl_alg_kind_t post_eltwise, const char *what,
                           dnnl_primitive_desc_t *pd) {
  return pd_make(c, op_desc, hint, post_eltwise, 1.0f, what, pd);
}

pe_status *pe_dnnl_pd_scaled(pe_kernel_ctx *c, const void *op_desc, float scale, const char *what,
                             dnnl_primitive_desc_t *pd) {
  return pd_make(c, op_desc, NULL, dnnl_alg_kind_undef, scale, what, pd);
}

pe_status *pe_dnnl_entry_add(pe_kernel_ctx *c, pe_dnnl_entry *e, const_dnnl_primitive_desc_t pd,
                             const int *arg_ids, int nargs, const char *what, pe_dnnl_prim **out) {
  if (e->nprims == PE_DNNL_MAX_PRIMS || nargs > PE_DNNL_MAX_ARGS)
    return pe_kernel_error(c, PE_EINTERNAL, "too many primitives or arguments for %s", what);
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  PE_TRY(pe_dnnl_get(c->dev, &eng, &strm));
  /* Counted before creation so that entry_clear releases partial work. */
  pe_dnnl_prim *p = &e->prims[e->nprims++];
  memset(p, 0, sizeof(*p));
  PE_TRY(pe_dnnl_check(dnnl_primitive_create(&p->prim, pd), c, what));
  for (int a = 0; a < nargs; a++) {
    const dnnl_memory_desc_t *md =
        dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg_ids[a]);
    if (!md)
      return pe_kernel_error(c, PE_EBACKEND, "oneDNN %s: no desc for arg %d", what, arg_ids[a]);
    p->args[a].arg = arg_ids[a];
    p->nargs = a + 1;
    PE_TRY(
        pe_dnnl_check(dnnl_memory_create(&p->args[a].memory, md, eng, DNNL_MEMORY_NONE), c, what));
  }
  p->nuser = nargs;
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  size_t sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
  if (sbytes > 0) {
    if (nargs == PE_DNNL_MAX_ARGS)
      return pe_kernel_error(c, PE_EINTERNAL, "no argument slot for the scratchpad of %s", what);
    /* Not an entry buffer: kernels address those by index. */
    if (!(p->scratch = aligned_alloc(64, (sbytes + 63) / 64 * 64)))
      return pe_kernel_error(c, PE_ENOMEM, "out of memory allocating the %zu-byte scratchpad of %s",
                             sbytes, what);
    p->args[nargs].arg = DNNL_ARG_SCRATCHPAD;
    p->nargs = nargs + 1;
    PE_TRY(
        pe_dnnl_check(dnnl_memory_create(&p->args[nargs].memory, smd, eng, p->scratch), c, what));
  }
  *out = p;
  return NULL;
}

pe_status *pe_dnnl_entry_buffer(pe_kernel_ctx *c, pe_dnnl_entry *e, size_t bytes, void **out) {
  if (e->nbufs == PE_DNNL_MAX_BUFS)
    return pe_kernel_error(c, PE_EINTERNAL, "too many scratch buffers");
  size_t sz = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, sz ? sz : 64);
  if (!p) return pe_kernel_error(c, PE_ENOMEM, "out of memory allocating %zu scratch bytes", bytes);
  e->bufs[e->nbufs++] = p;
  *out = p;
  return NULL;
}

pe_status *pe_dnnl_run(pe_kernel_ctx *c, pe_dnnl_prim *p, void *const *handles, const char *what) {
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  PE_TRY(pe_dnnl_get(c->dev, &eng, &strm));
  return pe_dnnl_run_on(c, strm, p, handles, what);
}

pe_status *pe_dnnl_run_on(pe_kernel_ctx *c, dnnl_stream_t strm, pe_dnnl_prim *p,
                          void *const *handles, const char *what) {
  for (int a = 0; a < p->nuser; a++)
    PE_TRY(pe_dnnl_check(dnnl_memory_set_data_handle(p->args[a].memory, handles[a]), c, what));
  PE_TRY(pe_dnnl_check(dnnl_primitive_execute(p->prim, strm, p->nargs, p->args), c, what));
  return pe_dnnl_check(dnnl_stream_wait(strm), c, what);
}

/* --- infer helpers ------------------------------------------------------------------ */

pe_status *pe_dnnl_infer_f32(pe_infer_ctx *c) {
  for (int s = 0; s < c->def->n_inputs; s++)
    for (int k = 0; k < c->in[s].n; k++) PE_TRY(pe_infer_expect_dtype(c, s, k, PE_F32));
  return NULL;
}

pe_status *pe_dnnl_attr_pair(pe_infer_ctx *c, const char *name, int64_t dflt, int64_t out[2]) {
  const int64_t *v;
  int n = pe_attr_ints(c->desc, name, &v);
  if (n == 0 && !v) {
    out[0] = out[1] = dflt;
    return NULL;
  }
  if (n != 2)
    return pe_infer_error(c, PE_EATTR, "attribute %s must hold 2 values (H, W), got %d", name, n);
  out[0] = v[0];
  out[1] = v[1];
  return NULL;
}

void pe_dnnl_attr_pair_k(const pe_op_desc *op, const char *name, int64_t dflt, int64_t out[2]) {
  const int64_t *v;
  int n = pe_attr_ints(op, name, &v);
  out[0] = n == 2 ? v[0] : dflt;
  out[1] = n == 2 ? v[1] : dflt;
}

/* --- grad helpers ---------------------------------------------------------------------- */

pe_status *pe_dnnl_grad_slot(pe_op_desc *op, bool output, const char *slot, const pe_slot *src) {
  if (src->n > 8) return pe_error(PE_EARITY, "grad maker: slot %s has too many args", slot);
  char buf[8][256];
  const char *names[8];
  for (int k = 0; k < src->n; k++) names[k] = pe_grad_name(src->args[k], buf[k], sizeof buf[k]);
  return output ? pe_op_set_output(op, slot, src->n, names)
                : pe_op_set_input(op, slot, src->n, names);
}

void pe_dnnl_zero_outputs(pe_kernel_ctx *c) {
  for (int o = 0; o < c->def->n_outputs; o++)
    for (int k = 0; k < c->out[o].n; k++)
      if (c->out[o].t[k]) pe_tensor_zero(c->out[o].t[k]);
}
