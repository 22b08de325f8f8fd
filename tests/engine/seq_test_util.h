/* Helpers shared by the sequential executor's tests (test_seq_executor*.c):
 * a host f32 tensor to feed. Header-only; each suite is its own executable. */
#ifndef PE_TESTS_SEQ_TEST_UTIL_H
#define PE_TESTS_SEQ_TEST_UTIL_H

#include <string.h>

#include "../compiler/prog_util.h"

static inline pe_tensor make_f32(pe_shape shape, const float *v) {
  pe_tensor t;
  pe_tensor_init(&t);
  PU_OK(pe_tensor_resize(&t, PE_F32, &shape, "t"));
  if (v) memcpy(t.data, v, pe_tensor_bytes(&t));
  return t;
}

#endif
