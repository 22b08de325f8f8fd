/* A request sent from its own thread and REQ socket, for the e2e tests
 * that keep requests in flight (long runs) while the test body sends
 * others. The test body polls `done`; the thread makes no Check assertion.
 * Header-only, like daemon_harness.h. */
#ifndef PE_TESTS_ASYNC_CALL_H
#define PE_TESTS_ASYNC_CALL_H

#include <pthread.h>

#include "daemon_harness.h"

typedef struct dh_async {
  const dh_daemon *d;
  uint8_t *buf; /* the packed request (kept for a resend) */
  size_t len;
  Pe__Reply *rep; /* NULL: no reply */
  double took_s;  /* from the send to the reply (or the failure) */
  atomic_bool done;
  pthread_t th;
} dh_async;

static void *dh_async_main(void *arg) {
  dh_async *a = arg;
  int s = nn_socket(AF_SP, NN_REQ);
  int t = 60000, unlimited = -1;
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &unlimited, sizeof unlimited);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &t, sizeof t);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &t, sizeof t);
  double t0 = dh_now();
  if (s >= 0 && nn_connect(s, a->d->addr) >= 0) {
    void *rbuf = NULL;
    int n = nn_send(s, a->buf, a->len, 0) < 0 ? -1 : nn_recv(s, &rbuf, NN_MSG, 0);
    if (n >= 0) {
      a->rep = pe__reply__unpack(NULL, (size_t)n, rbuf);
      nn_freemsg(rbuf);
    }
  }
  a->took_s = dh_now() - t0;
  if (s >= 0) nn_close(s);
  atomic_store(&a->done, true);
  return NULL;
}

/* Pack rq (kept in a->buf until the caller frees it) and send it from a
 * thread of its own. */
static inline void dh_async_start(dh_async *a, const dh_daemon *d, const Pe__Request *rq) {
  memset(a, 0, sizeof *a);
  a->d = d;
  a->len = pe__request__get_packed_size(rq);
  a->buf = malloc(a->len ? a->len : 1);
  ck_assert_ptr_nonnull(a->buf);
  pe__request__pack(rq, a->buf);
  ck_assert_int_eq(pthread_create(&a->th, NULL, dh_async_main, a), 0);
}

/* Whether the reply (or the thread's failure) came within limit_s; once it
 * has, the thread is joined. */
static inline bool dh_async_wait(dh_async *a, double limit_s) {
  double t0 = dh_now();
  while (!atomic_load(&a->done) && dh_now() - t0 < limit_s) dh_sleep_ms(10);
  if (!atomic_load(&a->done)) return false;
  pthread_join(a->th, NULL);
  return true;
}

#endif
