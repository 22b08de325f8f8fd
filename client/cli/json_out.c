/* JSON strings and the failure line (json_out.h). */
#include "json_out.h"

#include <math.h>

void cli_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

void cli_json_num(FILE *f, const char *fmt, double v) {
  if (isfinite(v))
    fprintf(f, fmt, v);
  else
    fputs("null", f);
}

void cli_json_failure(FILE *f, const char *key, const char *name, const char *error,
                      const char *code) {
  fprintf(f, "{\"%s\":", key);
  if (name)
    cli_json_str(f, name);
  else
    fputs("null", f);
  fputs(",\"ok\":false,\"error\":", f);
  cli_json_str(f, error);
  fputs(",\"code\":", f);
  cli_json_str(f, code);
  fputs("}\n", f);
  fflush(f);
}
