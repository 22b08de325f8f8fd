/* The state directory's lock (see state_lock.h). */
#include "server/state_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* The holder's pid from the lock file, or 0 (not written yet, garbage). */
static long holder_pid(int fd) {
  char buf[32];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *end;
  long pid = strtol(buf, &end, 10);
  return pid > 0 && (*end == '\n' || !*end) ? pid : 0;
}

pe_status *pe_state_lock(const char *state_dir, int *fd_out) {
  *fd_out = -1;
  char path[4096];
  if (snprintf(path, sizeof path, "%s/%s", state_dir, PE_STATE_LOCK_FILE) >= (int)sizeof path)
    return pe_error(PE_EINVAL, "config [state] dir: path too long: %.100s...", state_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd < 0)
    return pe_error(PE_EIO, "state dir %s: cannot open its lock file %s: %s", state_dir, path,
                    strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    long pid = e == EWOULDBLOCK ? holder_pid(fd) : 0;
    close(fd);
    if (e != EWOULDBLOCK)
      return pe_error(PE_EIO, "state dir %s: flock %s: %s", state_dir, path, strerror(e));
    char who[48] = "";
    if (pid) snprintf(who, sizeof who, " (pid %ld)", pid);
    return pe_error(PE_EIO,
                    "state dir %s is in use by another pe-executord%s, which holds %s: two "
                    "daemons on one state dir would overwrite each other's checkpoints; stop that "
                    "one or give this one another --state-dir",
                    state_dir, who, path);
  }
  /* Ours: say who holds it (a refused daemon names the pid). */
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
    int e = errno;
    close(fd);
    return pe_error(PE_EIO, "state dir %s: writing the pid into %s: %s", state_dir, path,
                    strerror(e));
  }
  *fd_out = fd;
  return NULL;
}

void pe_state_unlock(int fd) {
  if (fd >= 0) close(fd); /* the last descriptor of the open file drops the flock */
}
