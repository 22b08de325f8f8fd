/* Shared-memory regions: a client creates a POSIX shm object, registers it
 * (RegisterShm: name + size), and run feeds point into it (ShmRef: region,
 * offset, length), so large batches do not travel through the socket.
 *
 * The daemon maps the object read-only (it never writes client memory).
 * Bounds are checked on every reference: offset + length <= size, without
 * overflow. The region stays mapped while a run uses it: Unregister (or the
 * owner's session expiring) removes it from the table and the last user
 * unmaps it.
 *
 * Names belong to the clients, which unlink them. One whose creator has
 * exited (common/shm_owner.h: a killed trainer) is unlinked by the daemon
 * when its session ends or the daemon stops, where the daemon may.
 *
 * Truncation. A client may shrink the object with ftruncate at any time;
 * touching the lost pages raises SIGBUS. The daemon therefore never hands
 * shm pages to kernels: pe_shm_read copies a reference into daemon memory
 * under a SIGBUS guard (bus_guard.h), and a fault becomes that request's
 * error while the daemon and other clients carry on.
 *
 * Ownership: registering needs the token of the object's trailer
 * (pe_shm_register), so a client cannot register another user's object by
 * its name. Scope: a region belongs to the client that registered it. Reads,
 * pins and unregisters name the requesting client, and another client's
 * id is not found (the same error as an unknown id: ids tell nothing to
 * other clients). Region and client ids are logged at debug level only
 * (clients by their tag above that: client_tag.h).
 *
 * Thread-safe (one mutex). */
#ifndef PE_SERVER_SHM_H
#define PE_SERVER_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pe_shm_table pe_shm_table;

pe_status *pe_shm_table_new(pe_shm_table **out);
void pe_shm_table_free(pe_shm_table *t);

/* name: "/pe-..." ('/' then [A-Za-z0-9._-]{1,200}); size > 0, and the
 * object has at least size + PE_SHM_TRAILER bytes, the trailer at byte
 * size holding token (common/shm_token.h: proof that the caller can read
 * the object, which the daemon opens with its own rights). A missing
 * object, a short one and a wrong or missing token are the same
 * PE_ENOTFOUND, and nothing is mapped. *region: a random nonzero id,
 * unused in this table (ids of a restarted daemon do not repeat the old
 * one's). The same client registering the same name, size and token again
 * gets the same region. */
pe_status *pe_shm_register(pe_shm_table *t, uint64_t client, const char *name, uint64_t size,
                           const uint8_t *token, size_t token_len, uint64_t *region);
/* Only client's own region (else PE_ENOTFOUND). */
pe_status *pe_shm_unregister(pe_shm_table *t, uint64_t client, uint64_t region);
/* Unregister every region of a client (session expiry or close); unlink
 * those whose creator has exited. */
void pe_shm_drop_client(pe_shm_table *t, uint64_t client);

/* Copy [offset, offset+length) of a region into dst (length bytes), guarded
 * against the client truncating the object: PE_EIO then, naming the region
 * and the range. Bounds and unknown regions (or another client's) are
 * PE_EINVAL and PE_ENOTFOUND. The only way to read a region: no caller gets
 * a pointer into client pages. */
pe_status *pe_shm_read(pe_shm_table *t, uint64_t client, uint64_t region, uint64_t offset,
                       uint64_t length, void *dst);

/* A range of a region held for one request (RunRequest.batches: the
 * daemon copies each mini-batch's rows straight from the region when it
 * needs them instead of a private copy of the whole feed first). Pinning
 * checks the bounds once; the mapping stays while pinned, even when the
 * region is unregistered meanwhile. Reads are SIGBUS-guarded copies, as
 * pe_shm_read; the pin is used by one thread at a time or read-only by
 * several (the pool's workers). */
typedef struct pe_shm_pin {
  pe_shm_table *t;
  struct pe_shm_region *g; /* a held reference */
  const void *data;        /* offset's byte in the mapping */
  uint64_t region, offset, length;
} pe_shm_pin;

pe_status *pe_shm_pin_acquire(pe_shm_table *t, uint64_t client, uint64_t region, uint64_t offset,
                              uint64_t length, pe_shm_pin *out);
/* Copy [at, at+length) of the pinned range into dst. */
pe_status *pe_shm_pin_read(const pe_shm_pin *p, uint64_t at, uint64_t length, void *dst);
/* Copy rows rows[0..n) of the pinned range, taken as rows of `row` bytes,
 * into dst (n rows), under one SIGBUS guard; an index outside the range is
 * PE_EINVAL. */
pe_status *pe_shm_pin_read_rows(const pe_shm_pin *p, const int64_t *rows, int64_t n, uint64_t row,
                                void *dst);
/* Release (NULL or never pinned: no-op). */
void pe_shm_pin_release(pe_shm_pin *p);

int pe_shm_count(pe_shm_table *t);

#endif
