/* A model's parameters in a file of one's own (pe-client export, import,
 * train --init-from): the daemon's checkpoint format, written and read by
 * its own code (daemon/server/checkpoint/file.h: CRC, atomic replace), so
 * that a file exported here loads with `pe-client load` once copied into
 * the state directory, and a checkpoint of the daemon imports here. The
 * values travel through get_params / set_params. One thread. */
#ifndef PE_CLI_PARAMS_FILE_H
#define PE_CLI_PARAMS_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "pe_client.h"

/* Tensors read from a file; t[i] points into the entries (impl), valid
 * until cli_params_free. */
typedef struct cli_params {
  pe_client_tensor *t;
  size_t n;
  void *impl;
} cli_params;

/* Write t[0..n) to path (replaced atomically; mode 0640 before umask).
 * *bytes: the file's size. Returns 0, or -1 with the reason in err. */
int cli_params_write(const pe_client_tensor *t, size_t n, const char *path, uint64_t *bytes,
                     char *err, size_t errlen);
/* Read path (checked: format, sizes, CRC). Returns 0, or -1 with err. */
int cli_params_read(const char *path, cli_params *out, char *err, size_t errlen);
void cli_params_free(cli_params *p);

#endif
