/* Trimming the C heap after large programs (heap_trim.h). */
#include "server/heap_trim.h"

#include <malloc.h>

void pe_heap_trim_setup(void) {
  mallopt(M_TRIM_THRESHOLD, (int)PE_HEAP_TRIM_TOP_BYTES);
  mallopt(M_MMAP_THRESHOLD, (int)PE_HEAP_MMAP_BYTES);
}

void pe_heap_trim_after_program(size_t program_bytes) {
  if (program_bytes >= PE_HEAP_TRIM_PROGRAM_BYTES) malloc_trim(0);
}
