/* Output files of the command-line tools (pe-client trace --out, pe-bench
 * --timeline and --dump-graph) are checked before the work that produces
 * them, so a bad path fails at once instead of after a training run. */
#ifndef PE_OUT_PATH_H
#define PE_OUT_PATH_H

#include <stddef.h>

/* Whether path can be written: an existing file that is writable, or a new
 * name in an existing, writable directory. Creates nothing. Returns 0, or
 * -1 with "PATH: <strerror>" in err. */
int cli_out_path_check(const char *path, char *err, size_t errlen);

#endif
