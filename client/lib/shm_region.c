/* Shared-memory regions this process makes for its feeds, and what removes
 * them when the process does not get to pe_client_shm_close.
 *
 * A region's name outlives its creator: the daemon opens it by name, so
 * nobody but the creator unlinks it. Names carry the creator's pid and
 * start time (common/shm_owner.h), and three things remove a region that
 * is left behind:
 *   - pe_client_shm_unlink_all, from a SIGINT/SIGTERM handler
 *     (pe_client_shm_unlink_on_signals; pe-client train installs it);
 *   - pe_client_shm_sweep, run by every pe_client_shm_create: regions of
 *     this user whose creator is gone (SIGKILL, a crash);
 *   - the daemon, when the session that registered a region ends and its
 *     creator is gone (when the daemon may unlink it: same user or root).
 *
 * Threads: the table of live names is written by create and close (any
 * thread) and read by the signal handler; slots are claimed with atomics
 * so that the handler never sees a half-written name. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"
#include "shm_owner.h"

/* --- the live names ----------------------------------------------------------- */
/* Slot states: free, being written, live (the handler unlinks live ones). */
enum { SLOT_FREE, SLOT_BUSY, SLOT_LIVE };
#define LIVE_MAX 64 /* regions open at once that a signal removes; more are swept later */
static struct {
  atomic_int state;
  char name[64];
} live[LIVE_MAX];

static void live_add(const char *name) {
  for (int i = 0; i < LIVE_MAX; i++) {
    int want = SLOT_FREE;
    if (atomic_compare_exchange_strong(&live[i].state, &want, SLOT_BUSY)) {
      snprintf(live[i].name, sizeof live[i].name, "%s", name);
      atomic_store(&live[i].state, SLOT_LIVE);
      return;
    }
  }
}

/* Claims only the slot that holds name, so that the handler skips no other
 * live slot meanwhile; the name is checked again once claimed. */
static void live_remove(const char *name) {
  for (int i = 0; i < LIVE_MAX; i++) {
    if (atomic_load(&live[i].state) != SLOT_LIVE || strcmp(live[i].name, name)) continue;
    int want = SLOT_LIVE;
    if (!atomic_compare_exchange_strong(&live[i].state, &want, SLOT_BUSY)) continue;
    bool match = !strcmp(live[i].name, name);
    atomic_store(&live[i].state, match ? SLOT_FREE : SLOT_LIVE);
    if (match) return;
  }
}

/* Async-signal-safe: atomics, and shm_unlink (an unlink under /dev/shm). */
void pe_client_shm_unlink_all(void) {
  for (int i = 0; i < LIVE_MAX; i++) {
    int want = SLOT_LIVE;
    if (atomic_compare_exchange_strong(&live[i].state, &want, SLOT_BUSY)) {
      shm_unlink(live[i].name);
      atomic_store(&live[i].state, SLOT_FREE);
    }
  }
}

/* --- on signals ----------------------------------------------------------------- */
static void on_signal(int sig) {
  int e = errno;
  pe_client_shm_unlink_all();
  /* SA_RESETHAND put the default action back: die of the signal, as the
   * shell expects (status 128 + sig), once the handler returns. */
  raise(sig);
  errno = e;
}

void pe_client_shm_unlink_on_signals(void) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    /* Leave a handler the program set, and an ignored signal (nohup), alone. */
    if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO))
      continue;
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESETHAND};
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

/* --- the sweep ---------------------------------------------------------------------- */
int pe_client_shm_sweep(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  long self = (long)getpid();
  struct dirent *e;
  while ((e = readdir(d))) {
    long pid;
    uint64_t start;
    if (!pe_shm_owner_parse(e->d_name, &pid, &start) || pid == self) continue;
    /* Only this user's: the sticky /dev/shm lets nobody else unlink them. */
    struct stat sb;
    if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_uid != geteuid() || !pe_shm_owner_gone(pid, start))
      continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) n++;
  }
  closedir(d);
  return n;
}

/* --- create and close ------------------------------------------------------------------ */
static void forget_unlink(const char *name) {
  shm_unlink(name);
  live_remove(name);
}

int pe_client_shm_create(pe_client *c, size_t size, pe_client_shm *out) {
  static const char what[] = "register_shm";
  PEC_NEED_HANDLE(c);
  if (!out) return pec_fail(c, PE_C_EARG, "%s: out (pe_client_shm *) is NULL", what);
  memset(out, 0, sizeof *out);
  if (!size) return pec_fail(c, PE_C_EARG, "%s: size 0", what);
  pe_client_shm_sweep();
  /* The name holds the creator (for the sweeps) and a random part, nothing
   * of the client: /dev/shm lists it to everyone. A clash is retried. */
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 8; tries++) {
    if (pe_shm_owner_name(out->name, sizeof out->name) != 0)
      return pec_fail(c, PE_C_EIO, "%s: region name too long", what);
    fd = shm_open(out->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return pec_fail(c, PE_C_EIO, "%s: shm_open %s: %s", what, out->name, strerror(errno));
  /* From here a signal handler unlinks it (the register below may wait). */
  live_add(out->name);
  /* The data, then the trailer with the token that proves to the daemon
   * that the register comes from who made the region. */
  uint8_t token[PE_SHM_TOKEN_LEN];
  if (pec_shm_seal_fd(fd, size, token) != 0) {
    int e = errno;
    close(fd);
    forget_unlink(out->name);
    return pec_fail(c, PE_C_EIO, "%s: %s: sizing to %zu + %d bytes and writing its token: %s", what,
                    out->name, size, PE_SHM_TRAILER, strerror(e));
  }
  int grant = pec_shm_grant_daemon(c, fd, out->name);
  if (grant) {
    close(fd);
    forget_unlink(out->name);
    return grant;
  }
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd); /* the mapping keeps the region */
  if (base == MAP_FAILED) {
    forget_unlink(out->name);
    return pec_fail(c, PE_C_EIO, "%s: mmap %s (%zu bytes): %s", what, out->name, size, strerror(e));
  }
  out->base = base;
  out->size = size;
  int rc = pec_register_shm(c, out->name, size, token, &out->region);
  if (rc) {
    munmap(base, size);
    forget_unlink(out->name);
    out->base = NULL;
    return rc;
  }
  return 0;
}

void pe_client_shm_close(pe_client *c, pe_client_shm *shm) {
  if (!shm || !shm->base) return;
  if (c && shm->region) pe_client_unregister_shm(c, shm->region);
  munmap(shm->base, shm->size);
  forget_unlink(shm->name);
  memset(shm, 0, sizeof *shm);
}
