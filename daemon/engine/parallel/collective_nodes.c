/* Collective nodes of the parallel executor: all_reduce, fused all_reduce,
 * reduce and broadcast across the places.
 *
 * cpu: a collective never blocks a pool worker in a rendezvous (with few
 * workers, parts of different collectives would take them all and wait for
 * each other). The data is cut into chunks; each chunk task reduces its
 * range across all places in place order (so every place gets bit-identical
 * sums, whatever task ran it) and the last task to finish completes the
 * node. A collective that is an engine op (a broadcast of parameters, a
 * sharded update) completes its engine op the same way: its fn returns
 * PE_ENGINE_PENDING and the last chunk calls pe_engine_op_complete, so the
 * engine variables are held until the data is final.
 *
 * The sharded update (parallel/sharded.c) is a collective of this kind: its
 * chunks are slices of the parameter. So is the sparse_merge of a sparse
 * gradient (parallel/sparse_merge.c), in one chunk.
 *
 * sim: an all-reduce launches one pe_coll_part per place on the place's comm
 * stream, all of them under the runtime's coll_mu so that every comm stream
 * queues the parts of different collectives in the same order. Every part's
 * stream first waits for every predecessor of the node (of any place): the
 * rendezvous then only exchanges data. Reduce, broadcast and sparse_merge run
 * as one fn on the root's comm stream (a sparse_merge onto every place: place
 * 0's; they need no rendezvous); consumers on every place wait on its event. */
#include <stdlib.h>
#include <string.h>

#include "engine/op_finite.h"
#include "engine/op_run.h"
#include "engine/parallel/executor_internal.h"

#define OOM() pe_error(PE_ENOMEM, "parallel executor: out of memory")
#define CHUNK_MIN_ELEMS 16384

pe_status *par_coll_compile(pe_par_exec *e, xnode *x) {
  const pe_graph_node *n = x->n;
  x->cin = calloc((size_t)(n->n_in_lv ? n->n_in_lv : 1), sizeof(*x->cin));
  x->cout = calloc((size_t)(n->n_out_lv ? n->n_out_lv : 1), sizeof(*x->cout));
  x->counts = calloc((size_t)(n->width > 0 ? n->width : 1), sizeof(*x->counts));
  if (!x->cin || !x->cout || !x->counts) return OOM();
  for (int i = 0; i < n->n_in_lv; i++) x->cin[i] = e->lt[n->in_lv[i]];
  for (int i = 0; i < n->n_out_lv; i++) x->cout[i] = e->lt[n->out_lv[i]];
  int w = n->width > 0 ? n->width : 1;
  switch (n->kind) {
    case PE_NODE_ALL_REDUCE:
    case PE_NODE_REDUCE:
      if (n->n_in_lv != w * e->n_places)
        return pe_error(PE_EINTERNAL, "node %d %s: %d inputs for width %d on %d places", x->id,
                        n->name, n->n_in_lv, w, e->n_places);
      break;
    case PE_NODE_FUSED_ALL_REDUCE:
      if (n->bucket < 0 || n->bucket >= e->g->n_buckets)
        return pe_error(PE_EINTERNAL, "node %d %s: bad bucket %d", x->id, n->name, n->bucket);
      break;
    case PE_NODE_BROADCAST:
      if (n->root < 0 || n->root >= e->n_places || n->n_in_lv != w ||
          n->n_out_lv != w * (e->n_places - 1))
        return pe_error(PE_EINTERNAL, "node %d %s: malformed broadcast", x->id, n->name);
      break;
    case PE_NODE_SHARDED_UPDATE: PE_TRY(par_shard_compile(e, x)); break;
    case PE_NODE_SPARSE_MERGE: PE_TRY(par_sparse_compile(e, x)); break;
    default: return pe_error(PE_EINTERNAL, "node %d %s: not a collective", x->id, n->name);
  }
  if (n->kind == PE_NODE_REDUCE && (n->root < 0 || n->root >= e->n_places || n->n_out_lv != w))
    return pe_error(PE_EINTERNAL, "node %d %s: malformed reduce", x->id, n->name);
  if (e->async && (n->kind == PE_NODE_ALL_REDUCE || n->kind == PE_NODE_FUSED_ALL_REDUCE)) {
    x->parts = calloc((size_t)e->n_places, sizeof(*x->parts));
    if (!x->parts) return OOM();
  }
  return NULL;
}

void par_coll_free(xnode *x) {
  par_shard_free(x);
  par_sparse_free(x);
  free(x->cin);
  free(x->cout);
  free(x->counts);
  free(x->parts);
}

pe_status *par_coll_prepare(xnode *x) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  const pe_graph *g = e->g;
  int w = n->width > 0 ? n->width : 1;
  int np = e->n_places;
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  int64_t total = 0;
  switch (n->kind) {
    case PE_NODE_ALL_REDUCE:
    case PE_NODE_REDUCE:
      for (int k = 0; k < w; k++) {
        const pe_tensor *t0 = x->cin[k];
        for (int p = 0; p < np; p++) {
          const pe_tensor *t = x->cin[p * w + k];
          if (t->dtype != PE_F32 || !pe_shape_equal(&t->shape, &t0->shape) ||
              (!t->data && pe_tensor_numel(t) > 0))
            return pe_error(
                PE_ESHAPE,
                "node %d %s: '%s' on place %d is %s %s, place 0 has %s %s (f32 expected)", x->id,
                n->name, g->lvars[n->in_lv[p * w + k]].name, p, pe_dtype_name(t->dtype),
                pe_shape_str(&t->shape, s1, sizeof s1), pe_dtype_name(t0->dtype),
                pe_shape_str(&t0->shape, s2, sizeof s2));
        }
        if (n->kind == PE_NODE_REDUCE) {
          pe_tensor *o = x->cout[k];
          const pe_tensor *r = x->cin[n->root * w + k];
          if (o != r)
            PE_TRY(pe_tensor_fit(o, pe_device_allocator(e->dev[n->root]), r->dtype, &r->shape,
                                 g->lvars[n->out_lv[k]].name));
        }
        x->counts[k] = pe_tensor_numel(t0);
        total += x->counts[k];
      }
      break;
    case PE_NODE_FUSED_ALL_REDUCE:
      x->counts[0] = g->buckets[n->bucket].bytes / (int64_t)sizeof(float);
      total = x->counts[0];
      break;
    case PE_NODE_SHARDED_UPDATE:
      PE_TRY(par_shard_prepare(x, &x->counts[0]));
      total = x->counts[0];
      break;
    case PE_NODE_SPARSE_MERGE: return par_sparse_prepare(x); /* one chunk */
    case PE_NODE_BROADCAST:
      for (int k = 0; k < w; k++) {
        const pe_tensor *r = x->cin[k];
        if (!r->data && r->shape.ndim == 0)
          return pe_error(PE_EUSE_BEFORE_DEF, "node %d %s: '%s' on root place %d has no value",
                          x->id, n->name, g->lvars[n->in_lv[k]].name, n->root);
        for (int i = 0; i < np - 1; i++) {
          int lv = n->out_lv[i * w + k];
          pe_tensor *o = x->cout[i * w + k];
          if (o->dtype != r->dtype || !pe_shape_equal(&o->shape, &r->shape) || !o->data) {
            PE_TRY(pe_tensor_fit(o, pe_device_allocator(e->dev[g->lvars[lv].place]), r->dtype,
                                 &r->shape, g->lvars[lv].name));
          }
        }
        x->counts[k] = (int64_t)pe_tensor_bytes(r);
        total += x->counts[k] / 4;
      }
      break;
    default: return pe_error(PE_EINTERNAL, "node %d: not a collective", x->id);
  }
  /* Up to 4 chunks per worker: a worker that finished its share takes
   * another chunk, so a step's last collective (the MLP's fc_0.w update,
   * ~250 us of work on cpu:2) leaves no worker idle for more than a quarter
   * share (2 per worker left one idle up to ~60 us; median ratio on the MLP
   * cpu:2 sharded 1.57 -> 1.60 over 6 alternating pairs). */
  int max = 4 * pe_pool_threads(e->rt->pool);
  if (max > PAR_MAX_CHUNKS) max = PAR_MAX_CHUNKS;
  int64_t c = total / CHUNK_MIN_ELEMS;
  x->n_chunks = (int)(c < 1 ? 1 : c > max ? max : c);
  return NULL;
}

/* [lo, hi) of chunk c of count elements, multiples of 16 (64 bytes). */
static void chunk_range(int64_t count, int c, int n, int64_t *lo, int64_t *hi) {
  int64_t per = (count + n - 1) / n;
  per = (per + 15) & ~(int64_t)15;
  *lo = per * c < count ? per * c : count;
  *hi = per * (c + 1) < count ? per * (c + 1) : count;
}

/* `omp simd` loops: dst and the buffers are distinct, but the compiler
 * cannot know it and would otherwise emit a scalar loop. */
void par_sum_block(float *dst, const float *const *b, int np, int64_t m) {
  const float *b0 = b[0], *b1 = b[np > 1 ? 1 : 0];
  if (np > 1) {
#pragma omp simd
    for (int64_t i = 0; i < m; i++) dst[i] = b0[i] + b1[i];
  } else if (m > 0) {
    memcpy(dst, b0, (size_t)m * sizeof(float));
  }
  for (int p = 2; p < np; p++) {
    const float *bp = b[p];
#pragma omp simd
    for (int64_t i = 0; i < m; i++) dst[i] += bp[i];
  }
}

/* Sum [lo, hi) over the places into dst_only, or into every place's buffer,
 * in blocks of SUM_BLOCK through a stack accumulator. */
#define SUM_BLOCK 2048
static void sum_range(float *const *b, int np, float *dst_only, int64_t lo, int64_t hi) {
  float acc[SUM_BLOCK] __attribute__((aligned(64)));
  const float *o[PE_MAX_PLACES];
  for (int64_t a = lo; a < hi; a += SUM_BLOCK) {
    int64_t m = hi - a < SUM_BLOCK ? hi - a : SUM_BLOCK;
    for (int p = 0; p < np; p++) o[p] = b[p] + a;
    par_sum_block(acc, o, np, m);
    if (dst_only)
      memcpy(dst_only + a, acc, (size_t)m * sizeof(float));
    else
      for (int p = 0; p < np; p++) memcpy(b[p] + a, acc, (size_t)m * sizeof(float));
  }
}

/* Chunk c of x's data; a failure (a sharded update's kernel) is recorded as
 * the run's error and fails the node. */
static void coll_chunk(xnode *x, int c) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  int w = n->width > 0 ? n->width : 1;
  int np = e->n_places;
  float *b[PE_MAX_PLACES];
  int64_t lo, hi;
  switch (n->kind) {
    case PE_NODE_ALL_REDUCE:
    case PE_NODE_REDUCE:
      for (int k = 0; k < w; k++) {
        for (int p = 0; p < np; p++) b[p] = pe_f32(x->cin[p * w + k]);
        chunk_range(x->counts[k], c, x->n_chunks, &lo, &hi);
        sum_range(b, np, n->kind == PE_NODE_REDUCE ? pe_f32(x->cout[k]) : NULL, lo, hi);
      }
      break;
    case PE_NODE_FUSED_ALL_REDUCE:
      for (int p = 0; p < np; p++) b[p] = e->bucket_mem[n->bucket * np + p];
      chunk_range(x->counts[0], c, x->n_chunks, &lo, &hi);
      sum_range(b, np, NULL, lo, hi);
      break;
    case PE_NODE_BROADCAST:
      for (int k = 0; k < w; k++) {
        chunk_range(x->counts[k], c, x->n_chunks, &lo, &hi);
        const char *src = x->cin[k]->data;
        for (int i = 0; i < np - 1; i++)
          if (hi > lo) memcpy((char *)x->cout[i * w + k]->data + lo, src + lo, (size_t)(hi - lo));
      }
      break;
    case PE_NODE_SHARDED_UPDATE:
    case PE_NODE_SPARSE_MERGE: {
      chunk_range(x->counts[0], c, x->n_chunks, &lo, &hi);
      pe_status *st =
          n->kind == PE_NODE_SPARSE_MERGE ? par_sparse_chunk(x) : par_shard_chunk(x, c, lo, hi);
      if (st) {
        par_fail(e, st);
        atomic_store_explicit(&x->failed, true, memory_order_release);
      }
      break;
    }
    default: break;
  }
}

/* After the last chunk, on the thread that ran it. A sharded update runs
 * its kernel on slices, not through pe_op_run: --check-nan-inf checks its
 * outputs here, once whole (place 0's; the others hold the same values). */
static void coll_finish(xnode *x) {
  if (x->n->kind != PE_NODE_SHARDED_UPDATE ||
      atomic_load_explicit(&x->failed, memory_order_acquire))
    return;
  par_shard_finish(x);
  pe_status *st = x->e->opts->check_nan_inf ? pe_op_check_finite(&x->kc, x->ml) : NULL;
  if (st) {
    par_fail(x->e, pe_status_wrap(st, "node %d %s (sharded update)", x->id, x->n->name));
    atomic_store_explicit(&x->failed, true, memory_order_release);
  }
}

static void chunk_task(void *arg) {
  par_chunk *ch = arg;
  xnode *x = ch->x;
  uint64_t t0 = x->e->tl ? pe_timeline_now_ns() : 0;
  coll_chunk(x, ch->c);
  if (x->e->tl) {
    char lane[32];
    snprintf(lane, sizeof lane, "worker %d", pe_pool_current_worker());
    par_record(x, x->e->g->places[0], lane, t0);
  }
  if (atomic_fetch_sub_explicit(&x->chunks_left, 1, memory_order_acq_rel) != 1) return;
  coll_finish(x);
  par_hook(x, true);
  if (!par_cross_hold(x)) return; /* completed with its step's others (parallel/cross.c) */
  if (x->engine)
    par_engine_complete(x); /* releases its variables, then par_node_done */
  else
    par_run_chain(par_node_done(x, true));
}

/* --- sim ------------------------------------------------------------------------- */

/* Reduce / broadcast on the root's comm stream. */
static pe_status *sim_root_fn(void *arg) {
  xnode *x = arg;
  if (par_preds_sfailed(x)) {
    atomic_store_explicit(&x->sfail, true, memory_order_release);
    return NULL;
  }
  uint64_t t0 = x->e->tl ? pe_timeline_now_ns() : 0;
  pe_status *st = par_coll_prepare(x);
  if (st) {
    par_fail(x->e, st);
    atomic_store_explicit(&x->sfail, true, memory_order_release);
    return NULL;
  }
  for (int c = 0; c < x->n_chunks; c++) coll_chunk(x, c);
  coll_finish(x);
  if (atomic_load_explicit(&x->failed, memory_order_acquire))
    atomic_store_explicit(&x->sfail, true, memory_order_release);
  int root = x->n->root >= 0 ? x->n->root : 0;
  par_record(x, x->e->g->places[root], x->ev_stream[0]->name, t0);
  return NULL;
}

/* One all-reduce part on place p's comm stream. Every part runs (its peers
 * wait for it in the rendezvous), even when a predecessor failed. */
static pe_status *sim_part_fn(void *arg) {
  par_simpart *sp = arg;
  xnode *x = sp->x;
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  bool failed = par_preds_sfailed(x);
  uint64_t t0 = e->tl ? pe_timeline_now_ns() : 0;
  int w = n->width > 0 ? n->width : 1;
  pe_status *st = NULL;
  uint64_t base = sp->part.op_id;
  if (n->kind == PE_NODE_FUSED_ALL_REDUCE) {
    sp->part.buf = e->bucket_mem[n->bucket * e->n_places + sp->p];
    sp->part.count = (size_t)(e->g->buckets[n->bucket].bytes / (int64_t)sizeof(float));
    st = pe_coll_part_run(&sp->part);
  } else {
    for (int k = 0; k < w && !st; k++) {
      pe_tensor *t = x->cin[sp->p * w + k];
      sp->part.op_id = base + (uint64_t)k;
      sp->part.buf = t->dtype == PE_F32 ? pe_f32(t) : NULL;
      /* A wrong dtype shows as a count mismatch, which fails every part. */
      sp->part.count = t->dtype == PE_F32 && t->data ? (size_t)pe_tensor_numel(t) : (size_t)-1 / 8;
      st = pe_coll_part_run(&sp->part);
    }
  }
  sp->part.op_id = base;
  if (st) {
    par_fail(e, pe_status_wrap(st, "node %d %s on place %d", x->id, n->name, sp->p));
    failed = true;
  }
  if (failed) atomic_store_explicit(&x->sfail, true, memory_order_release);
  par_record(x, e->g->places[sp->p], x->ev_stream[sp->p]->name, t0);
  return NULL;
}

static pe_status *sim_launch(xnode *x) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  int np = e->n_places;
  if (x->parts) {
    int w = n->width > 0 ? n->width : 1;
    pe_status *st = NULL;
    pthread_mutex_lock(&e->rt->coll_mu);
    uint64_t id = atomic_fetch_add(&e->m->coll_seq, (uint64_t)w);
    /* Every part's stream synchronised first, then every part launched: with
     * WAIT_PRODUCER a sync drains a producer's stream, which must not hold a
     * part of this collective (it would wait for peers not launched yet). */
    for (int p = 0; p < np && !st; p++) {
      st = par_sync_preds(x, x->ev_stream[p], p);
      if (!st) st = par_wait_fences(x, x->ev_stream[p]);
    }
    for (int p = 0; p < np && !st; p++) {
      pe_stream *s = x->ev_stream[p];
      x->parts[p] =
          (par_simpart){x, p, {e->m->comm, id, p, PE_COLL_ALLREDUCE, PE_REDUCE_SUM, 0, NULL, 0}};
      st = pe_stream_launch(s, sim_part_fn, &x->parts[p]);
      if (!st) st = pe_event_record(x->ev[p], s);
    }
    pthread_mutex_unlock(&e->rt->coll_mu);
    /* A part that could not be queued would leave its peers waiting; this
     * only happens on a closed device or out of memory. */
    return st;
  }
  pe_stream *s = x->ev_stream[0];
  PE_TRY(par_sync_preds(x, s, n->root));
  PE_TRY(par_wait_fences(x, s));
  if (x->writes_persistable)
    for (int p = 0; p < np; p++)
      for (int k = 0; k < 2; k++) {
        pe_stream *o = pe_device_stream(e->dev[p], k == 0 ? PE_STREAM_COMPUTE : PE_STREAM_COMM);
        if (o != s) PE_TRY(pe_device_sync_dep(e->sync, o, NULL, s));
      }
  PE_TRY(pe_stream_launch(s, sim_root_fn, x));
  PE_TRY(pe_event_record(x->ev[0], s));
  if (x->engine && x->writes_persistable) pe_status_free(pe_event_sync(x->ev[0]));
  return NULL;
}

/* --- entry ------------------------------------------------------------------------ */

bool par_coll_run(xnode *x, bool may_fan_out) {
  pe_par_exec *e = x->e;
  if (e->ncomm_dev && x->cross_seq >= 0) return par_dcross_launch(x); /* then across nodes */
  if (e->m->dcomm || e->async) { /* on the comm streams: the backend's, or sim's */
    pe_status *st = e->m->dcomm ? par_dcomm_launch(x) : sim_launch(x);
    if (st) {
      par_fail(e, pe_status_wrap(st, "node %d %s", x->id, x->n->name));
      atomic_store(&x->failed, true);
    }
    return true;
  }
  uint64_t t0 = e->tl ? pe_timeline_now_ns() : 0;
  pe_status *st = par_coll_prepare(x);
  if (st) {
    par_fail(e, st);
    atomic_store(&x->failed, true);
    return true;
  }
  int nc = x->n_chunks;
  if (!may_fan_out || nc == 1) {
    for (int c = 0; c < nc; c++) coll_chunk(x, c);
    coll_finish(x);
    if (e->tl) {
      char lane[32];
      snprintf(lane, sizeof lane, "worker %d", pe_pool_current_worker());
      par_record(x, e->g->places[0], lane, t0);
    }
    return true;
  }
  atomic_store_explicit(&x->chunks_left, nc, memory_order_relaxed);
  for (int c = 0; c < nc; c++) {
    x->chunks[c] = (par_chunk){{chunk_task, &x->chunks[c], NULL}, x, c};
    if (c > 1) x->chunks[c - 1].task.next = &x->chunks[c].task;
  }
  pe_pool_submit_batch(e->rt->pool, &x->chunks[1].task, &x->chunks[nc - 1].task, nc - 1);
  chunk_task(&x->chunks[0]);
  return false;
}
