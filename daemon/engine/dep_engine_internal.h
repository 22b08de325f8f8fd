/* The dependency engine's op record (dep_engine.c), shared with the op
 * memory (dep_op_cache.c), which sizes and recycles it. Not a public
 * interface. */
#ifndef PE_ENGINE_DEP_ENGINE_INTERNAL_H
#define PE_ENGINE_DEP_ENGINE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>

#include "dep_engine.h"

typedef struct dep {
  pe_engine_var *var;
  struct dep *next; /* in var's queue while waiting */
  pe_engine_op *op;
  bool write;
} dep;

struct pe_engine_op {
  pe_task task; /* for the pool; arg is the op */
  pe_engine *eng;
  pe_engine_fn fn;
  void *arg;
  void (*on_done)(void *arg, const pe_status *st);
  atomic_int pending;
  int priority;
  int affinity; /* pe_engine_op_args.affinity */
  int flags;
  int n_deps;               /* after deduplication */
  int n_alloc;              /* entries allocated (reads + mutates) */
  pe_engine_op *ready_next; /* in the completer's ready list */
  dep deps[];               /* sorted by variable address, unique */
};

/* dep_op_cache.c: memory for an op with n_deps entries (a pushing thread),
 * and its release (any thread; n_deps as allocated). */
pe_engine_op *op_alloc(int n_deps);
void op_release_mem(pe_engine_op *op, int n_deps);

#endif
