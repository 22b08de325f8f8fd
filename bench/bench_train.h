/* pe-bench train internals: the options, the trainer state the training
 * loop owns, and the executor backends it drives (one row each: the
 * sequential reference in bench_train.c, the parallel executor in
 * bench_train_par.c). The loop, the data and the JSON line are the same for
 * every backend, so their numbers compare directly. */
#ifndef PE_BENCH_TRAIN_H
#define PE_BENCH_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "engine/device.h"
#include "engine/prefetch.h"
#include "pe_dataset.h"
#include "pe_models.h"

typedef struct train_cfg {
  const char *model, *executor, *places;
  long batch, epochs, steps, seed, threads;
  bool json, help;
  /* parallel executor only */
  const char *strategy, *sync, *dump_graph, *timeline;
  const char *fuse; /* "on" | "off" (a bare --fuse means on) */
  long fuse_bucket;
  long steps_per_run;      /* steps per executor call (0: the whole epoch) */
  bool compare_sequential; /* also run the sequential baseline, report the ratio */
  bool check_nan_inf;      /* every op's outputs checked for NaN/Inf (op_finite.h) */
  const char *prefetch;    /* "on" (default when NULL) | "off": split batches on a thread */
  const char *denormals;   /* "flush" (default when NULL) | "keep" (core/fpenv.h) */
  const char *fuse_ops;    /* "on" (default when NULL) | "off": the fuse_conv_act pass */
  const char *cuda_graph;  /* "auto" (default when NULL) | "on" | "off" (engine/step_graph_key.h) */
  const char *conv_algo;   /* "default" when NULL, "time" or a candidate (ops/cpu/conv_algo.h) */
  const char *roofline;    /* "on" (default when NULL) | "off": roofline.h, after training */
  const char *conv_layout; /* "blocked" (default when NULL) | "plain" (ops/cpu/dnnl_act_layout.h) */
} train_cfg;

/* Whether --denormals keep: kernel threads use IEEE denormals instead of
 * flushing them to zero (the default, as the daemon does). */
static inline bool train_cfg_keep_denormals(const train_cfg *c) {
  return c->denormals && strcmp(c->denormals, "keep") == 0;
}

/* Whether --fuse-ops is on (the default, as in the daemon). */
static inline bool train_cfg_fuse_ops(const train_cfg *c) {
  return !c->fuse_ops || strcmp(c->fuse_ops, "off") != 0;
}

/* Whether --roofline is on (the default). */
static inline bool train_cfg_roofline(const train_cfg *c) {
  return !c->roofline || strcmp(c->roofline, "off") != 0;
}

/* Whether --prefetch is on (the default). */
static inline bool train_cfg_prefetch(const train_cfg *c) {
  return !c->prefetch || strcmp(c->prefetch, "off") != 0;
}

typedef struct trainer trainer;
typedef void (*train_sink)(void *ctx, int n, float loss, float acc);

/* One executor. setup compiles and initialises (after the data is loaded,
 * t->x / t->y allocated); step and eval run on the first n rows of t->x /
 * t->y. step returns the batch's mean loss and accuracy; eval the number of
 * correct predictions. json_extra appends ,"key":value pairs to the JSON
 * line (may be NULL).
 *
 * Input prefetch (optional, NULL for none): split_places gives the number of
 * places, their devices (*devices NULL: host memory parts) and the pool
 * whose workers copy each place's rows (*fill_pool NULL: the prefetch
 * thread copies the whole batch; pe_prefetch_opts.pool) the training
 * loop's pe_prefetch splits each batch onto (inputs 0: images, 1: labels);
 * steps_split then runs steps on pf's batches in place of step: at most
 * `max` (0: no cap) per call, stopping early (*end) when pf ends; each
 * step's batch size, loss and accuracy go to sink, in step order, maybe
 * on another thread (a pool worker). */
typedef struct train_backend {
  const char *executor;
  int (*setup)(trainer *t);
  pe_status *(*step)(trainer *t, int n, float *loss, float *acc);
  pe_status *(*eval)(trainer *t, int n, int64_t *correct);
  /* Optional: wait for device work the last step left in flight (async
   * places return before it ran), so the training time includes it. */
  pe_status *(*finish)(trainer *t);
  /* Optional: after the evaluation, write the files the run recorded
   * (--timeline); a failure fails the run. */
  pe_status *(*write_outputs)(trainer *t);
  void (*teardown)(trainer *t);
  void (*json_extra)(trainer *t, FILE *out);
  int (*split_places)(trainer *t, pe_device ***devices, pe_pool **fill_pool);
  pe_status *(*steps_split)(trainer *t, pe_prefetch *pf, long max, train_sink sink, void *sink_ctx,
                            bool *end);
} train_backend;

struct trainer {
  train_cfg cfg;
  const train_backend *be;
  pe_model_spec m;
  pe_dataset *train_ds, *test_ds;
  bool borrowed_data; /* the data sets are another trainer's (freed by it, after this one) */
  float *x;
  int64_t *y;
  void *impl; /* the backend's state */
  /* The threads --threads stands for, as the backend resolved it (0: all
   * cores, one worker per place): reported as "threads". */
  int threads_used;
  /* Each place's batch and OpenMP team as the backend set them up: the
   * roofline's kernels run on one place's share. */
  int64_t place_batch;
  int place_threads;
};

extern const train_backend pe_train_sequential;
extern const train_backend pe_train_parallel;

/* A trainer of the parallel executor held for the places trial
 * (bench_places.h): built with cfg and warmed up (one step) by open, then
 * stepped in turns. */
typedef struct pe_bench_stepper pe_bench_stepper;
/* Non-zero (the error printed) when setup or the warm-up step fails.
 * data_of: read its data sets (loaded and standardised once for all the
 * candidates) instead of loading them; it must be closed after this one. */
int pe_bench_stepper_open(const train_cfg *cfg, const pe_bench_stepper *data_of,
                          pe_bench_stepper **out);
/* Run `steps` training steps; their count and seconds into *done and
 * *seconds. Non-zero (the error printed) when a step fails. */
int pe_bench_stepper_run(pe_bench_stepper *sp, long steps, long *done, double *seconds);
/* NULL: no-op. */
void pe_bench_stepper_close(pe_bench_stepper *sp);

/* Print "pe-bench train: <what>: <message> (<code>)", free st, return 1. */
int pe_bench_train_fail(pe_status *st, const char *what);

#endif
