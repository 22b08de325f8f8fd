CMakeFiles/pe.dir/daemon/ops/cpu/matmul.c.o: \
 /work/main/daemon/ops/cpu/matmul.c /usr/include/stdc-predef.h \
 /usr/include/string.h \
 /usr/include/x86_64-linux-gnu/bits/libc-header-start.h \
 /usr/include/features.h /usr/include/features-time64.h \
 /usr/include/x86_64-linux-gnu/bits/wordsize.h \
 /usr/include/x86_64-linux-gnu/bits/timesize.h \
 /usr/include/x86_64-linux-gnu/sys/cdefs.h \
 /usr/include/x86_64-linux-gnu/bits/long-double.h \
 /usr/include/x86_64-linux-gnu/gnu/stubs.h \
 /usr/include/x86_64-linux-gnu/gnu/stubs-64.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stddef.h \
 /usr/include/x86_64-linux-gnu/bits/types/locale_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/__locale_t.h \
 /usr/include/strings.h /work/main/daemon/ops/cpu/dnnl_util.h \
 /usr/include/oneapi/dnnl/dnnl.h /usr/include/oneapi/dnnl/dnnl_config.h \
 /usr/include/oneapi/dnnl/dnnl_types.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stdint.h /usr/include/stdint.h \
 /usr/include/x86_64-linux-gnu/bits/types.h \
 /usr/include/x86_64-linux-gnu/bits/typesizes.h \
 /usr/include/x86_64-linux-gnu/bits/time64.h \
 /usr/include/x86_64-linux-gnu/bits/wchar.h \
 /usr/include/x86_64-linux-gnu/bits/stdint-intn.h \
 /usr/include/x86_64-linux-gnu/bits/stdint-uintn.h \
 /usr/include/oneapi/dnnl/dnnl_version.h \
 /work/main/daemon/ops/device_ctx.h /work/main/daemon/core/place.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stdbool.h \
 /work/main/daemon/core/status.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stdarg.h \
 /work/main/daemon/core/status.h /work/main/daemon/ops/registry.h \
 /work/main/daemon/compiler/program.h /work/main/daemon/core/dtype.h \
 /work/main/daemon/core/strmap.h /work/main/daemon/core/rng.h \
 /work/main/daemon/core/tensor.h /work/main/daemon/core/allocator.h \
 /work/main/daemon/core/dtype.h /work/main/daemon/core/place.h \
 /work/main/daemon/ops/op_tables.h
