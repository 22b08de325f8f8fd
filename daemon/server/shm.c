/* Shared-memory regions (see shm.h). */
#include "server/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "server/bus_guard.h"
#include "server/client_tag.h"
#include "shm_owner.h"
#include "shm_token.h"

#define PE_SHM_NAME_MAX 201 /* '/' and up to 200 of [A-Za-z0-9._-] */

typedef struct pe_shm_region {
  uint64_t id, client;
  char name[PE_SHM_NAME_MAX + 1];
  void *base;
  uint64_t size;
  uint8_t token[PE_SHM_TOKEN_LEN]; /* the trailer's, as registered */
  dev_t dev;                       /* the object mapped, to know the name still names it */
  ino_t ino;
  int refs; /* table entry (1 while registered) + runs reading it */
} pe_shm_region;

struct pe_shm_table {
  pthread_mutex_t mu;
  pe_shm_region **r;
  int n, cap;
};

pe_status *pe_shm_table_new(pe_shm_table **out) {
  pe_shm_table *t = calloc(1, sizeof *t);
  if (!t) return pe_error(PE_ENOMEM, "shm: out of memory");
  pthread_mutex_init(&t->mu, NULL);
  *out = t;
  return NULL;
}

static void region_unmap(pe_shm_region *g) {
  munmap(g->base, (size_t)g->size);
  free(g);
}

/* A region whose registration ends: unlink its name when the creator has
 * exited (killed trainers leave it; common/shm_owner.h) and the name still
 * names the object mapped. A creator that lives keeps it: it may register
 * it again (a restarted daemon) and unlinks it itself. Unlinking needs the
 * region's user or root (/dev/shm is sticky); else its user's next
 * pe_client_shm_create sweeps it. */
static void unlink_if_orphan(const char *name, dev_t dev, ino_t ino) {
  long pid;
  uint64_t start;
  if (!pe_shm_owner_parse(name, &pid, &start) || !pe_shm_owner_gone(pid, start)) return;
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return; /* unlinked already */
  struct stat sb;
  bool same = fstat(fd, &sb) == 0 && sb.st_dev == dev && sb.st_ino == ino;
  close(fd);
  if (!same) return;
  if (shm_unlink(name) == 0)
    PE_LOGI("shm %s: its creator (pid %ld) has exited; unlinked", name, pid);
  else
    PE_LOGD("shm %s: its creator (pid %ld) has exited; cannot unlink it: %s", name, pid,
            strerror(errno));
}

void pe_shm_table_free(pe_shm_table *t) {
  if (!t) return;
  for (int i = 0; i < t->n; i++) {
    unlink_if_orphan(t->r[i]->name, t->r[i]->dev, t->r[i]->ino);
    region_unmap(t->r[i]);
  }
  free(t->r);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

static bool shm_name_valid(const char *name) {
  size_t n = strlen(name);
  if (n < 2 || n > PE_SHM_NAME_MAX || name[0] != '/') return false;
  for (size_t i = 1; i < n; i++) {
    char c = name[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  }
  return true;
}

/* The region this client registered under name with this size and token,
 * if any: registering it again answers its id (libpeclient registers its
 * regions again when it recovers from a lost program, and a region that is
 * still there must not be mapped twice). Lock held. */
static pe_shm_region *find_same(pe_shm_table *t, uint64_t client, const char *name, uint64_t size,
                                const uint8_t *token, size_t token_len) {
  uint8_t trailer[PE_SHM_TRAILER];
  for (int i = 0; i < t->n; i++) {
    pe_shm_region *g = t->r[i];
    if (g->client != client || g->size != size || strcmp(g->name, name)) continue;
    pe_shm_trailer_make(trailer, g->token);
    if (pe_shm_trailer_matches(trailer, token, token_len)) return g;
  }
  return NULL;
}

/* The answer to a name the caller may not register: one that does not
 * exist, an object without the caller's token in its trailer, or one too
 * small to hold it; the same for all, so that a client learns nothing of
 * another's object (and cannot tell a wrong token from a missing object). */
static pe_status *no_such_region(const char *name, uint64_t size) {
  return pe_error(PE_ENOTFOUND,
                  "register_shm: %s: no such region with %llu bytes and this token (the object "
                  "does not exist, or it has no trailer at byte %llu holding the request's token; "
                  "see ShmRequest in service.proto)",
                  name, (unsigned long long)size, (unsigned long long)size);
}

/* Read the trailer of fd at byte size and check it against token; false
 * when it cannot be read or does not match. */
static bool trailer_ok(int fd, const char *name, uint64_t size, const uint8_t *token,
                       size_t token_len) {
  uint8_t trailer[PE_SHM_TRAILER];
  ssize_t n = pread(fd, trailer, sizeof trailer, (off_t)size);
  if (n != (ssize_t)sizeof trailer) {
    PE_LOGD("shm %s: reading its trailer at byte %llu: %s", name, (unsigned long long)size,
            n < 0 ? strerror(errno) : "short read");
    return false;
  }
  return pe_shm_trailer_matches(trailer, token, token_len);
}

/* A random id, nonzero and unused. Random rather than counted: a request
 * replayed to a restarted daemon (nanomsg does, on reconnect) must not find
 * a region another client registered since under the same number. Lock
 * held. */
static uint64_t new_id(pe_shm_table *t) {
  for (;;) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      id = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)t->n << 48);
    }
    id &= ~(1ull << 63); /* printed signed by some tools; keep it positive */
    bool used = id == 0;
    for (int i = 0; i < t->n && !used; i++) used = t->r[i]->id == id;
    if (!used) return id;
  }
}

pe_status *pe_shm_register(pe_shm_table *t, uint64_t client, const char *name, uint64_t size,
                           const uint8_t *token, size_t token_len, uint64_t *region) {
  if (!shm_name_valid(name))
    return pe_error(PE_EINVAL,
                    "register_shm: name '%.80s' must be '/' followed by [A-Za-z0-9._-]{1,200}",
                    name);
  if (size == 0) return pe_error(PE_EINVAL, "register_shm: %s: size 0: it must be > 0", name);
  if (size > (uint64_t)SIZE_MAX / 2 - PE_SHM_TRAILER)
    return pe_error(PE_EINVAL, "register_shm: %s: size %llu is too large (at most %llu)", name,
                    (unsigned long long)size, (unsigned long long)(SIZE_MAX / 2 - PE_SHM_TRAILER));
  pthread_mutex_lock(&t->mu);
  pe_shm_region *same = find_same(t, client, name, size, token, token_len);
  if (same) *region = same->id;
  pthread_mutex_unlock(&t->mu);
  if (same) return NULL;
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0 && errno == EACCES)
    return pe_error(PE_EIO,
                    "register_shm: %s: shm_open: %s: the daemon's user (uid %u) may not read it "
                    "(give it read access, e.g. an ACL entry; libpeclient's "
                    "pe_client_shm_create does)",
                    name, strerror(EACCES), (unsigned)geteuid());
  if (fd < 0 && errno == ENOENT) return no_such_region(name, size);
  if (fd < 0) return pe_error(PE_EIO, "register_shm: %s: shm_open: %s", name, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    pe_status *st = pe_error(PE_EIO, "register_shm: %s: fstat: %s", name, strerror(errno));
    close(fd);
    return st;
  }
  /* Before mapping: nothing of an object the caller cannot prove it reads
   * is mapped, and a short object fails as a missing one. */
  if ((uint64_t)sb.st_size < size + PE_SHM_TRAILER ||
      !trailer_ok(fd, name, size, token, token_len)) {
    close(fd);
    /* The request's warn line says it failed; the detail is the operator's. */
    PE_LOGD(
        "shm %s: register by client %s refused: the object has %lld bytes, and no trailer "
        "at byte %llu holding the request's token",
        name, pe_client_tag(client).s, (long long)sb.st_size, (unsigned long long)size);
    return no_such_region(name, size);
  }
  void *base = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    return pe_error(PE_EIO, "register_shm: %s: mmap %llu bytes: %s", name, (unsigned long long)size,
                    strerror(errno));
  pe_shm_region *g = calloc(1, sizeof *g);
  if (!g) {
    munmap(base, (size_t)size);
    return pe_error(PE_ENOMEM, "register_shm: out of memory");
  }
  g->client = client;
  snprintf(g->name, sizeof g->name, "%s", name);
  g->base = base;
  g->size = size;
  memcpy(g->token, token, PE_SHM_TOKEN_LEN); /* matched: token_len is the length */
  g->dev = sb.st_dev;
  g->ino = sb.st_ino;
  g->refs = 1;
  pthread_mutex_lock(&t->mu);
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 8;
    pe_shm_region **r = realloc(t->r, (size_t)cap * sizeof *r);
    if (!r) {
      pthread_mutex_unlock(&t->mu);
      region_unmap(g);
      return pe_error(PE_ENOMEM, "register_shm: out of memory");
    }
    t->r = r;
    t->cap = cap;
  }
  g->id = new_id(t);
  t->r[t->n++] = g;
  pthread_mutex_unlock(&t->mu);
  *region = g->id;
  /* The id only at debug level: the log may be readable by others (the
   * journal), and an id is what a feed names. */
  PE_LOGI("shm %s registered: %llu bytes, client %s", name, (unsigned long long)size,
          pe_client_tag(client).s);
  PE_LOGD("shm %s: region %llu, client %016llx", name, (unsigned long long)g->id,
          (unsigned long long)client);
  return NULL;
}

/* Remove entry i from the table; returns the region to unmap, or NULL when
 * a run still reads it (the last release unmaps). Lock held. */
static pe_shm_region *unlink_at(pe_shm_table *t, int i) {
  pe_shm_region *g = t->r[i];
  t->r[i] = t->r[--t->n];
  return --g->refs == 0 ? g : NULL;
}

/* The error for a region id the client has not registered: the same
 * whether the id is unknown or another client's. The client by its tag:
 * the message is logged (warn) with the failed request. */
static pe_status *not_registered(const char *op, uint64_t region, uint64_t client) {
  return pe_error(PE_ENOTFOUND,
                  "%s%sshm region %llu is not registered by client %s (a region belongs to "
                  "the client that registered it)",
                  op, *op ? ": " : "", (unsigned long long)region, pe_client_tag(client).s);
}

/* The index of client's region `region`, or -1: another client's region
 * is not found either, with the same message, so that an id tells nothing
 * to a client it does not belong to (lock held). */
static int find_own(pe_shm_table *t, uint64_t client, uint64_t region) {
  for (int i = 0; i < t->n; i++)
    if (t->r[i]->id == region && t->r[i]->client == client) return i;
  return -1;
}

pe_status *pe_shm_unregister(pe_shm_table *t, uint64_t client, uint64_t region) {
  pthread_mutex_lock(&t->mu);
  int i = find_own(t, client, region);
  if (i >= 0) {
    pe_shm_region *g = unlink_at(t, i);
    pthread_mutex_unlock(&t->mu);
    if (g) region_unmap(g);
    return NULL;
  }
  pthread_mutex_unlock(&t->mu);
  return not_registered("unregister_shm", region, client);
}

void pe_shm_drop_client(pe_shm_table *t, uint64_t client) {
  for (;;) {
    pe_shm_region *g = NULL;
    bool found = false;
    char name[PE_SHM_NAME_MAX + 1];
    dev_t dev = 0;
    ino_t ino = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++)
      if (t->r[i]->client == client) {
        memcpy(name, t->r[i]->name, sizeof name);
        dev = t->r[i]->dev;
        ino = t->r[i]->ino;
        g = unlink_at(t, i);
        found = true;
        break;
      }
    pthread_mutex_unlock(&t->mu);
    if (g) region_unmap(g);
    if (!found) return;
    unlink_if_orphan(name, dev, ino);
  }
}

/* Pin [offset, offset+length) of a region: *data points into the mapping
 * until shm_release(*reg). */
static pe_status *shm_acquire(pe_shm_table *t, uint64_t client, uint64_t region, uint64_t offset,
                              uint64_t length, const void **data, pe_shm_region **reg) {
  pthread_mutex_lock(&t->mu);
  int i = find_own(t, client, region);
  if (i >= 0) {
    pe_shm_region *g = t->r[i];
    if (offset > g->size || length > g->size - offset) {
      pthread_mutex_unlock(&t->mu);
      return pe_error(PE_EINVAL, "shm region %llu: [%llu, +%llu) is outside its %llu bytes",
                      (unsigned long long)region, (unsigned long long)offset,
                      (unsigned long long)length, (unsigned long long)g->size);
    }
    g->refs++;
    pthread_mutex_unlock(&t->mu);
    *data = (const uint8_t *)g->base + offset;
    *reg = g;
    return NULL;
  }
  pthread_mutex_unlock(&t->mu);
  return not_registered("", region, client);
}

static void shm_release(pe_shm_table *t, pe_shm_region *g) {
  if (!g) return;
  pthread_mutex_lock(&t->mu);
  bool last = --g->refs == 0;
  pthread_mutex_unlock(&t->mu);
  if (last) region_unmap(g);
}

pe_status *pe_shm_pin_acquire(pe_shm_table *t, uint64_t client, uint64_t region, uint64_t offset,
                              uint64_t length, pe_shm_pin *out) {
  memset(out, 0, sizeof *out);
  const void *data = NULL;
  pe_shm_region *g = NULL;
  PE_TRY(shm_acquire(t, client, region, offset, length, &data, &g));
  *out = (pe_shm_pin){
      .t = t, .g = g, .data = data, .region = region, .offset = offset, .length = length};
  return NULL;
}

static pe_status *pin_fault(const pe_shm_pin *p, uint64_t from, uint64_t length) {
  PE_LOGW("shm %s of client %s: SIGBUS reading [%llu, +%llu): object truncated", p->g->name,
          pe_client_tag(p->g->client).s, (unsigned long long)from, (unsigned long long)length);
  return pe_error(PE_EIO,
                  "shm region %llu: reading [%llu, +%llu) faulted (SIGBUS): the object was "
                  "truncated below the %llu bytes it was registered with",
                  (unsigned long long)p->region, (unsigned long long)from,
                  (unsigned long long)length, (unsigned long long)p->g->size);
}

static pe_status *pin_outside(const pe_shm_pin *p, uint64_t at, uint64_t length) {
  return pe_error(PE_EINVAL, "shm region %llu: [%llu, +%llu) is outside the %llu bytes pinned",
                  (unsigned long long)p->region, (unsigned long long)(p->offset + at),
                  (unsigned long long)length, (unsigned long long)p->length);
}

pe_status *pe_shm_pin_read(const pe_shm_pin *p, uint64_t at, uint64_t length, void *dst) {
  if (at > p->length || length > p->length - at) return pin_outside(p, at, length);
  if (pe_bus_guarded_copy(dst, (const uint8_t *)p->data + at, (size_t)length)) return NULL;
  return pin_fault(p, p->offset + at, length);
}

pe_status *pe_shm_pin_read_rows(const pe_shm_pin *p, const int64_t *rows, int64_t n, uint64_t row,
                                void *dst) {
  uint64_t have = row ? p->length / row : 0;
  for (int64_t i = 0; i < n; i++)
    if (rows[i] < 0 || (uint64_t)rows[i] >= have)
      return pin_outside(p, (uint64_t)rows[i] * row, row);
  if (pe_bus_guarded_gather(dst, p->data, rows, n, (size_t)row)) return NULL;
  return pin_fault(p, p->offset, p->length);
}

void pe_shm_pin_release(pe_shm_pin *p) {
  if (!p || !p->g) return;
  shm_release(p->t, p->g);
  p->g = NULL;
}

pe_status *pe_shm_read(pe_shm_table *t, uint64_t client, uint64_t region, uint64_t offset,
                       uint64_t length, void *dst) {
  pe_shm_pin p;
  PE_TRY(pe_shm_pin_acquire(t, client, region, offset, length, &p));
  pe_status *st = pe_shm_pin_read(&p, 0, length, dst);
  pe_shm_pin_release(&p);
  return st;
}

int pe_shm_count(pe_shm_table *t) {
  pthread_mutex_lock(&t->mu);
  int n = t->n;
  pthread_mutex_unlock(&t->mu);
  return n;
}
