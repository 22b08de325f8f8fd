/* pe-bench's GEMM/convolution roofline: the time a training step's GEMMs
 * and convolutions take alone in oneDNN, as a lower bound for the step.
 *
 * Collection walks the main block of a compiled training program (the
 * forward, gradient and optimizer ops, fused as the executor runs them)
 * and lists, with the shapes inference left in the variables (the batch
 * dim, -1 there, set to `batch`), every product and convolution its
 * kernels run:
 *   matmul (mul)                  1 GEMM; matmul_grad: dX = dOut·Yᵀ, dY = Xᵀ·dOut
 *   matmul_v2                     1 batched GEMM; the gradient: dX and dY
 *   scaled_dot_product_attention  Q·Kᵀ and P·V; the gradient: dV, dP, dQ, dK
 *   conv2d                        forward; conv2d_grad: backward data, backward weights
 * A gradient product whose output the program does not compute (an
 * input's gradient, pruned) is not listed, as the kernel skips it.
 *
 * Timing builds each item's oneDNN primitive standalone with the ops'
 * helpers (ops/cpu/dnnl_util.h): the same shapes, f32, transposes and
 * convolution algorithm (ops/cpu/conv_algo.h's process-wide mode; direct
 * lets oneDNN choose blocked layouts with format any; time takes the
 * fastest choice, on the team or on one thread), on a team of `threads`. Only the
 * primitive runs: no layout reorder, bias add or relu pass, so the sum is
 * the kernels' lower bound for the step. Each distinct item is timed once
 * (warm-up runs, then the median of repeats) and its time counted for
 * every item of the same geometry.
 *
 * Threading: timing sets the calling thread's OpenMP team; call it from
 * the main thread, with no kernels running. */
#ifndef PE_BENCH_ROOFLINE_H
#define PE_BENCH_ROOFLINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "fma_peak.h"
#include "ir/program.h"

typedef enum pe_roof_kind {
  PE_ROOF_GEMM,          /* batch x op(A)[m,k] · op(B)[k,n] */
  PE_ROOF_CONV_FWD,      /* conv2d forward */
  PE_ROOF_CONV_BWD_DATA, /* conv2d_grad: Input@GRAD */
  PE_ROOF_CONV_BWD_WEI,  /* conv2d_grad: Filter@GRAD (and Bias@GRAD) */
} pe_roof_kind;

/* What decides an item's kernel; zeroed before filling, so that two items
 * of the same geometry compare equal byte for byte. */
typedef struct pe_roof_geom {
  int64_t kind;
  int64_t batch, m, k, n, ta, tb; /* GEMM: ta/tb: A/B stored transposed */
  int64_t gemm_impl;              /* GEMM: on oneDNN's gemm-based matmul (matmul_weights.h) */
  int64_t x[4], w[4];             /* conv: Input NCHW, Filter OIHW */
  int64_t strides[2], pads[2], dilations[2], groups, bias;
} pe_roof_geom;

typedef struct pe_roof_item {
  pe_roof_geom g;
  char op[40];  /* the op type */
  int op_index; /* in the main block */
  double ms;    /* one run's median time (pe_roof_time), 0 until timed */
} pe_roof_item;

typedef struct pe_roof_list {
  int n, cap;
  pe_roof_item *items; /* owned */
} pe_roof_list;

/* What pe_roof_time measured, summed over the items. */
typedef struct pe_roof_totals {
  double gemm_ms, conv_ms; /* per step */
  double gemm_gflop, conv_gflop;
  int gemms, convs; /* items */
  int distinct;     /* items timed (distinct geometries) */
  double seconds;   /* wall time the timing took (builds included) */
  pe_fma_peak peak; /* the team's FMA peak (fma_peak.h); gflops 0: not measured */
} pe_roof_totals;

/* List the GEMMs and convolutions of p's main block (p compiled) at this
 * batch. An op whose shapes are not all known once the batch is set is an
 * error naming the op, the variable and its shape. */
pe_status *pe_roof_collect(const pe_program *p, int64_t batch, pe_roof_list *out);
void pe_roof_list_free(pe_roof_list *l);
/* The same for a model's encoded program, compiled for training as the
 * sequential executor compiles it (keep: a fetch the passes keep, "" for
 * none; fuse_ops: the fuse_conv_act pass). */
pe_status *pe_roof_collect_model(const uint8_t *bytes, size_t len, const char *keep, bool fuse_ops,
                                 int64_t batch, pe_roof_list *out);

/* Floating-point operations of one item (a multiply-add counts 2). */
double pe_roof_flop(const pe_roof_item *it);
/* "gemm", "conv_fwd", "conv_bwd_data", "conv_bwd_weights". */
const char *pe_roof_kind_name(int64_t kind);

/* Time every item on `threads` OpenMP threads (>= 1): `repeats` timed runs
 * (>= 1) after `warmup`, the median kept in each item's ms. */
pe_status *pe_roof_time(pe_roof_list *l, int threads, int warmup, int repeats, pe_roof_totals *out);

/* The JSON keys of a measured roofline against a step's time:
 * ,"step_ms":..,"roofline_gemm_conv_ms":..,"roofline_fraction":..,
 * "roofline":{...} (docs/benchmarks.md); with t->peak measured, the
 * roofline's object also holds the peak and two fractions of it: the
 * kernels' rate alone and the step's (its GEMM and convolution operations
 * over the step's time). Operations are counted as the direct algorithm
 * does them, so a step on Winograd convolutions can pass 1. */
void pe_roof_json(FILE *f, const pe_roof_totals *t, double step_ms, int threads, int64_t batch);

#endif
