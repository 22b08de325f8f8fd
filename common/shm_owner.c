/* Region names with their creator (see shm_owner.h). */
#include "shm_owner.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Field 22 (starttime) of /proc/<pid>/stat; errno ENOENT when there is no
 * such process. The command name (field 2) may hold spaces and ')': the
 * fields after it start after the last ')'. */
static bool proc_start_time(long pid, uint64_t *out) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int e = errno;
  close(fd);
  if (n <= 0) {
    errno = n < 0 ? e : EIO;
    return false;
  }
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  if (!p) {
    errno = EIO;
    return false;
  }
  p++;
  /* p is at field 3 (state); starttime is 19 fields further. */
  for (int f = 3; f < 22; f++) {
    p = strchr(p + 1, ' ');
    if (!p) {
      errno = EIO;
      return false;
    }
  }
  char *end;
  errno = 0;
  unsigned long long v = strtoull(p + 1, &end, 10);
  if (errno || end == p + 1) {
    errno = EIO;
    return false;
  }
  *out = v;
  return true;
}

void pe_shm_owner_self(long *pid, uint64_t *start) {
  *pid = (long)getpid();
  *start = 0; /* 0: unknown, the pid alone tells */
  proc_start_time(*pid, start);
}

int pe_shm_owner_name(char *buf, size_t len) {
  long pid;
  uint64_t start;
  pe_shm_owner_self(&pid, &start);
  /* Random, so that the name says nothing of the client (its id is a
   * credential) and does not repeat; O_EXCL catches the rare clash. */
  static atomic_uint counter;
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
        ((uint64_t)atomic_fetch_add(&counter, 1) << 40);
  }
  int w = snprintf(buf, len, "/pe-%ld-%" PRIx64 "-%016" PRIx64, pid, start, r);
  return w > 0 && (size_t)w < len ? 0 : -1;
}

/* Digits of base at *p (at least one, at most max), then `sep`. */
static bool field(const char **p, int base, int max, char sep, unsigned long long *out) {
  const char *s = *p;
  int n = 0;
  unsigned long long v = 0;
  for (; n < max; n++, s++) {
    int d = *s >= '0' && *s <= '9'                 ? *s - '0'
            : base == 16 && *s >= 'a' && *s <= 'f' ? *s - 'a' + 10
                                                   : -1;
    if (d < 0) break;
    v = v * (unsigned)base + (unsigned)d;
  }
  if (!n || *s != sep) return false;
  *p = s + 1;
  *out = v;
  return true;
}

bool pe_shm_owner_parse(const char *name, long *pid, uint64_t *start) {
  const char *p = name[0] == '/' ? name + 1 : name;
  if (strncmp(p, "pe-", 3)) return false;
  p += 3;
  unsigned long long v_pid, v_start, v_rand, v_id, v_n;
  if (!field(&p, 10, 10, '-', &v_pid) || !field(&p, 16, 16, '-', &v_start)) return false;
  /* A random suffix; or, from an older libpeclient, "<client id>-<n>". */
  if (!field(&p, 16, 16, 0, &v_rand) &&
      (!field(&p, 16, 16, '-', &v_id) || !field(&p, 10, 10, 0, &v_n)))
    return false;
  if (v_pid == 0 || v_pid > 0x7fffffffULL) return false;
  *pid = (long)v_pid;
  *start = v_start;
  return true;
}

bool pe_shm_owner_gone(long pid, uint64_t start) {
  if (pid <= 0) return false;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
  uint64_t now;
  if (!proc_start_time(pid, &now)) return errno == ENOENT; /* exited meanwhile */
  return start != 0 && now != start;                       /* the pid was reused */
}
