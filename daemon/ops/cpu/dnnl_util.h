/* oneDNN plumbing shared by the CPU kernels: the engine and stream of a
 * place, status conversion, memory descriptors for pe_tensors, and a small
 * per-op-instance primitive cache.
 *
 * Primitive cache. Primitives are created once per op instance and shape and
 * kept in the op's state (see registry.h), never per call. The state of every
 * oneDNN op row is a pe_dnnl_cache (freed by pe_dnnl_cache_free, the rows'
 * state_free). It holds up to PE_DNNL_CACHE_ENTRIES entries keyed by the
 * input shapes (attributes are fixed for an op instance, so shapes suffice):
 * a fixed batch builds one entry, a final partial batch a second one; the
 * least recently used entry is evicted beyond that. An entry owns its
 * primitives, one buffer-less dnnl_memory_t per primitive argument (data
 * handles are set on each call to the tensors' buffers) and any scratch
 * buffers the kernel needs (workspaces, unused gradients). Tensors are
 * plain (abcd / ab), except the activations that the layout_blocked pass
 * keeps in oneDNN's blocked layout between the ops that understand it
 * (dnnl_act_layout.h); a primitive that runs faster on a layout of its own
 * choosing (convolution) reaches it through stages (below), which reorder
 * between the tensor and an entry buffer only where the two differ. */
#ifndef PE_OPS_CPU_DNNL_UTIL_H
#define PE_OPS_CPU_DNNL_UTIL_H

#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>

#include "ops/device_ctx.h"
#include "ops/registry.h"

/* Engine and stream of the place (created on first use; owned by d). */
pe_status *pe_dnnl_get(pe_device_ctx *d, dnnl_engine_t *eng, dnnl_stream_t *strm);
void pe_dnnl_ctx_release(pe_device_ctx *d);
/* A second stream of the place, for a kernel's other thread (pe_dnnl_run_on).
 * Create it on the kernel's thread before the threads fork. */
pe_status *pe_dnnl_side_stream(pe_device_ctx *d, dnnl_stream_t *strm);
/* NULL if s == dnnl_success, else an error naming the op and `what`. */
pe_status *pe_dnnl_check(dnnl_status_t s, const pe_kernel_ctx *c, const char *what);
const char *pe_dnnl_status_str(dnnl_status_t s);

/* --- memory descriptors (f32) ------------------------------------------- */
/* Dense row-major desc (tag abc...) of ndims dims. */
dnnl_status_t pe_dnnl_md_plain(dnnl_memory_desc_t *md, int ndims, const int64_t *dims);
/* Dense row-major desc of a tensor's shape. */
dnnl_status_t pe_dnnl_md_of(dnnl_memory_desc_t *md, const pe_shape *s);
/* A rows x cols matrix view; transposed: the buffer holds the cols x rows
 * matrix row-major (strides {1, rows}). */
dnnl_status_t pe_dnnl_md_matrix(dnnl_memory_desc_t *md, int64_t rows, int64_t cols,
                                bool transposed);

/* --- per-op primitive cache ---------------------------------------------- */
#define PE_DNNL_CACHE_ENTRIES 4
#define PE_DNNL_KEY_MAX 32
#define PE_DNNL_MAX_PRIMS 10 /* convolution backward: 2 + 6 reorders */
#define PE_DNNL_MAX_ARGS 10
#define PE_DNNL_MAX_BUFS 11 /* convolution backward: 2 + 6 stages + 3 (Winograd) */
#define PE_DNNL_MAX_STAGES 6

/* Scratchpads are user-managed: every primitive gets its own (one buffer of
 * its entry, bound once), because Debian's oneDNN is built without
 * DNNL_ENABLE_CONCURRENT_EXEC and its library-managed scratchpad is one
 * global buffer that primitives running at once on several threads (pool
 * workers, sim stream threads) would share and reallocate under each
 * other. */
typedef struct pe_dnnl_prim {
  dnnl_primitive_t prim;
  int nargs; /* memories in args (user args, then the scratchpad if any) */
  int nuser; /* args bound by pe_dnnl_run's handles */
  dnnl_exec_arg_t args[PE_DNNL_MAX_ARGS]; /* memories owned by the prim */
  void *scratch; /* its scratchpad (owned, 64-byte aligned), NULL if none */
} pe_dnnl_prim;

/* One argument of a primitive created with format `any` (dnnl_layout.c):
 * when the layout oneDNN chose differs from the tensor's plain one, the
 * argument lives in entry buffer `buf` and prims[reorder] copies between
 * the two (plain -> chosen for an input, chosen -> plain for an output).
 * Indices, not pointers: entries are moved by value inside the cache. */
typedef struct pe_dnnl_stage {
  int reorder; /* index in prims; -1: the layouts agree, the tensor is used as is */
  int buf;     /* index in bufs; -1 when reorder is -1 */
} pe_dnnl_stage;

typedef struct pe_dnnl_entry {
  int nkey;
  int64_t key[PE_DNNL_KEY_MAX];
  uint64_t last_use;
  int nprims;
  pe_dnnl_prim prims[PE_DNNL_MAX_PRIMS];
  int nbufs;
  void *bufs[PE_DNNL_MAX_BUFS];             /* owned scratch, 64-byte aligned */
  pe_dnnl_stage stages[PE_DNNL_MAX_STAGES]; /* kernel-defined meaning (conv.c) */
  int nreorders;                            /* layout reorders among prims (pe_dnnl_stage_make) */
  int choice;                               /* kernel-defined: conv2d's algorithm (conv_algo.h) */
  int wino_passes;                          /* conv.c: the passes pe's Winograd runs (0: none) */
  int wino_threads;                         /* conv.c: the team its scratch holds */
} pe_dnnl_entry;

typedef struct pe_dnnl_cache_stats {
  uint64_t builds;    /* entries built (a miss) */
  uint64_t hits;      /* lookups served by an existing entry */
  uint64_t evictions; /* entries dropped to make room */
  int entries;        /* entries held now */
  int reorders;       /* layout reorders in the entries held now (0: all plain) */
} pe_dnnl_cache_stats;

typedef struct pe_dnnl_cache {
  int n;
  uint64_t tick;
  pe_dnnl_cache_stats stats;
  pe_dnnl_entry e[PE_DNNL_CACHE_ENTRIES];
} pe_dnnl_cache;

/* Build keys: append a shape (ndim then dims) or one value. */
void pe_dnnl_key_shape(int64_t *key, int *n, const pe_shape *s);
void pe_dnnl_key_val(int64_t *key, int *n, int64_t v);

/* Find the entry for key in the op state's cache (creating the cache in
 * *c->state on first use). *fresh is set when the entry is new and empty:
 * the caller then builds it and hands the result to pe_dnnl_cache_built:
 *   if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, my_build(c, e, ...))); */
pe_status *pe_dnnl_cache_lookup(pe_kernel_ctx *c, const int64_t *key, int nkey, pe_dnnl_entry **e,
                                bool *fresh);
/* The same, keyed by one shape (the usual key: attributes are fixed). */
pe_status *pe_dnnl_cache_lookup_shape(pe_kernel_ctx *c, const pe_shape *s, pe_dnnl_entry **e,
                                      bool *fresh);
/* Ends the build of a fresh entry; st is the build's result. On failure the
 * entry is dropped, so that a half-built entry is never reused. Returns st. */
pe_status *pe_dnnl_cache_built(pe_kernel_ctx *c, pe_dnnl_entry *e, pe_status *st);
/* state_free of every oneDNN row. */
void pe_dnnl_cache_free(void *state);
/* Counters of an op state (zeros for NULL), for tests and stats. */
pe_dnnl_cache_stats pe_dnnl_cache_stats_of(const void *state);
/* The primitive desc of primitive `prim` of entry `entry` of an op state
 * (owned by the primitive), for tests; NULL when there is none. */
const_dnnl_primitive_desc_t pe_dnnl_cache_pd(const void *state, int entry, int prim);
/* oneDNN's name of the implementation behind pd (as ONEDNN_VERBOSE prints
 * it); "" for NULL. */
const char *pe_dnnl_impl_name(const_dnnl_primitive_desc_t pd);

/* Create a primitive from pd into e, with a memory object for each of the
 * nargs argument ids (descs queried from pd), plus its own scratchpad when
 * pd needs one. pd stays the caller's. */
pe_status *pe_dnnl_entry_add(pe_kernel_ctx *c, pe_dnnl_entry *e, const_dnnl_primitive_desc_t pd,
                             const int *arg_ids, int nargs, const char *what, pe_dnnl_prim **out);
/* Free everything e owns and zero it (key included). */
void pe_dnnl_entry_clear(pe_dnnl_entry *e);
/* An owned scratch buffer of at least `bytes` (contents unspecified). */
pe_status *pe_dnnl_entry_buffer(pe_kernel_ctx *c, pe_dnnl_entry *e, size_t bytes, void **out);
/* Create a primitive descriptor (first implementation) from an op desc,
 * with a user-managed scratchpad (see pe_dnnl_prim). */
pe_status *pe_dnnl_pd(pe_kernel_ctx *c, const void *op_desc, const_dnnl_primitive_desc_t hint,
                      const char *what, dnnl_primitive_desc_t *pd);
/* The same from the first implementation whose name (oneDNN's impl info,
 * as ONEDNN_VERBOSE prints it) begins with impl_prefix, e.g. "gemm:"; the
 * first implementation when none does. */
pe_status *pe_dnnl_pd_impl(pe_kernel_ctx *c, const void *op_desc, const char *impl_prefix,
                           const char *what, dnnl_primitive_desc_t *pd);
/* The same with one eltwise post-op (alpha = beta = 0) applied to the
 * primitive's output (dnnl_alg_kind_undef: none): conv2d's fused relu. */
pe_status *pe_dnnl_pd_post(pe_kernel_ctx *c, const void *op_desc, const_dnnl_primitive_desc_t hint,
                           dnnl_alg_kind_t post_eltwise, const char *what,
                           dnnl_primitive_desc_t *pd);
/* The same with the output multiplied by `scale` (oneDNN's output scales):
 * attention's scaled products. */
pe_status *pe_dnnl_pd_scaled(pe_kernel_ctx *c, const void *op_desc, float scale, const char *what,
                             dnnl_primitive_desc_t *pd);
/* Bind handles[i] to args[i] of p, execute on the place's stream, wait. */
pe_status *pe_dnnl_run(pe_kernel_ctx *c, pe_dnnl_prim *p, void *const *handles, const char *what);
/* The same on strm (the place's stream or its side stream). */
pe_status *pe_dnnl_run_on(pe_kernel_ctx *c, dnnl_stream_t strm, pe_dnnl_prim *p,
                          void *const *handles, const char *what);

/* --- layouts chosen by the primitive (dnnl_layout.c) -------------------------
 * Why: oneDNN's direct convolutions (jit:avx512_core, ...) run on blocked
 * layouts (nChw16c data, OIhw16i16o filters); asked for plain NCHW/OIHW
 * they fall back to im2col + GEMM, 2-3x slower on the CNN. The kernel
 * creates the primitive with pe_dnnl_md_any descs and stages each argument
 * against the layout its tensor is stored in (plain, or blocked:
 * dnnl_act_layout.h): */

/* A desc of ndims dims whose layout the primitive chooses (format any). */
dnnl_status_t pe_dnnl_md_any(dnnl_memory_desc_t *md, int ndims, const int64_t *dims);
/* Stage argument `arg` of pd, whose tensor is stored as `plain` says: a
 * no-op stage when pd chose that layout, else an entry buffer in the
 * chosen layout and a reorder (plain -> chosen if !out, chosen -> plain if
 * out). When `share` is a stage of the same entry already holding the same
 * chosen layout of the same tensor, its buffer and reorder are reused. */
pe_status *pe_dnnl_stage_make(pe_kernel_ctx *c, pe_dnnl_entry *e, const_dnnl_primitive_desc_t pd,
                              int arg, const dnnl_memory_desc_t *plain, bool out,
                              const pe_dnnl_stage *share, pe_dnnl_stage *st);
/* The handle the primitive reads or writes for this argument: the entry
 * buffer of a staged argument, else `data` itself. */
void *pe_dnnl_stage_handle(const pe_dnnl_entry *e, const pe_dnnl_stage *st, void *data);
/* Input: copy the tensor `data` into the stage's layout (no-op if none). */
pe_status *pe_dnnl_stage_in(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_dnnl_stage *st,
                            void *data);
/* Output, after the primitive ran: copy the stage back to `data`. */
pe_status *pe_dnnl_stage_out(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_dnnl_stage *st,
                             void *data);
/* True when st reuses an earlier stage's buffer (pe_dnnl_stage_make's share). */
bool pe_dnnl_stage_same(const pe_dnnl_stage *a, const pe_dnnl_stage *b);

/* Layout reorders run by stages in this process so far, and the bytes of
 * their blocked sides (every kernel thread adds to them; relaxed atomics):
 * what keeping data in blocked layouts would save. */
typedef struct pe_dnnl_reorder_count {
  uint64_t runs, bytes;
} pe_dnnl_reorder_count;
pe_dnnl_reorder_count pe_dnnl_reorders_run(void);

/* --- infer helpers --------------------------------------------------------- */
/* Every present input arg must be f32 (these kernels are f32 only). */
pe_status *pe_dnnl_infer_f32(pe_infer_ctx *c);
/* Read an INTS attr of exactly 2 values (absent: dflt). Errors name it. */
pe_status *pe_dnnl_attr_pair(pe_infer_ctx *c, const char *name, int64_t dflt, int64_t out[2]);
/* Same, for kernels (infer already validated the attr). */
void pe_dnnl_attr_pair_k(const pe_op_desc *op, const char *name, int64_t dflt, int64_t out[2]);

/* --- grad helpers ----------------------------------------------------------- */
/* Set slot of op to "<arg>@GRAD" for each arg of src (an input or output). */
pe_status *pe_dnnl_grad_slot(pe_op_desc *op, bool output, const char *slot, const pe_slot *src);
/* Zero every present output of a grad kernel (used when the incoming
 * gradient was pruned, i.e. is all zeros). */
void pe_dnnl_zero_outputs(pe_kernel_ctx *c);

#endif
