/* Removal of stale checkpoint temporaries at start (checkpoint/stale.h). */
#include "server/checkpoint/stale.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "server/checkpoint/file.h"

/* "<name>.ckpt.tmp.<digits>.<digits>" with a valid checkpoint name: what
 * pe_write_atomic creates, nothing a user would name a file. */
static bool digits(const char *s, const char **end) {
  const char *p = s;
  while (*p >= '0' && *p <= '9') p++;
  *end = p;
  return p > s;
}

static bool is_temp(const char *f) {
  const char *t = strstr(f, ".ckpt.tmp.");
  if (!t || t == f || (size_t)(t - f) > PE_NAME_MAX) return false;
  char name[PE_NAME_MAX + 1];
  memcpy(name, f, (size_t)(t - f));
  name[t - f] = 0;
  const char *p = t + strlen(".ckpt.tmp."), *q;
  return pe_name_valid(name) && digits(p, &q) && *q == '.' && digits(q + 1, &p) && !*p;
}

static int clean_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno != ENOENT)
      PE_LOGW("state: cannot read %s for stale temporaries: %s", dir, strerror(errno));
    return 0;
  }
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!is_temp(e->d_name)) continue;
    char path[4800];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (unlink(path) != 0) {
      PE_LOGW("state: cannot remove %s, the temporary of an interrupted checkpoint write: %s", path,
              strerror(errno));
      continue;
    }
    removed++;
    PE_LOGW(
        "state: removed %s (%lld bytes), the temporary of a checkpoint write interrupted "
        "before this start (a crash or kill -9)",
        path, (long long)sb.st_size);
  }
  closedir(d);
  return removed;
}

int pe_ckpt_remove_stale(const char *state_dir) {
  char models[4200];
  snprintf(models, sizeof models, "%s/models", state_dir);
  DIR *d = opendir(models);
  if (!d) return 0; /* none yet */
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!pe_name_valid(e->d_name)) continue; /* also "." and ".." */
    char dir[4480];
    snprintf(dir, sizeof dir, "%s/%s", models, e->d_name);
    removed += clean_dir(dir);
  }
  closedir(d);
  return removed;
}
