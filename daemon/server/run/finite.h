/* A training run stops at the first step whose loss is not finite: a
 * diverged model otherwise trains on in NaN with every request
 * "ok", and only its loss curve, if anyone looks, says so. The check reads
 * the loss each step already fetches (a scalar: negligible; the run adds
 * the loss to its fetches when the client did not ask for it). The step
 * whose loss is NaN or Inf has been applied (its update ran in the same
 * graph), so the parameters may be non-finite from here on; checkpoint
 * writes refuse such values (checkpoint/save_load.c), so the last good checkpoint
 * stays. Config [runtime] check_finite = false turns the check off. */
#ifndef PE_SERVER_RUN_FINITE_H
#define PE_SERVER_RUN_FINITE_H

#include <stdint.h>

#include "server/registry/registry.h"

/* The loss a run of p checks (NULL: none): a training program's (not one
 * registered for_test, and with a loss), when `on` (the config key). */
const char *pe_run_finite_loss(const pe_srv_program *p, bool on);
/* NULL when the loss value t (fetched at step `step`, 0-based) is finite;
 * else the run's error, naming the model, the loss variable, the value and
 * the step (the caller appends which steps stay applied). */
pe_status *pe_run_finite_check(const pe_srv_program *p, const char *loss, const pe_tensor *t,
                               uint64_t step);

#endif
