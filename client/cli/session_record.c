/* cli_session_save, _load, _forget (session_record.h). */
#include "session_record.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* FNV-1a, 64 bits: a file name per address, not a secret. */
static uint64_t address_hash(const char *s) {
  uint64_t h = 14695981039346656037ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* The records' directory, made when missing; false when it cannot be made
 * or is not a 0700 directory of this user's (a link included). */
static bool record_dir(char *dir, size_t len) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg)
    snprintf(dir, len, "%s/pe-client", xdg);
  else
    snprintf(dir, len, "/tmp/pe-client-%u", (unsigned)geteuid());
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
         (st.st_mode & 077) == 0;
}

static bool record_path(const char *address, uint64_t handle, char *path, size_t len) {
  char dir[4096];
  if (!record_dir(dir, sizeof dir)) return false;
  int n = snprintf(path, len, "%s/%016" PRIx64 "-%016" PRIx64, dir, handle, address_hash(address));
  return n > 0 && (size_t)n < len;
}

bool cli_session_save(const char *address, uint64_t handle, cli_session s) {
  char path[4200];
  if (!record_path(address, handle, path, sizeof path)) return false;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    return false;
  }
  fprintf(f, "%016" PRIx64 " %" PRIu64 "\n", s.client_id, s.last_request);
  return fclose(f) == 0;
}

bool cli_session_load(const char *address, uint64_t handle, cli_session *s) {
  char path[4200];
  if (!record_path(address, handle, path, sizeof path)) return false;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return false;
  }
  bool ok =
      fscanf(f, "%" SCNx64 " %" SCNu64, &s->client_id, &s->last_request) == 2 && s->client_id != 0;
  fclose(f);
  return ok;
}

void cli_session_forget(const char *address, uint64_t handle) {
  char path[4200];
  if (record_path(address, handle, path, sizeof path)) unlink(path);
}
