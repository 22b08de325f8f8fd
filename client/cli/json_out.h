/* JSON output of the command-line tools (pe-client, pe-bench): --json
 * prints one object as the last stdout line, on success and on failure. */
#ifndef PE_JSON_OUT_H
#define PE_JSON_OUT_H

#include <stdio.h>

/* s as a JSON string (quoted, escaped) onto f; NULL: "". */
void cli_json_str(FILE *f, const char *s);

/* The failure line: {"<key>":"<name>","ok":false,"error":"...","code":"..."}
 * (key "cmd" for pe-client, "bench" for pe-bench; name NULL: null). */
void cli_json_failure(FILE *f, const char *key, const char *name, const char *error,
                      const char *code);

#endif
