/* Learning-rate schedules: names and checks (lr_schedule.h). Every entry
 * point (decode, Register's optimizer override, the optimizer pass, the
 * lr_schedule op's attributes) checks through pe_lr_params_check, so a
 * schedule the daemon accepts once it accepts everywhere. */
#include "ops/lr_schedule.h"

#include <stdbool.h>
#include <string.h>

static const char *const names[PE_LR_KIND_COUNT] = {"constant",    "step",   "multistep",
                                                    "exponential", "cosine", "linear"};

bool pe_lr_kind_parse(const char *name, int *kind) {
  for (int k = 0; name && k < PE_LR_KIND_COUNT; k++)
    if (strcmp(name, names[k]) == 0) {
      *kind = k;
      return true;
    }
  return false;
}

const char *pe_lr_kind_name(int kind) {
  return kind >= 0 && kind < PE_LR_KIND_COUNT ? names[kind] : "?";
}

const char *pe_lr_kind_list(void) {
  return "constant, step, multistep, exponential, cosine, linear";
}

pe_status *pe_lr_params_check(pe_lr_params *p) {
  const char *k = pe_lr_kind_name(p->kind);
  if (p->kind < 0 || p->kind >= PE_LR_KIND_COUNT)
    return pe_error(PE_EINVAL, "lr_schedule: kind %d unknown (%s)", p->kind, pe_lr_kind_list());
  if (!isfinite(p->base) || p->base <= 0)
    return pe_error(PE_EINVAL, "lr_schedule %s: learning rate %g must be finite and > 0", k,
                    p->base);
  if (p->warmup < 0)
    return pe_error(PE_EINVAL, "lr_schedule %s: warmup_steps %lld must be >= 0", k,
                    (long long)p->warmup);
  if (p->decay_steps < 0)
    return pe_error(PE_EINVAL, "lr_schedule %s: decay_steps %lld must be >= 0", k,
                    (long long)p->decay_steps);
  bool uses_gamma =
      p->kind == PE_LR_STEP || p->kind == PE_LR_MULTISTEP || p->kind == PE_LR_EXPONENTIAL;
  if ((p->kind == PE_LR_STEP || p->kind == PE_LR_MULTISTEP) && p->gamma == 0) p->gamma = 0.1;
  if (p->kind == PE_LR_EXPONENTIAL && p->decay_steps == 0) p->decay_steps = 1;
  if (uses_gamma && !(p->gamma > 0 && p->gamma <= 1))
    return pe_error(PE_EINVAL, "lr_schedule %s: gamma %g must be in (0, 1]", k, p->gamma);
  if ((p->kind == PE_LR_STEP || p->kind == PE_LR_COSINE || p->kind == PE_LR_LINEAR) &&
      p->decay_steps == 0)
    return pe_error(PE_EINVAL, "lr_schedule %s: decay_steps must be > 0 (%s)", k,
                    p->kind == PE_LR_STEP ? "the steps between decays"
                                          : "the steps from the learning rate to min_lr");
  if ((p->kind == PE_LR_COSINE || p->kind == PE_LR_LINEAR) &&
      !(p->min_lr >= 0 && p->min_lr < p->base))
    return pe_error(PE_EINVAL, "lr_schedule %s: min_lr %g must be in [0, learning rate %g)", k,
                    p->min_lr, p->base);
  if (p->n_milestones < 0 || p->n_milestones > PE_LR_MAX_MILESTONES)
    return pe_error(PE_EINVAL, "lr_schedule %s: %d milestones (at most %d)", k, p->n_milestones,
                    PE_LR_MAX_MILESTONES);
  if (p->kind == PE_LR_MULTISTEP && p->n_milestones == 0)
    return pe_error(PE_EINVAL, "lr_schedule multistep: no milestones (the steps to decay at)");
  if (p->kind != PE_LR_MULTISTEP && p->n_milestones > 0)
    return pe_error(PE_EINVAL, "lr_schedule %s: milestones are for multistep only", k);
  for (int i = 0; i < p->n_milestones; i++)
    if (p->milestones[i] <= (i ? p->milestones[i - 1] : 0))
      return pe_error(PE_EINVAL,
                      "lr_schedule multistep: milestone %d (%lld) must be > 0 and greater than "
                      "the one before",
                      i, (long long)p->milestones[i]);
  return NULL;
}

pe_status *pe_lr_params_from_desc(const pe_lr_schedule_desc *d, float base, pe_lr_params *out) {
  memset(out, 0, sizeof *out);
  if (!pe_lr_kind_parse(d->type, &out->kind))
    return pe_error(PE_EINVAL, "lr_schedule: type '%.64s' unknown (%s)", d->type ? d->type : "",
                    pe_lr_kind_list());
  out->base = base;
  out->gamma = d->gamma;
  out->min_lr = d->min_lr;
  out->warmup = d->warmup_steps;
  out->decay_steps = d->decay_steps;
  out->n_milestones = d->n_milestones;
  if (d->n_milestones > 0 && d->n_milestones <= PE_LR_MAX_MILESTONES)
    memcpy(out->milestones, d->milestones, (size_t)d->n_milestones * sizeof(int64_t));
  return pe_lr_params_check(out);
}
