# CUDA backend. Included by the root CMakeLists.txt after libpe.
#
# PE_CUDA (cache var, defined in the root file):
#   AUTO  build the backend when nvcc is found (CI machines have the toolkit
#         but no GPU: the backend compiles and links, its tests skip)
#   ON    the same, but a missing toolkit is a configure error
#   OFF   never build it
# When built, libpe gets daemon/cuda/*.c and *.cu, links cudart, cuBLAS,
# cuDNN and NCCL, and carries the PUBLIC definition PE_HAVE_CUDA.
#
# Architectures: one real architecture (sm_90: H100/H200) plus its PTX, so
# newer GPUs JIT the kernels; one target keeps the CI compile short. Override
# with -DCMAKE_CUDA_ARCHITECTURES=... for other GPUs.
string(TOUPPER "${PE_CUDA}" _pe_cuda)
if(_pe_cuda STREQUAL "OFF")
  message(STATUS "CUDA backend: off (PE_CUDA=OFF)")
  return()
endif()
if(NOT _pe_cuda MATCHES "^(AUTO|ON)$")
  message(FATAL_ERROR "PE_CUDA must be AUTO, ON or OFF, got '${PE_CUDA}'")
endif()

# Find nvcc: CUDACXX / CMAKE_CUDA_COMPILER first, then PATH, then the usual prefix.
if(NOT CMAKE_CUDA_COMPILER)
  find_program(PE_NVCC nvcc HINTS ENV CUDA_PATH PATH_SUFFIXES bin PATHS /usr/local/cuda/bin)
  if(PE_NVCC)
    set(CMAKE_CUDA_COMPILER ${PE_NVCC})
  endif()
endif()
if(NOT CMAKE_CUDA_COMPILER)
  if(_pe_cuda STREQUAL "ON")
    message(FATAL_ERROR "PE_CUDA=ON but nvcc was not found (set CMAKE_CUDA_COMPILER or CUDACXX)")
  endif()
  message(STATUS "CUDA backend: off (nvcc not found; PE_CUDA=AUTO)")
  return()
endif()

if(NOT CMAKE_CUDA_ARCHITECTURES)
  # 90-real: SASS for sm_90; 90-virtual: compute_90 PTX for later GPUs.
  set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual" CACHE STRING "CUDA architectures of the backend" FORCE)
endif()
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
enable_language(CUDA)
# Executables that link libpe keep the C linker (gcc): no device link step
# is needed (no separable compilation), and nvcc as the linker would choke
# on the sanitizer link flags.
set(CMAKE_CUDA_LINKER_PREFERENCE_PROPAGATES FALSE)
find_package(CUDAToolkit REQUIRED)

# cuDNN and NCCL are not part of FindCUDAToolkit: look next to the toolkit.
get_filename_component(_pe_cuda_root "${CUDAToolkit_LIBRARY_DIR}/.." ABSOLUTE)
find_path(PE_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_pe_cuda_root}/include)
find_library(PE_CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${_pe_cuda_root}/lib)
find_path(PE_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_pe_cuda_root}/include)
find_library(PE_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${_pe_cuda_root}/lib)
foreach(v PE_CUDNN_INCLUDE PE_CUDNN_LIB PE_NCCL_INCLUDE PE_NCCL_LIB)
  if(NOT ${v})
    set(_msg "CUDA backend: ${v} not found (cuDNN 9 and NCCL are required with the toolkit)")
    if(_pe_cuda STREQUAL "ON")
      message(FATAL_ERROR "${_msg}")
    endif()
    message(STATUS "${_msg}; backend off")
    return()
  endif()
endforeach()

file(GLOB PE_CUDA_SRCS CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/daemon/cuda/*.c ${CMAKE_SOURCE_DIR}/daemon/cuda/*.cu)
target_sources(pe PRIVATE ${PE_CUDA_SRCS})
target_include_directories(pe PUBLIC ${PE_CUDNN_INCLUDE} ${PE_NCCL_INCLUDE})
target_link_libraries(pe PUBLIC CUDA::cudart CUDA::cublas ${PE_CUDNN_LIB} ${PE_NCCL_LIB})
target_compile_definitions(pe PUBLIC PE_HAVE_CUDA)
# The backend registers itself when the program loads (a constructor in
# daemon/cuda/register.c; the engine names no backend). Nothing else
# references that object, and the linker leaves an unreferenced member of a
# static library out, constructor and all: every program that links libpe
# is told to keep it. One place here instead of a registration call in each
# program (daemon, pe-client, pe-bench, every test).
target_link_options(pe INTERFACE "LINKER:--undefined=pe_cuda_register")
# Device code: no host-compiler warnings flood, relocatable code not needed
# (each .cu is self-contained); -lineinfo keeps profiles readable.
target_compile_options(pe PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr>)
# libpe was created before CUDA was enabled: give it the architectures explicitly.
set_target_properties(pe PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
set(PE_HAVE_CUDA ON)
message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
# The cuDNN glue uses the legacy descriptor API, deprecated but kept in cuDNN 9.
set_source_files_properties(${CMAKE_SOURCE_DIR}/daemon/cuda/ops_cuda_dnn.c
  PROPERTIES COMPILE_OPTIONS "-Wno-deprecated-declarations")

# bench/gpu/kernel_times.c: each kernel's GPU time through CUPTI, preloaded
# into a program on a GPU machine (the GPU kit carries it).
if(TARGET CUDA::cupti)
  add_library(pe-kernel-times SHARED ${CMAKE_SOURCE_DIR}/bench/gpu/kernel_times.c)
  target_link_libraries(pe-kernel-times PRIVATE CUDA::cupti Threads::Threads)
  set_target_properties(pe-kernel-times PROPERTIES PREFIX "lib")
endif()
