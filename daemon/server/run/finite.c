/* The non-finite loss check of a training run (see run/finite.h). */
#include "server/run/finite.h"

#include "core/finite.h"

const char *pe_run_finite_loss(const pe_srv_program *p, bool on) {
  if (!on || p->for_test) return NULL;
  const pe_graph *g = pe_par_exec_graph(p->exec);
  return g && g->loss && g->loss[0] ? g->loss : NULL;
}

pe_status *pe_run_finite_check(const pe_srv_program *p, const char *loss, const pe_tensor *t,
                               uint64_t step) {
  int64_t first;
  if (!pe_tensor_nonfinite(t, &first)) return NULL;
  return pe_error(PE_EINVAL,
                  "run: model '%s': the loss '%s' is %s at step %llu of the request: training "
                  "diverged (or a feed holds NaN/Inf); the step's update was applied, so the "
                  "parameters may be non-finite now (checkpoint writes refuse such values and "
                  "keep the last good file: load it, lower the learning rate or clip gradients; "
                  "config [runtime] check_finite = false trains on regardless)",
                  p->model->name, loss, pe_tensor_nonfinite_str(t, first),
                  (unsigned long long)step);
}
