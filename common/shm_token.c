/* Region trailers and their tokens (see shm_token.h). */
#include "shm_token.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

static const char MAGIC[8] = {'p', 'e', '-', 's', 'h', 'm', 't', '1'};

int pe_shm_token_new(uint8_t token[PE_SHM_TOKEN_LEN]) {
  size_t got = 0;
  while (got < PE_SHM_TOKEN_LEN) {
    ssize_t n = getrandom(token + got, PE_SHM_TOKEN_LEN - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

void pe_shm_trailer_make(uint8_t trailer[PE_SHM_TRAILER], const uint8_t token[PE_SHM_TOKEN_LEN]) {
  memset(trailer, 0, PE_SHM_TRAILER);
  memcpy(trailer, MAGIC, sizeof MAGIC);
  memcpy(trailer + sizeof MAGIC, token, PE_SHM_TOKEN_LEN);
}

bool pe_shm_trailer_token(const uint8_t trailer[PE_SHM_TRAILER], uint8_t token[PE_SHM_TOKEN_LEN]) {
  if (memcmp(trailer, MAGIC, sizeof MAGIC)) return false;
  memcpy(token, trailer + sizeof MAGIC, PE_SHM_TOKEN_LEN);
  return true;
}

bool pe_shm_trailer_matches(const uint8_t trailer[PE_SHM_TRAILER], const uint8_t *token,
                            size_t token_len) {
  if (token_len != PE_SHM_TOKEN_LEN || !token) return false;
  /* The whole trailer against what the token makes, without an early exit:
   * the time tells nothing of how many bytes matched. */
  uint8_t want[PE_SHM_TRAILER];
  pe_shm_trailer_make(want, token);
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < PE_SHM_TRAILER; i++) diff |= (uint8_t)(want[i] ^ trailer[i]);
  return diff == 0;
}
