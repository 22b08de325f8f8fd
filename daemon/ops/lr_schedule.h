/* Learning-rate schedules: the formula of the lr_schedule op, shared by its
 * cpu kernel and its cuda kernel (kernels_elementwise.cu includes this file,
 * so there is one formula), plus the checks every entry point uses (decode,
 * Register's optimizer override, the optimizer pass, the op's attributes).
 *
 * s is the number of updates done before this one (the persistable step
 * counter); t = s - warmup:
 *   s < warmup   base * (s + 1) / warmup            linear warmup
 *   constant     base
 *   step         base * gamma^floor(t / decay_steps)
 *   multistep    base * gamma^(number of milestones <= t)
 *   exponential  base * gamma^(t / decay_steps)
 *   cosine       min_lr + (base - min_lr) * (1 + cos(pi * min(t, T) / T)) / 2
 *   linear       base + (min_lr - base) * min(t, T) / T       (T = decay_steps)
 * PyTorch's StepLR, MultiStepLR, ExponentialLR (decay_steps 1),
 * CosineAnnealingLR (no restarts) and LinearLR, counted in steps. Computed in
 * double, rounded once to the f32 learning rate; a negative counter (set by
 * hand) counts as 0. */
#ifndef PE_OPS_LR_SCHEDULE_H
#define PE_OPS_LR_SCHEDULE_H

#include <math.h>
#include <stdint.h>

#define PE_LR_MAX_MILESTONES 32 /* = ir/program.h's (an identical redefinition) */

#ifdef __CUDACC__
#define PE_LR_HD __host__ __device__
#else
#define PE_LR_HD
#endif

/* The persistable step counter the optimizer pass declares (int64 [1]). */
#define PE_LR_COUNTER_NAME "@LR_DECAY_COUNTER@"

typedef enum pe_lr_kind {
  PE_LR_CONSTANT = 0,
  PE_LR_STEP,
  PE_LR_MULTISTEP,
  PE_LR_EXPONENTIAL,
  PE_LR_COSINE,
  PE_LR_LINEAR,
  PE_LR_KIND_COUNT
} pe_lr_kind;

/* A checked schedule (defaults resolved). Plain data: passed by value to the
 * cuda kernel. */
typedef struct pe_lr_params {
  int kind; /* pe_lr_kind */
  double base, gamma, min_lr;
  int64_t warmup, decay_steps;
  int n_milestones;
  int64_t milestones[PE_LR_MAX_MILESTONES];
} pe_lr_params;

PE_LR_HD static inline double pe_lr_at(const pe_lr_params *p, int64_t s) {
  if (s < 0) s = 0;
  if (s < p->warmup) return p->base * (double)(s + 1) / (double)p->warmup;
  int64_t t = s - p->warmup;
  int64_t tt = t < p->decay_steps ? t : p->decay_steps;
  int k = 0;
  switch (p->kind) {
    case PE_LR_STEP: return p->base * pow(p->gamma, (double)(t / p->decay_steps));
    case PE_LR_MULTISTEP:
      while (k < p->n_milestones && p->milestones[k] <= t) k++;
      return p->base * pow(p->gamma, (double)k);
    case PE_LR_EXPONENTIAL: return p->base * pow(p->gamma, (double)t / (double)p->decay_steps);
    case PE_LR_COSINE:
      return p->min_lr +
             (p->base - p->min_lr) *
                 (1.0 + cos(3.14159265358979323846 * (double)tt / (double)p->decay_steps)) / 2.0;
    case PE_LR_LINEAR: return p->base + (p->min_lr - p->base) * (double)tt / (double)p->decay_steps;
    default: return p->base;
  }
}

#ifndef __CUDACC__
#include <stdbool.h>

#include "ir/program.h" /* pe_lr_schedule_desc */
#include "core/status.h"

/* "cosine" -> PE_LR_COSINE; false if unknown. */
bool pe_lr_kind_parse(const char *name, int *kind);
const char *pe_lr_kind_name(int kind);
/* The names, for messages: "constant, step, multistep, exponential, cosine, linear". */
const char *pe_lr_kind_list(void);
/* Resolve defaults in *p (gamma 0 -> 0.1 for step and multistep, decay_steps
 * 0 -> 1 for exponential) and check it; the error names the field and value. */
pe_status *pe_lr_params_check(pe_lr_params *p);
/* A program's schedule with learning rate `base` -> checked params. */
pe_status *pe_lr_params_from_desc(const pe_lr_schedule_desc *d, float base, pe_lr_params *out);
#endif

#endif
