/* pe_client_interrupt: end a handle's session from another thread (a
 * signal's watcher), while the handle's own thread may be in a request. */
#include <stdio.h>
#include <time.h>

#include "client_internal.h"

/* Request ids of the interrupting connection: far above the handle's own
 * (they count from 1), so that the daemon's reply cache, keyed by client
 * and request id, never takes the close for one of the handle's requests. */
#define INTERRUPT_REQUEST_ID (UINT64_C(1) << 62)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int pe_client_interrupt(pe_client *c, int wait_ms, int timeout_ms, char *err, size_t errlen) {
  if (!err) errlen = 0;
  if (errlen) err[0] = 0;
  if (!c) {
    snprintf(err, errlen, "interrupt: no client handle");
    return PE_C_EARG;
  }
  atomic_store(&c->stopped, true);
  if (c->sock < 0) return 0; /* never connected: no session */
  double deadline = now_ms() + (wait_ms > 0 ? wait_ms : 0);
  while (atomic_load(&c->in_call) > 0 && now_ms() < deadline) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  /* A handle of its own with c's identity: c's socket is its thread's. */
  pe_client *x = pe_client_new();
  if (!x) {
    snprintf(err, errlen, "close: out of memory");
    return PE_C_ENOMEM;
  }
  x->client_id = c->client_id;
  x->last_request_id = INTERRUPT_REQUEST_ID;
  pe_client_opts o = {.address = c->address,
                      .timeout_ms = timeout_ms > 0 ? timeout_ms : 1000,
                      .send_timeout_ms = timeout_ms > 0 ? timeout_ms : 1000,
                      .no_recover = true};
  int rc = pe_client_connect(x, &o);
  if (!rc) rc = pe_client_close(x);
  if (rc) snprintf(err, errlen, "%s", pe_client_error(x));
  pe_client_free(x);
  return rc;
}
