/* JSON output of the command-line tools (pe-client, pe-bench): --json
 * prints one object as the last stdout line, on success and on failure. */
#ifndef PE_JSON_OUT_H
#define PE_JSON_OUT_H

#include <stdio.h>

/* s as a JSON string (quoted, escaped) onto f; NULL: "". */
void cli_json_str(FILE *f, const char *s);

/* v as a JSON number printed with fmt (a printf format of one double), or
 * null when it is NaN or infinite: JSON has no such numbers, and "-nan"
 * breaks every parser (a diverged run's loss is exactly when scripts read
 * it). */
void cli_json_num(FILE *f, const char *fmt, double v);

/* The failure line: {"<key>":"<name>","ok":false,"error":"...","code":"..."}
 * (key "cmd" for pe-client, "bench" for pe-bench; name NULL: null). */
void cli_json_failure(FILE *f, const char *key, const char *name, const char *error,
                      const char *code);

#endif
