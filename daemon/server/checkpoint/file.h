/* Checkpoint files: name validation, the on-disk format and crash-consistent
 * writes. No model here (checkpoint/save_load.c glues this to pe_model), so this part
 * is testable without an executor.
 *
 * Layout under the state directory:
 *     <state_dir>/models/<model>/<name>.ckpt
 * Model and checkpoint names: [A-Za-z0-9._-]{1,64}, not starting with '.'
 * (no "..", no '/', no hidden files).
 *
 * Format (all integers little-endian):
 *     magic    8 bytes  "PECKPT03" ("PECKPT02": without the generator
 *                       record; "PECKPT01": without origins either)
 *     count    u32      number of tensors
 *     then per tensor, in name order:
 *       name_len u32, name bytes (no NUL)
 *       dtype    u32  (pe_dtype)
 *       ndim     u32  (<= PE_MAX_DIMS)
 *       dims     i64 x ndim (each >= 0)
 *       nbytes   u64  (= numel * dtype size)
 *       data     nbytes, row-major
 *     n_origins u32     run origins: which requests the values include
 *     then per origin: client u64, request u64, steps u32 (pe_run_origin)
 *     has_rng  u32      1: the model generator's offset follows, 0: unknown
 *     rng_offset u64    (pe_model_mark: the random state of the snapshot)
 *     crc32    u32      CRC-32 (IEEE) of every byte before it
 * The reader checks every count and size against the file length before
 * using it, and the CRC before returning anything; a "PECKPT" magic of
 * another version is named as such, before the CRC is looked at. A file
 * that fails its CRC and is the start of a well-formed one is reported as
 * truncated ("N of at least M bytes"), else as the CRC mismatch.
 *
 * Writes: <name>.ckpt.tmp.<pid>.<n> in the same directory, write, fsync,
 * rename over <name>.ckpt, fsync the directory: a crash leaves either the
 * old file or the new one, never a torn one. Thread-safety: functions are
 * reentrant; concurrent saves of one name race only on which rename wins. */
#ifndef PE_SERVER_CHECKPOINT_FILE_H
#define PE_SERVER_CHECKPOINT_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/parallel/executor.h" /* pe_run_origin */

#define PE_NAME_MAX 64

/* [A-Za-z0-9._-]{1,64}, not starting with '.'. */
bool pe_name_valid(const char *name);
/* NULL, or PE_EINVAL naming `what` ("checkpoint name", "model name") and why. */
pe_status *pe_name_check(const char *what, const char *name);

typedef struct pe_ckpt_entry {
  char *name;  /* owned */
  pe_tensor t; /* host tensor, owned */
} pe_ckpt_entry;

void pe_ckpt_entries_free(pe_ckpt_entry *e, int n);

/* Serialise entries (sorted by name by the caller or not: the writer sorts a
 * copy of the order) into a malloc'd buffer. */
/* mark (may be NULL: none): the snapshot's run origins and generator
 * offset (its version is not written). */
pe_status *pe_ckpt_encode(const pe_ckpt_entry *e, int n, const pe_model_mark *mark, uint8_t **buf,
                          size_t *len);
/* mark may be NULL (not wanted); else it gets the file's origins (malloc'd;
 * none in a version 01 file) and generator offset (has_rng false before
 * version 03); release it with pe_model_mark_release. */
pe_status *pe_ckpt_decode(const uint8_t *buf, size_t len, const char *what, pe_ckpt_entry **e,
                          int *n, pe_model_mark *mark);

/* mkdir -p with mode for the components it creates. */
pe_status *pe_mkdir_p(const char *path, mode_t mode);
/* Atomically replace dir/file with buf (temp file, fsync, rename, dir fsync). */
pe_status *pe_write_atomic(const char *dir, const char *file, const uint8_t *buf, size_t len);
/* Remove dir/file and make that durable (directory fsync); *existed: there
 * was such a file (none is not an error). */
pe_status *pe_remove_durable(const char *dir, const char *file, bool *existed);
/* Read a whole file (at most max bytes). */
pe_status *pe_read_file(const char *path, size_t max, uint8_t **buf, size_t *len);

uint32_t pe_crc32(const uint8_t *p, size_t n);

#endif
