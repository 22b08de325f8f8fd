/* Input prefetch: a background thread (or, with a pool, the
 * pool's workers) takes the next batch from a producer callback and splits
 * it along dim 0 onto N places, so that reading and splitting batch k+1
 * overlaps step k.
 *
 * Splits are as even as possible: with B samples on N places, place p gets
 * B/N samples plus one if p < B%N (3 samples on 4 places: 1,1,1,0). A place
 * may get 0 samples; its tensors then have dim 0 == 0.
 *
 * Buffers. `depth` slots (default 2: double buffering) rotate between the
 * thread and the consumer. pe_prefetch_next hands out batches in order;
 * each must be given back with pe_prefetch_release before its slot is
 * filled again. Part tensors belong to the prefetcher and keep their
 * capacity across batches (no allocation in steady state). On cpu places
 * (no devices, or cpu devices) each slot has its own staging buffers and the
 * parts are views of their rows: nothing is copied. With other devices,
 * parts are allocated from each device's allocator and copied on its h2d
 * stream; the batch is ready once those copies completed.
 *
 * Errors. A producer failure (or a split failure: inputs of different
 * batch sizes, out of memory) stops production; pe_prefetch_next returns
 * it after handing out every batch completed before it, and then returns
 * a copy of it on every later call.
 *
 * Threads. The producer runs on the prefetch thread (with a pool: see
 * pe_prefetch_opts.fill), one call at a time. next, try_next, release and
 * stop are for one consumer at a time (they are thread-safe, but batches
 * come out in one sequence); the consumer may move between threads, e.g.
 * pool workers chaining steps (pe_par_exec_run_steps). */
#ifndef PE_ENGINE_PREFETCH_H
#define PE_ENGINE_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/device.h"
#include "engine/threadpool.h"

/* Fill inputs[0..n_inputs) with the next batch (resize them as needed; they
 * are host tensors owned by the prefetcher and reused). Every input's dim 0
 * is the batch size. At the end of the data set *end = true. */
typedef pe_status *(*pe_batch_producer)(void *ctx, pe_tensor *inputs, int n_inputs, bool *end);
/* Two-phase production (pe_prefetch_opts.fill): after the producer sized
 * the inputs for the batch, write rows [lo, hi) of every input. Calls for
 * disjoint ranges of one batch may run concurrently. */
typedef pe_status *(*pe_batch_fill)(void *ctx, pe_tensor *inputs, int n_inputs, int64_t lo,
                                    int64_t hi);

typedef struct pe_prefetch_opts {
  int n_places; /* >= 1 */
  int n_inputs; /* >= 1, e.g. 2 for (image, label) */
  int depth;    /* batches in flight; <= 0: 2 */
  pe_batch_producer produce;
  void *ctx;
  /* Optional: devices[p] receives place p's parts (its allocator, its h2d
   * stream). NULL: host memory, places are cpu:p. Devices outlive the
   * prefetcher. */
  pe_device **devices;
  /* Optional: with fill set, produce only sizes the inputs (and decides the
   * end); the rows are then written by fill: without a pool, one call for
   * the whole batch on the prefetch thread; with pool set, one call per
   * piece of a place's rows (pe_prefetch_fill_pieces below), each a task
   * on pool worker p mod workers (placed there, not pinned:
   * pe_pool_submit_to); the first failing piece's error (place by place,
   * in row order) is the batch's. On cpu places a batch's rows are then
   * copied by the cores that run the places' ops, in parallel, in their
   * idle time, instead of by a thread taking one of their cores.
   * With a pool there is no prefetch thread at all: the next batch is
   * produced by whichever thread frees its slot or completes the batch
   * before it (pe_prefetch_start, pe_prefetch_release, the last fill
   * task, which also splits the batch), one call at a time; so produce
   * must be quick (size the inputs, pick the rows) and may run on a pool
   * worker. The pool must outlive the prefetcher. */
  pe_batch_fill fill;
  pe_pool *pool;
} pe_prefetch_opts;

/* With a pool, place p's rows are filled in pe_prefetch_fill_pieces(rows)
 * pieces of near-equal size: rows / PE_PREFETCH_FILL_PIECE_ROWS, at least 1
 * and at most PE_PREFETCH_FILL_PIECES. A worker that takes a piece at a
 * step boundary sees its place's first op after a few us, not after the
 * whole fill (prefetch.c). */
#define PE_PREFETCH_FILL_PIECES 8
#define PE_PREFETCH_FILL_PIECE_ROWS 8
static inline int pe_prefetch_fill_pieces(int64_t rows) {
  int64_t k = rows / PE_PREFETCH_FILL_PIECE_ROWS;
  return k < 1 ? 1 : k > PE_PREFETCH_FILL_PIECES ? PE_PREFETCH_FILL_PIECES : (int)k;
}

typedef struct pe_prefetch_batch {
  uint64_t index; /* 0, 1, 2, ... */
  int64_t total;  /* samples in the batch */
  int n_places, n_inputs;
  const int64_t *counts; /* samples per place */
  pe_tensor *parts;      /* n_places x n_inputs; see pe_prefetch_part */
} pe_prefetch_batch;

typedef struct pe_prefetch pe_prefetch;

static inline pe_tensor *pe_prefetch_part(const pe_prefetch_batch *b, int place, int input) {
  return &b->parts[place * b->n_inputs + input];
}

/* Starts the thread (opts is copied). */
pe_status *pe_prefetch_start(const pe_prefetch_opts *opts, pe_prefetch **out);
/* Block until the next batch is ready. *out = NULL at the end of the data
 * (and on every call after it). */
pe_status *pe_prefetch_next(pe_prefetch *pf, pe_prefetch_batch **out);
/* pe_prefetch_next without waiting: *ready false (and *out NULL) when the
 * next batch is not split yet; otherwise as pe_prefetch_next. For a pool
 * worker, which must not wait for fills queued behind itself. */
pe_status *pe_prefetch_try_next(pe_prefetch *pf, pe_prefetch_batch **out, bool *ready);
/* Give a batch from next back; NULL is a no-op. */
void pe_prefetch_release(pe_prefetch *pf, pe_prefetch_batch *b);
/* Stop the thread (after the producer call in progress returns), join it
 * and free everything; batches not released are freed too. With a pool, it
 * first waits for the fill tasks of a batch in flight. NULL: no-op. */
void pe_prefetch_stop(pe_prefetch *pf);

/* The split rule: samples of place p out of total on n places. */
static inline int64_t pe_split_count(int64_t total, int n, int p) {
  return total / n + (p < total % n ? 1 : 0);
}

#endif
