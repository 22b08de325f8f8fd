
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/daemon/compiler/backward.c" "CMakeFiles/pe.dir/daemon/compiler/backward.c.o" "gcc" "CMakeFiles/pe.dir/daemon/compiler/backward.c.o.d"
  "/work/main/daemon/compiler/optimizer.c" "CMakeFiles/pe.dir/daemon/compiler/optimizer.c.o" "gcc" "CMakeFiles/pe.dir/daemon/compiler/optimizer.c.o.d"
  "/work/main/daemon/compiler/pass.c" "CMakeFiles/pe.dir/daemon/compiler/pass.c.o" "gcc" "CMakeFiles/pe.dir/daemon/compiler/pass.c.o.d"
  "/work/main/daemon/compiler/program.c" "CMakeFiles/pe.dir/daemon/compiler/program.c.o" "gcc" "CMakeFiles/pe.dir/daemon/compiler/program.c.o.d"
  "/work/main/daemon/compiler/program_pb.c" "CMakeFiles/pe.dir/daemon/compiler/program_pb.c.o" "gcc" "CMakeFiles/pe.dir/daemon/compiler/program_pb.c.o.d"
  "/work/main/daemon/compiler/validate.c" "CMakeFiles/pe.dir/daemon/compiler/validate.c.o" "gcc" "CMakeFiles/pe.dir/daemon/compiler/validate.c.o.d"
  "/work/main/daemon/compiler/validate_order.c" "CMakeFiles/pe.dir/daemon/compiler/validate_order.c.o" "gcc" "CMakeFiles/pe.dir/daemon/compiler/validate_order.c.o.d"
  "/work/main/daemon/core/allocator.c" "CMakeFiles/pe.dir/daemon/core/allocator.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/allocator.c.o.d"
  "/work/main/daemon/core/dtype.c" "CMakeFiles/pe.dir/daemon/core/dtype.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/dtype.c.o.d"
  "/work/main/daemon/core/log.c" "CMakeFiles/pe.dir/daemon/core/log.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/log.c.o.d"
  "/work/main/daemon/core/place.c" "CMakeFiles/pe.dir/daemon/core/place.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/place.c.o.d"
  "/work/main/daemon/core/rng.c" "CMakeFiles/pe.dir/daemon/core/rng.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/rng.c.o.d"
  "/work/main/daemon/core/scope.c" "CMakeFiles/pe.dir/daemon/core/scope.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/scope.c.o.d"
  "/work/main/daemon/core/status.c" "CMakeFiles/pe.dir/daemon/core/status.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/status.c.o.d"
  "/work/main/daemon/core/strmap.c" "CMakeFiles/pe.dir/daemon/core/strmap.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/strmap.c.o.d"
  "/work/main/daemon/core/tensor.c" "CMakeFiles/pe.dir/daemon/core/tensor.c.o" "gcc" "CMakeFiles/pe.dir/daemon/core/tensor.c.o.d"
  "/work/main/daemon/engine/seq_executor.c" "CMakeFiles/pe.dir/daemon/engine/seq_executor.c.o" "gcc" "CMakeFiles/pe.dir/daemon/engine/seq_executor.c.o.d"
  "/work/main/daemon/ops/cpu/activation.c" "CMakeFiles/pe.dir/daemon/ops/cpu/activation.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/activation.c.o.d"
  "/work/main/daemon/ops/cpu/batch_norm.c" "CMakeFiles/pe.dir/daemon/ops/cpu/batch_norm.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/batch_norm.c.o.d"
  "/work/main/daemon/ops/cpu/broadcast.c" "CMakeFiles/pe.dir/daemon/ops/cpu/broadcast.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/broadcast.c.o.d"
  "/work/main/daemon/ops/cpu/conv.c" "CMakeFiles/pe.dir/daemon/ops/cpu/conv.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/conv.c.o.d"
  "/work/main/daemon/ops/cpu/creation.c" "CMakeFiles/pe.dir/daemon/ops/cpu/creation.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/creation.c.o.d"
  "/work/main/daemon/ops/cpu/dnnl_util.c" "CMakeFiles/pe.dir/daemon/ops/cpu/dnnl_util.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/dnnl_util.c.o.d"
  "/work/main/daemon/ops/cpu/dropout.c" "CMakeFiles/pe.dir/daemon/ops/cpu/dropout.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/dropout.c.o.d"
  "/work/main/daemon/ops/cpu/elementwise.c" "CMakeFiles/pe.dir/daemon/ops/cpu/elementwise.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/elementwise.c.o.d"
  "/work/main/daemon/ops/cpu/loss.c" "CMakeFiles/pe.dir/daemon/ops/cpu/loss.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/loss.c.o.d"
  "/work/main/daemon/ops/cpu/matmul.c" "CMakeFiles/pe.dir/daemon/ops/cpu/matmul.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/matmul.c.o.d"
  "/work/main/daemon/ops/cpu/metric.c" "CMakeFiles/pe.dir/daemon/ops/cpu/metric.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/metric.c.o.d"
  "/work/main/daemon/ops/cpu/optimizer.c" "CMakeFiles/pe.dir/daemon/ops/cpu/optimizer.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/optimizer.c.o.d"
  "/work/main/daemon/ops/cpu/pool.c" "CMakeFiles/pe.dir/daemon/ops/cpu/pool.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/pool.c.o.d"
  "/work/main/daemon/ops/cpu/shape.c" "CMakeFiles/pe.dir/daemon/ops/cpu/shape.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/cpu/shape.c.o.d"
  "/work/main/daemon/ops/device_ctx.c" "CMakeFiles/pe.dir/daemon/ops/device_ctx.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/device_ctx.c.o.d"
  "/work/main/daemon/ops/registry.c" "CMakeFiles/pe.dir/daemon/ops/registry.c.o" "gcc" "CMakeFiles/pe.dir/daemon/ops/registry.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/CMakeFiles/pe_proto.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
