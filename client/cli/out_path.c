/* cli_out_path_check (out_path.h). */
#include "out_path.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failed(const char *path, int err_no, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: %s", path, strerror(err_no));
  return -1;
}

int cli_out_path_check(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (!path || !*path) return failed(path ? path : "", ENOENT, err, errlen);
  if (stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return failed(path, EISDIR, err, errlen);
    return access(path, W_OK) ? failed(path, errno, err, errlen) : 0;
  }
  if (errno != ENOENT) return failed(path, errno, err, errlen);
  /* A new file: its directory must exist and take it. */
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == path)
    snprintf(dir, sizeof dir, "/");
  else
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  if (stat(dir, &st) != 0) return failed(path, errno, err, errlen);
  if (!S_ISDIR(st.st_mode)) return failed(path, ENOTDIR, err, errlen);
  return access(dir, W_OK | X_OK) ? failed(path, errno, err, errlen) : 0;
}
