/* Crash-consistent file writes and whole-file reads (see format/durable_file.h). */
#include "format/durable_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

pe_status *pe_mkdir_p(const char *path, mode_t mode) {
  char buf[4096];
  if (strlen(path) >= sizeof buf)
    return pe_error(PE_EINVAL, "mkdir: path too long: %.100s...", path);
  strcpy(buf, path);
  for (char *p = buf + 1;; p++) {
    if (*p == '/' || *p == 0) {
      char saved = *p;
      *p = 0;
      if (mkdir(buf, mode) != 0 && errno != EEXIST)
        return pe_error(PE_EIO, "mkdir %s: %s", buf, strerror(errno));
      *p = saved;
      if (!saved) break;
    }
  }
  return NULL;
}

static pe_status *fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return pe_error(PE_EIO, "open directory %s: %s", dir, strerror(errno));
  pe_status *st = NULL;
  if (fsync(fd) != 0) st = pe_error(PE_EIO, "fsync directory %s: %s", dir, strerror(errno));
  close(fd);
  return st;
}

pe_status *pe_write_atomic(const char *dir, const char *file, const uint8_t *buf, size_t len) {
  static atomic_uint counter;
  char tmp[4096], dst[4096];
  int a = snprintf(dst, sizeof dst, "%s/%s", dir, file);
  int b = snprintf(tmp, sizeof tmp, "%s/%s.tmp.%d.%u", dir, file, (int)getpid(),
                   atomic_fetch_add(&counter, 1));
  if (a < 0 || b < 0 || (size_t)a >= sizeof dst || (size_t)b >= sizeof tmp)
    return pe_error(PE_EINVAL, "write %s/%s: path too long", dir, file);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
  if (fd < 0) return pe_error(PE_EIO, "create %s: %s", tmp, strerror(errno));
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      pe_status *st =
          pe_error(PE_EIO, "write %s: %s", tmp, w < 0 ? strerror(errno) : "short write");
      close(fd);
      unlink(tmp);
      return st;
    }
    off += (size_t)w;
  }
  if (fsync(fd) != 0) {
    pe_status *st = pe_error(PE_EIO, "fsync %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return st;
  }
  close(fd);
  if (rename(tmp, dst) != 0) {
    pe_status *st = pe_error(PE_EIO, "rename %s -> %s: %s", tmp, dst, strerror(errno));
    unlink(tmp);
    return st;
  }
  /* The rename is durable only once the directory entry is. */
  return fsync_dir(dir);
}

pe_status *pe_remove_durable(const char *dir, const char *file, bool *existed) {
  char path[4096];
  *existed = false;
  int a = snprintf(path, sizeof path, "%s/%s", dir, file);
  if (a < 0 || (size_t)a >= sizeof path)
    return pe_error(PE_EINVAL, "remove %s/%s: path too long", dir, file);
  if (unlink(path) != 0) {
    if (errno == ENOENT) return NULL;
    return pe_error(PE_EIO, "remove %s: %s", path, strerror(errno));
  }
  *existed = true;
  /* Durable like a write: a crash must not bring the file back. */
  return fsync_dir(dir);
}

pe_status *pe_read_file(const char *path, size_t max, uint8_t **out, size_t *out_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pe_error(errno == ENOENT ? PE_ENOTFOUND : PE_EIO, "open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
    close(fd);
    return pe_error(PE_EIO, "read %s: not a regular file or larger than %zu bytes", path, max);
  }
  size_t len = (size_t)sb.st_size;
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) {
    close(fd);
    return pe_error(PE_ENOMEM, "read %s: out of memory for %zu bytes", path, len);
  }
  size_t off = 0;
  while (off < len) {
    ssize_t r = read(fd, buf + off, len - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      close(fd);
      free(buf);
      return pe_error(PE_EIO, "read %s: %s", path, r < 0 ? strerror(errno) : "file shrank");
    }
    off += (size_t)r;
  }
  close(fd);
  *out = buf;
  *out_len = len;
  return NULL;
}
