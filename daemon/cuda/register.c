/* The cuda backend joins the engine and the op registry when the program
 * loads: its row of the device kind table (device_cuda.c, with its NCCL
 * collectives), its kernel table (kernel_table.c) and its node communicator
 * for jobs across nodes (node_comm_cuda.c). None names a
 * backend; this constructor runs before main, so before any thread opens a
 * device or looks up an op.
 *
 * A static library's member that nothing references is left out of the
 * link, constructor and all. cmake/cuda.cmake therefore has every program
 * that links libpe keep this one (the linker's --undefined=pe_cuda_register):
 * one line there instead of a registration call in each program (daemon,
 * pe-client, pe-bench, every test), none of which can then forget it. */
#include "cuda/cuda_ctx.h"
#include "cuda/nccl_nodes.h"
#include "cuda/ops_cuda.h"

__attribute__((constructor)) void pe_cuda_register(void);

void pe_cuda_register(void) {
  pe_device_register_kind(PE_PLACE_CUDA, &pe_device_cuda_ops);
  pe_op_register_kernels(PE_PLACE_CUDA, pe_cuda_kernel_table);
  pe_node_comm_register_backend(PE_PLACE_CUDA, &pe_cuda_node_comm_backend);
}
