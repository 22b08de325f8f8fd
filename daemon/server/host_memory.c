/* The physical memory or the cgroup's limit, the lower (host_memory.h). */
#include "server/host_memory.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The number in file path ("max", absent or unreadable: none, INT64_MAX). */
static int64_t read_limit(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return INT64_MAX;
  int64_t v;
  bool ok = fscanf(f, "%" SCNd64, &v) == 1 && v > 0;
  fclose(f);
  return ok ? v : INT64_MAX;
}

/* The lowest `file` limit from cgroup directory root/rel up to root. */
static int64_t lowest_up(const char *root, const char *rel, const char *file) {
  char dir[4096], path[4200];
  snprintf(dir, sizeof dir, "%s%s", root, rel);
  int64_t low = INT64_MAX;
  for (;;) {
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int64_t v = read_limit(path);
    if (v < low) low = v;
    char *slash = strrchr(dir, '/');
    if (!slash || (size_t)(slash - dir) < strlen(root)) break;
    *slash = 0;
  }
  return low;
}

/* The cgroup memory limit of this process (v2 "0::/path", v1 "N:...memory...:/path"). */
static int64_t cgroup_limit(void) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return INT64_MAX;
  char line[4096];
  int64_t low = INT64_MAX;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = 0;
    const char *ctrls = c1 + 1, *rel = c2 + 1;
    int64_t v = INT64_MAX;
    if (!*ctrls)
      v = lowest_up("/sys/fs/cgroup", strcmp(rel, "/") ? rel : "", "memory.max");
    else if (strstr(ctrls, "memory"))
      v = lowest_up("/sys/fs/cgroup/memory", strcmp(rel, "/") ? rel : "", "memory.limit_in_bytes");
    if (v < low) low = v;
  }
  fclose(f);
  return low;
}

int64_t pe_host_memory_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t phys = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
  int64_t cg = cgroup_limit();
  return phys && cg < phys ? cg : phys;
}
