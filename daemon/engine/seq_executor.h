/* The sequential executor: runs one block op by op on one CPU place. It is
 * the correctness reference for every other executor.
 *
 * Compile (pe_seq_exec_new) resolves every op's slots to tensors once:
 * persistables live in the model scope (created there if absent), the rest in
 * the executor's own local scope. It builds per-op state for cached oneDNN
 * primitives. A run does no name lookups: it copies/views feeds, then for each
 * op runs inference on the concrete shapes, resizes outputs (capacity is kept
 * across runs) and calls the kernel.
 *
 * Threading: one executor is used by one thread at a time. The model scope
 * may be shared by several executors (train and eval) that are not run at
 * the same time. */
#ifndef PE_ENGINE_SEQ_EXECUTOR_H
#define PE_ENGINE_SEQ_EXECUTOR_H

#include "ir/program.h"
#include "core/rng.h"
#include "core/scope.h"
#include "ops/device_ctx.h"

typedef struct pe_feed {
  const char *name;
  const pe_tensor *t; /* read during the run only; not retained */
} pe_feed;

typedef struct pe_exec_opts {
  uint64_t seed; /* program generator seed (0: 1) */
  int threads;   /* intra-op threads (0: all cores) */
  /* 0 (default): each run flushes denormals to zero on the calling thread
   * and restores the caller's setting after (core/fpenv.h says why);
   * non-zero: run with the caller's setting as it is. */
  int keep_denormals;
  /* The program generator to draw from, shared by the executors of one
   * model (its startup and main blocks), as a parallel model's one generator
   * is: random ops then continue where the startup's initialisers stopped,
   * and a seeded run draws the dropout masks the parallel executor and the
   * daemon draw. NULL: the executor's own, seeded with seed, from counter 0.
   * Must outlive the executor; executors sharing it run one at a time. */
  pe_rng *rng;
  /* Non-zero: check every op's outputs and the feeds for NaN/Inf and fail
   * at the first op that writes one (engine/op_finite.h). */
  int check_nan_inf;
} pe_exec_opts;

typedef struct pe_seq_exec pe_seq_exec;

/* `block` is a block index of p (the main or the startup block). p must be
 * validated and outlive the executor. */
pe_status *pe_seq_exec_new(const pe_program *p, int block, pe_scope *model_scope,
                           const pe_exec_opts *opts, pe_seq_exec **out);
void pe_seq_exec_free(pe_seq_exec *e);
/* Run once. Every is_feed variable of the block must be in feeds (else
 * PE_EMISSING_FEED naming it); dtypes must match and shapes must be
 * compatible with the declaration (else PE_EDTYPE / PE_ESHAPE). fetched[i]
 * points at the tensor of fetch[i], valid until the next run or free..
 * Denormals are flushed for the duration of the run unless keep_denormals;
 * an OpenMP team the caller's thread created before its first run keeps the
 * setting it was created with. */
pe_status *pe_seq_exec_run(pe_seq_exec *e, const pe_feed *feeds, int n_feeds,
                           const char *const *fetch, int n_fetch, const pe_tensor **fetched);

#endif
