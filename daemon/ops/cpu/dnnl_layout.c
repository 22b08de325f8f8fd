/* Arguments in the layout a oneDNN primitive chose (contract in
 * dnnl_util.h, "layouts chosen by the primitive").
 *
 * A stage is built once per cache entry (per op instance and shape): the
 * chosen desc is compared with the tensor's plain one, and only when they
 * differ does the entry get a buffer and a reorder primitive. Running a
 * stage is then one reorder on the place's stream, on the kernel's thread,
 * like the primitive it feeds. */
#include <stdatomic.h>
#include <stdlib.h>

#include "dnnl_util.h"

dnnl_status_t pe_dnnl_md_any(dnnl_memory_desc_t *md, int ndims, const int64_t *dims) {
  if (ndims < 1 || ndims > DNNL_MAX_NDIMS) return dnnl_invalid_arguments;
  dnnl_dims_t d;
  for (int i = 0; i < ndims; i++) d[i] = dims[i];
  return dnnl_memory_desc_init_by_tag(md, ndims, d, dnnl_f32, dnnl_format_tag_any);
}

/* A reorder from -> to, added to e (user-managed scratchpad, as every
 * primitive of an entry: see pe_dnnl_prim). */
static pe_status *reorder_add(pe_kernel_ctx *c, pe_dnnl_entry *e, const dnnl_memory_desc_t *from,
                              const dnnl_memory_desc_t *to, int *index) {
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  PE_TRY(pe_dnnl_get(c->dev, &eng, &strm));
  dnnl_primitive_attr_t attr;
  PE_TRY(pe_dnnl_check(dnnl_primitive_attr_create(&attr), c, "reorder attributes"));
  dnnl_primitive_desc_t pd = NULL;
  pe_status *st =
      pe_dnnl_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), c,
                    "reorder attributes");
  if (!st)
    st = pe_dnnl_check(dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, attr), c,
                       "layout reorder primitive desc");
  dnnl_primitive_attr_destroy(attr);
  if (st) return st;
  static const int args[] = {DNNL_ARG_FROM, DNNL_ARG_TO};
  pe_dnnl_prim *p;
  *index = e->nprims;
  st = pe_dnnl_entry_add(c, e, pd, args, 2, "layout reorder", &p);
  dnnl_primitive_desc_destroy(pd);
  if (!st) e->nreorders++;
  return st;
}

pe_status *pe_dnnl_stage_make(pe_kernel_ctx *c, pe_dnnl_entry *e, const_dnnl_primitive_desc_t pd,
                              int arg, const dnnl_memory_desc_t *plain, bool out,
                              const pe_dnnl_stage *share, pe_dnnl_stage *st) {
  *st = (pe_dnnl_stage){-1, -1};
  const dnnl_memory_desc_t *chosen = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
  if (!chosen)
    return pe_kernel_error(c, PE_EBACKEND, "oneDNN: no memory desc for argument %d", arg);
  if (dnnl_memory_desc_equal(chosen, plain)) return NULL;
  if (share && share->buf >= 0) {
    const pe_dnnl_prim *r = &e->prims[share->reorder];
    const dnnl_memory_desc_t *held;
    dnnl_memory_get_memory_desc(r->args[1].memory, &held); /* the reorder's TO */
    if (dnnl_memory_desc_equal(chosen, held)) {
      *st = *share;
      return NULL;
    }
  }
  void *buf;
  PE_TRY(pe_dnnl_entry_buffer(c, e, dnnl_memory_desc_get_size(chosen), &buf));
  st->buf = e->nbufs - 1;
  return out ? reorder_add(c, e, chosen, plain, &st->reorder)
             : reorder_add(c, e, plain, chosen, &st->reorder);
}

void *pe_dnnl_stage_handle(const pe_dnnl_entry *e, const pe_dnnl_stage *st, void *data) {
  return st->buf >= 0 ? e->bufs[st->buf] : data;
}

static atomic_uint_fast64_t reorder_runs, reorder_bytes;

/* Run a stage's reorder and count it. */
static pe_status *stage_run(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_dnnl_stage *st,
                            void *const *h, const char *what) {
  pe_dnnl_prim *r = &e->prims[st->reorder];
  const dnnl_memory_desc_t *md;
  size_t bytes = dnnl_memory_get_memory_desc(r->args[0].memory, &md) == dnnl_success
                     ? dnnl_memory_desc_get_size(md)
                     : 0;
  atomic_fetch_add_explicit(&reorder_runs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&reorder_bytes, bytes, memory_order_relaxed);
  return pe_dnnl_run(c, r, h, what);
}

pe_dnnl_reorder_count pe_dnnl_reorders_run(void) {
  return (pe_dnnl_reorder_count){atomic_load_explicit(&reorder_runs, memory_order_relaxed),
                                 atomic_load_explicit(&reorder_bytes, memory_order_relaxed)};
}

pe_status *pe_dnnl_stage_in(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_dnnl_stage *st,
                            void *data) {
  if (st->reorder < 0) return NULL;
  void *h[] = {data, e->bufs[st->buf]};
  return stage_run(c, e, st, h, "layout reorder in");
}

pe_status *pe_dnnl_stage_out(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_dnnl_stage *st,
                             void *data) {
  if (st->reorder < 0) return NULL;
  void *h[] = {e->bufs[st->buf], data};
  return stage_run(c, e, st, h, "layout reorder out");
}

bool pe_dnnl_stage_same(const pe_dnnl_stage *a, const pe_dnnl_stage *b) {
  return a->buf >= 0 && a->buf == b->buf;
}
