/* Proof that a RegisterShm comes from someone who can read the region.
 *
 * The daemon opens a region by name with its own rights, and names are
 * listed in /dev/shm: a name alone would let any client of the daemon feed
 * from (and fetch back) another user's region. So a region carries a
 * trailer of PE_SHM_TRAILER bytes right after the size it is registered
 * with:
 *
 *   [size, size + 8)        magic "pe-shmt1"
 *   [size + 8, size + 24)   token: 16 random bytes (getrandom)
 *   [size + 24, size + 64)  zero
 *
 * and RegisterShm carries the token (ShmRequest.token). The daemon reads
 * the trailer and compares (constant time); only who can read the object
 * (its owner, and the daemon through its ACL entry) knows the token. The
 * size registered, and every offset, stay those of the caller's data.
 *
 * Compiled into libpeclient and the daemon. No state; thread-safe. */
#ifndef PE_COMMON_SHM_TOKEN_H
#define PE_COMMON_SHM_TOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PE_SHM_TRAILER 64
#define PE_SHM_TOKEN_LEN 16

/* A fresh random token; -1 (errno set) when the kernel gives no entropy:
 * no token is better than a guessable one. */
int pe_shm_token_new(uint8_t token[PE_SHM_TOKEN_LEN]);
/* The trailer that holds token. */
void pe_shm_trailer_make(uint8_t trailer[PE_SHM_TRAILER], const uint8_t token[PE_SHM_TOKEN_LEN]);
/* The token of a trailer; false when it is not one (no magic). */
bool pe_shm_trailer_token(const uint8_t trailer[PE_SHM_TRAILER], uint8_t token[PE_SHM_TOKEN_LEN]);
/* trailer holds token (token_len bytes: any other length does not match).
 * Constant time in the trailer's bytes. */
bool pe_shm_trailer_matches(const uint8_t trailer[PE_SHM_TRAILER], const uint8_t *token,
                            size_t token_len);

#endif
