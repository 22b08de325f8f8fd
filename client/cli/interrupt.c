/* Signals end the session first (interrupt.h). */
#include "interrupt.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define WAIT_MS 1000  /* for the request in flight */
#define CLOSE_MS 1000 /* for the close's reply */

static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
static int wake[2] = {-1, -1}; /* the handler writes the signal's number to wake[1] */
static atomic_int caught;      /* the first signal; later ones kill at once */
static const cli_ctx *ctx;
/* The watched handle; the watcher holds mu while it ends its session. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pe_client *watched;

/* The signal's default action back (async-signal-safe). */
static void default_action(int sig) {
  struct sigaction sa = {.sa_handler = SIG_DFL};
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

/* Async-signal-safe: atomics, shm_unlink, write, sigaction, raise. */
static void on_signal(int sig) {
  int e = errno;
  pe_client_shm_unlink_all();
  unsigned char b = (unsigned char)sig;
  int first = 0;
  if (!atomic_compare_exchange_strong(&caught, &first, sig) || write(wake[1], &b, 1) != 1) {
    /* A second signal, or no watcher to wake: die of it once the handler
     * returns (it is blocked while the handler runs). */
    default_action(sig);
    raise(sig);
  }
  errno = e;
}

static const char *sig_name(int sig) {
  return sig == SIGINT    ? "SIGINT"
         : sig == SIGTERM ? "SIGTERM"
         : sig == SIGHUP  ? "SIGHUP"
                          : "SIGQUIT";
}

bool cli_interrupted(void) {
  return atomic_load(&caught) != 0;
}

static void *watcher(void *arg) {
  (void)arg;
  unsigned char b;
  ssize_t n;
  while ((n = read(wake[0], &b, 1)) < 0 && errno == EINTR) {
  }
  if (n != 1) return NULL; /* the pipe failed: the signals keep their handler */
  int sig = b;
  pthread_mutex_lock(&mu);
  if (watched) {
    fprintf(stderr, "pe-client %s: %s: ending the session\n", ctx->cmd, sig_name(sig));
    char err[1024];
    if (pe_client_interrupt(watched, WAIT_MS, CLOSE_MS, err, sizeof err))
      fprintf(stderr,
              "pe-client %s: warning: %s; the daemon drops the session when the close reaches "
              "it, else after its TTL\n",
              ctx->cmd, err);
  }
  default_action(sig);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, NULL); /* blocked in this thread: raise delivers it now */
  raise(sig);
  _exit(128 + sig); /* not reached: the default action of each of sigs ends the process */
}

void cli_interrupt_install(const cli_ctx *c) {
  if (wake[0] >= 0) return;
  ctx = c;
  if (pipe(wake) != 0) return;
  /* The watcher's read blocks; the handler's write must not. */
  fcntl(wake[1], F_SETFL, O_NONBLOCK);
  fcntl(wake[0], F_SETFD, FD_CLOEXEC);
  fcntl(wake[1], F_SETFD, FD_CLOEXEC);
  /* The watcher takes no signal: a handler there would only interrupt its
   * read. */
  sigset_t block, old;
  sigemptyset(&block);
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaddset(&block, sigs[i]);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  pthread_t t;
  int rc = pthread_create(&t, NULL, watcher, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) return;
  pthread_detach(t);
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction cur;
    /* A handler the caller set, and an ignored signal (nohup), stay. */
    if (sigaction(sigs[i], NULL, &cur) != 0 || cur.sa_handler != SIG_DFL ||
        (cur.sa_flags & SA_SIGINFO))
      continue;
    /* SA_RESTART: the main thread's reads go on; nanomsg's waits see
     * EINTR, which libpeclient retries. */
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

void cli_interrupt_watch(pe_client *c) {
  pthread_mutex_lock(&mu);
  watched = c;
  pthread_mutex_unlock(&mu);
}
