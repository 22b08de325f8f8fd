#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Returned when even the error cannot be allocated; never freed. */
static pe_status *oom_status(void) {
  static struct {
    pe_code code;
    char msg[32];
  } oom = {PE_ENOMEM, "out of memory"};
  return (pe_status *)&oom;
}

pe_status *pe_verror(pe_code code, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  pe_status *st = malloc(sizeof(*st) + (size_t)n + 1);
  if (!st) return oom_status();
  st->code = code;
  vsnprintf(st->msg, (size_t)n + 1, fmt, ap);
  return st;
}

pe_status *pe_error(pe_code code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pe_status *st = pe_verror(code, fmt, ap);
  va_end(ap);
  return st;
}

pe_status *pe_status_wrap(pe_status *st, const char *fmt, ...) {
  if (!st) return NULL;
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  pe_status *out = pe_error(st->code, "%s: %s", prefix, st->msg);
  pe_status_free(st);
  return out;
}

void pe_status_free(pe_status *st) {
  if (st && st != oom_status()) free(st);
}

const char *pe_code_name(pe_code code) {
  static const char *names[PE_ECODE_COUNT] = {
      [PE_OK] = "OK",
      [PE_EINVAL] = "INVALID_ARGUMENT",
      [PE_ENOMEM] = "OUT_OF_MEMORY",
      [PE_ENOTFOUND] = "NOT_FOUND",
      [PE_EUNKNOWN_OP] = "UNKNOWN_OP",
      [PE_EUNKNOWN_VAR] = "UNKNOWN_VARIABLE",
      [PE_EATTR] = "BAD_ATTRIBUTE",
      [PE_EARITY] = "BAD_ARITY",
      [PE_ESHAPE] = "SHAPE_MISMATCH",
      [PE_EDTYPE] = "DTYPE_MISMATCH",
      [PE_EUSE_BEFORE_DEF] = "USE_BEFORE_DEFINITION",
      [PE_ECYCLE] = "CYCLE",
      [PE_EMISSING_FEED] = "MISSING_FEED",
      [PE_EIO] = "IO_ERROR",
      [PE_ECORRUPT] = "CORRUPT_DATA",
      [PE_ENOGRAD] = "NO_GRADIENT",
      [PE_EBACKEND] = "BACKEND_ERROR",
      [PE_EINTERNAL] = "INTERNAL",
      [PE_EALREADY] = "ALREADY_APPLIED",
      [PE_EPERM] = "PERMISSION_DENIED",
      [PE_EEXHAUSTED] = "RESOURCE_EXHAUSTED",
      [PE_EDEADLINE] = "DEADLINE_EXCEEDED",
      [PE_ESHUTDOWN] = "SHUTTING_DOWN",
  };
  if ((unsigned)code >= PE_ECODE_COUNT || !names[code]) return "UNKNOWN_CODE";
  return names[code];
}
