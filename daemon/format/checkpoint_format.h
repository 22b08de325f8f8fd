/* The checkpoint file format: what the daemon's checkpoints and pe-client's
 * export files hold. Depends on daemon/core only (pe-client links it without
 * the daemon).
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
 * truncated ("N of at least M bytes"), else as the CRC mismatch. */
#ifndef PE_FORMAT_CHECKPOINT_FORMAT_H
#define PE_FORMAT_CHECKPOINT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "core/model_mark.h" /* pe_run_origin, pe_model_mark */
#include "core/status.h"
#include "core/tensor.h"

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
 * version 03); release it with pe_model_mark_release (core/model_mark.h). */
pe_status *pe_ckpt_decode(const uint8_t *buf, size_t len, const char *what, pe_ckpt_entry **e,
                          int *n, pe_model_mark *mark);

/* CRC-32 (IEEE, zlib's crc32) of n bytes. */
uint32_t pe_crc32(const uint8_t *p, size_t n);

#endif
