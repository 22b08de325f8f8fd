/* The end of every test that builds a program with libpeclient's builder:
 * serialise it, free the builder, and decode the bytes the way the daemon
 * does. Fails the test (with the builder's or decoder's message) on error. */
#ifndef PE_TESTS_BUILDER_UTIL_H
#define PE_TESTS_BUILDER_UTIL_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "ir/program.h"
#include "core/status.h"
#include "pe_builder.h"

static inline pe_program *tb_finish(pe_builder *b) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_msg(pe_builder_finish(b, &bytes, &len) == 0, "%s", pe_builder_error(b));
  pe_builder_free(b);
  pe_program *p = NULL;
  pe_status *st = pe_program_decode(bytes, len, &p);
  free(bytes);
  ck_assert_msg(st == NULL, "decoding the built program: %s", st ? pe_status_msg(st) : "");
  return p;
}

#endif
