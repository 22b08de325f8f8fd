/* The trailer that proves a RegisterShm's caller can read its region
 * (common/shm_token.h): written when a region is made (pe_client_shm_seal,
 * which pe_client_shm_create calls), read back when a caller registers an
 * object by name (pe_client_register_shm). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"

int pec_shm_seal_fd(int fd, size_t size, uint8_t token[PE_SHM_TOKEN_LEN]) {
  if (size > (size_t)INT64_MAX - PE_SHM_TRAILER) {
    errno = EFBIG;
    return -1;
  }
  if (pe_shm_token_new(token) != 0) return -1;
  uint8_t trailer[PE_SHM_TRAILER];
  pe_shm_trailer_make(trailer, token);
  if (ftruncate(fd, (off_t)(size + PE_SHM_TRAILER)) != 0) return -1;
  ssize_t w = pwrite(fd, trailer, sizeof trailer, (off_t)size);
  if (w == (ssize_t)sizeof trailer) return 0;
  if (w >= 0) errno = EIO;
  return -1;
}

_Static_assert(PE_CLIENT_SHM_TRAILER == PE_SHM_TRAILER, "pe_client.h and shm_token.h agree");

int pe_client_shm_seal(int fd, size_t size) {
  uint8_t token[PE_SHM_TOKEN_LEN];
  return pec_shm_seal_fd(fd, size, token) == 0 ? 0 : -errno;
}

int pec_shm_read_token(pe_client *c, const char *name, uint64_t size,
                       uint8_t token[PE_SHM_TOKEN_LEN], bool *have) {
  static const char what[] = "register_shm";
  *have = false;
  int fd = shm_open(name, O_RDONLY, 0);
  /* Not ours to read (or not there): the daemon answers that, as it
   * answers anyone without the token. */
  if (fd < 0) return 0;
  struct stat sb = {0};
  uint8_t trailer[PE_SHM_TRAILER];
  ssize_t n = -1;
  if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size >= size &&
      (uint64_t)sb.st_size - size >= PE_SHM_TRAILER)
    n = pread(fd, trailer, sizeof trailer, (off_t)size);
  close(fd);
  if (n == (ssize_t)sizeof trailer && pe_shm_trailer_token(trailer, token)) {
    *have = true;
    return 0;
  }
  return pec_fail(c, PE_C_EARG,
                  "%s: %s: no trailer at byte %llu (the object has %lld bytes): a region needs "
                  "%d bytes after its data holding a token; pe_client_shm_seal writes them",
                  what, name, (unsigned long long)size, (long long)sb.st_size, PE_SHM_TRAILER);
}
