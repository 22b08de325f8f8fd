/* A model's parameters in a file of one's own, in pe-executord's checkpoint
 * format, written and read by the daemon's own code (daemon/format: CRC,
 * atomic replace): a file written here loads with `pe-client load` once
 * copied into the daemon's state directory (or with `pe-client import`),
 * and a checkpoint or `pe-client export` file reads here. The values travel
 * to and from a model through pe_client_get_params / pe_client_set_params.
 * No connection; any thread, one file per call. */
#ifndef PE_PARAMS_FILE_H
#define PE_PARAMS_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "pe_client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tensors read from a file, in name order: t[i]'s name and data point into
 * the file's entries (impl), valid until pe_params_file_free. */
typedef struct pe_params_file {
  pe_client_tensor *t;
  size_t n;
  void *impl;
} pe_params_file;

/* Write t[0..n) to path, replacing it atomically (a temporary file in the
 * same directory, fsync, rename; mode 0640 before umask). Each tensor needs
 * a name (unique), a known dtype, 0..PE_CLIENT_MAX_DIMS dims >= 0 and
 * nbytes = numel x dtype size; shm_region is not read. *bytes (may be
 * NULL): the file's size. Returns 0, or -1 with the reason in err (naming
 * the tensor or the file). */
int pe_params_file_write(const pe_client_tensor *t, size_t n, const char *path, uint64_t *bytes,
                         char *err, size_t errlen);
/* Read path, checked (format version, counts and sizes, CRC) before
 * anything is returned. Returns 0 and *out (free with pe_params_file_free),
 * or -1 with the reason in err, which names the file. */
int pe_params_file_read(const char *path, pe_params_file *out, char *err, size_t errlen);
/* Releases what pe_params_file_read returned; NULL or a zeroed one: nothing. */
void pe_params_file_free(pe_params_file *p);

#ifdef __cplusplus
}
#endif

#endif
