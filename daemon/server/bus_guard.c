/* SIGBUS-guarded copy (see bus_guard.h).
 *
 * Each thread has a pointer to its current recovery point (NULL outside a
 * guarded copy). The handler jumps there when it is set; otherwise it puts
 * back the disposition found at install time and returns, so the faulting
 * access runs again and gets that disposition. */
#define _GNU_SOURCE
#include "server/bus_guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static struct sigaction previous;
static _Thread_local sigjmp_buf *volatile recovery;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  (void)si;
  (void)uc;
  sigjmp_buf *jb = recovery;
  if (jb) siglongjmp(*jb, 1);
  sigaction(sig, &previous, NULL);
}

static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &previous);
}

bool pe_bus_guarded_gather(void *dst, const void *src, const int64_t *rows, int64_t n, size_t row) {
  pthread_once(&install_once, install);
  sigjmp_buf jb;
  /* Saving the signal mask is a system call: once per gather, not per row. */
  if (sigsetjmp(jb, 1)) {
    recovery = NULL;
    return false;
  }
  recovery = &jb;
  if (rows)
    for (int64_t i = 0; i < n; i++)
      memcpy((char *)dst + (size_t)i * row, (const char *)src + (size_t)rows[i] * row, row);
  else
    memcpy(dst, src, (size_t)n * row);
  recovery = NULL;
  return true;
}

bool pe_bus_guarded_copy(void *dst, const void *src, size_t n) {
  return pe_bus_guarded_gather(dst, src, NULL, 1, n);
}
