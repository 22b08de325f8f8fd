/* Running one op on concrete tensors: the step shared by the sequential and
 * the parallel executor. Given the op's tensors and metas laid out per def
 * slot (inputs then outputs), it checks that every input has a value, runs
 * the row's inference on the concrete shapes, sizes the outputs and calls
 * the kernel.
 *
 * Output sizing: an output that is a view (t->alloc == NULL, data set) keeps
 * its storage when it is large enough (the parallel executor's gradient
 * views into a fused bucket); otherwise the output is (re)allocated from
 * `alloc` (NULL: the tensor's own allocator, else the host allocator), and
 * capacity is kept across calls.
 *
 * Threads: the caller guarantees one writer per output tensor (the
 * executors' dependency order). */
#ifndef PE_ENGINE_OP_RUN_H
#define PE_ENGINE_OP_RUN_H

#include "core/allocator.h"
#include "ops/registry.h"

/* Give t dtype and shape: a view that is large enough keeps its storage,
 * else t is (re)allocated from alloc (NULL: its own allocator or the host
 * one). `name` names the variable in errors. */
pe_status *pe_tensor_fit(pe_tensor *t, pe_allocator *alloc, pe_dtype dt, const pe_shape *shape,
                         const char *name);

/* check_finite: after the kernel, fail on the first output holding NaN or
 * Inf (engine/op_finite.h; the outputs must be in host memory). */
pe_status *pe_op_run(const pe_op_def *def, pe_kernel_fn kernel, pe_tensor_list *tl,
                     pe_meta_list *ml, pe_infer_ctx *ic, pe_kernel_ctx *kc, pe_allocator *alloc,
                     bool check_finite);
/* pe_op_run without the kernel call: the checks, inference and output
 * sizing (for callers that run the kernel on slices themselves). */
pe_status *pe_op_prepare(const pe_op_def *def, pe_tensor_list *tl, pe_meta_list *ml,
                         pe_infer_ctx *ic, pe_allocator *alloc);

#endif
