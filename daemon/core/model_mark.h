/* The record a model's snapshot carries: which requests' runs its values
 * include and its random generator's offset. Plain data, defined here so
 * that the checkpoint format (daemon/format) stores it without the engine;
 * the parallel executor (engine/parallel/executor.h) keeps and fills it. */
#ifndef PE_CORE_MODEL_MARK_H
#define PE_CORE_MODEL_MARK_H

#include <stdbool.h>
#include <stdint.h>

/* Where a run came from: a client's request (the daemon's ids). A model
 * remembers, per client, the newest request whose run reached it and how
 * many of that request's steps did (pe_model_origin), and a snapshot
 * carries that record, so a checkpoint says which requests its values
 * include: a resend of one of them is never applied again, also after a
 * restart from the checkpoint. */
typedef struct pe_run_origin {
  uint64_t client; /* 0: none (not recorded) */
  uint64_t request;
  uint32_t steps; /* steps of `request` pushed (record only; ignored in opts) */
} pe_run_origin;

/* A point of the model's history: its change count, the record of run
 * origins (malloc'd, in order of their last run, oldest first) and the
 * offset of the model's random generator (every random op of the model's
 * graphs draws its counters from it; has_rng false: not known, e.g. a
 * checkpoint older than the generator's record, and a restore leaves the
 * generator where it is). */
typedef struct pe_model_mark {
  uint64_t version;
  pe_run_origin *origins;
  int n_origins;
  bool has_rng;
  uint64_t rng_offset;
} pe_model_mark;
void pe_model_mark_release(pe_model_mark *mk);

#endif
