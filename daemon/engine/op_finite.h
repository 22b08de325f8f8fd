/* The NaN/Inf debug check of a run (RunOptions.check_nan_inf, `pe-client
 * train --check-nan-inf`; PaddlePaddle's FLAGS_check_nan_inf): after every
 * op, its outputs are scanned (core/finite.h) and the first op that writes
 * a non-finite value fails the run, naming the op, the output, the first
 * bad element and the inputs that were non-finite already (propagated, not
 * produced there). Feeds are checked before the run. Off by default: the
 * executors then pay one branch per op. Host memory only (cpu and sim
 * places): the parallel executor refuses the option on a cuda place.
 * Callers: pe_op_run (both executors), the sharded update's last chunk
 * (parallel/collective_nodes.c), the executors' feed loads. */
#ifndef PE_ENGINE_OP_FINITE_H
#define PE_ENGINE_OP_FINITE_H

#include "ops/registry.h"

/* After kc's op ran: NULL when every output is finite, else PE_EINVAL
 * starting "op #i (type)" (the executors add node and place). ml gives the
 * variable names (pe_op_run's layout: inputs then outputs). An input that
 * is also an output (an in-place update) is not listed among the inputs:
 * its value before the op is gone. */
pe_status *pe_op_check_finite(const pe_kernel_ctx *kc, const pe_meta_list *ml);
/* A feed about to be run: NULL when finite, else PE_EINVAL naming it as a
 * feed; `where` is appended to the name ("" or " (part of place 1)"). */
pe_status *pe_feed_check_finite(const char *name, const pe_tensor *t, const char *where);

#endif
