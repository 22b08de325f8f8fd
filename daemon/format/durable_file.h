/* Files written crash-consistently, and read whole.
 *
 * Writes: <file>.tmp.<pid>.<n> in the same directory, write, fsync,
 * rename over <file>, fsync the directory: a crash leaves either the
 * old file or the new one, never a torn one. Thread-safety: functions are
 * reentrant; concurrent saves of one name race only on which rename wins. */
#ifndef PE_FORMAT_DURABLE_FILE_H
#define PE_FORMAT_DURABLE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/status.h"

/* mkdir -p with mode for the components it creates. */
pe_status *pe_mkdir_p(const char *path, mode_t mode);
/* Atomically replace dir/file with buf (temp file, fsync, rename, dir fsync). */
pe_status *pe_write_atomic(const char *dir, const char *file, const uint8_t *buf, size_t len);
/* Remove dir/file and make that durable (directory fsync); *existed: there
 * was such a file (none is not an error). */
pe_status *pe_remove_durable(const char *dir, const char *file, bool *existed);
/* Read a whole file (at most max bytes). */
pe_status *pe_read_file(const char *path, size_t max, uint8_t **buf, size_t *len);

#endif
