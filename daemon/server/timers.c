/* The loop's timers (server/loop.h): the tick (silent connection ends,
 * session expiry, systemd status) and the systemd watchdog. */
#include <stdlib.h>
#include <systemd/sd-daemon.h>

#include "core/clock.h"
#include "core/log.h"
#include "server/loop.h"
#include "server/registry/registry.h"
#include "server/shm.h"

void notify_status(pe_server *s) {
  pe_model_snapshot *ms;
  int nm, np, nc;
  pe_registry_snapshot(s->reg, false, &ms, &nm, &np, &nc);
  free(ms);
  sd_notifyf(0, "STATUS=%d programs, %d models, %d clients, %llu requests, %d queued", np, nm, nc,
             (unsigned long long)atomic_load(&s->requests_total), pe_server_pending(s));
}

/* Warn about connections that ended before delivering a request: how
 * nanomsg's drop of a message over max_message shows (conn_watch.h). The
 * first at once, then at most one line per SILENT_LOG_EVERY_S. */
static void warn_silent_ends(pe_server *s, const pe_limits *lim) {
  pe_loop *L = s->loop;
  double now = pe_now_s();
  uint64_t n = pe_conn_watch_poll(L->conns, L->sock);
  if (n && !L->silent_ends) L->silent_since = now;
  L->silent_ends += n;
  if (!L->silent_ends || now - L->silent_logged < SILENT_LOG_EVERY_S) return;
  PE_LOGW(
      "%llu connection(s) to %s ended in the last %.0f s without delivering a request: "
      "nanomsg closes a connection whose message is over [limits] max_message = %lld bytes "
      "(NN_RCVMAXSIZE) and drops the message, not saying which peer sent it (a client that "
      "connects and leaves without sending ends the same way). The sender gets no reply, "
      "and a nanomsg REQ client resends on a new connection: raise max_message, or send "
      "less per request (shared memory for large feeds)",
      (unsigned long long)L->silent_ends, s->cfg.socket, now - L->silent_since + 1,
      (long long)lim->max_message);
  L->silent_ends = 0;
  L->silent_logged = now;
}

void tick_cb(struct ev_loop *loop, ev_timer *w, int revents) {
  pe_server *s = w->data;
  pe_limits lim = pe_server_limits(s);
  warn_silent_ends(s, &lim);
  uint64_t ids[64];
  int n = pe_registry_expire(s->reg, pe_now_s(), lim.session_ttl_s, ids, 64);
  for (int i = 0; i < n; i++) {
    pe_shm_drop_client(s->shm, ids[i]);
    pe_reply_cache_forget_client(s->dedup, ids[i]);
  }
  notify_status(s);
}

void watchdog_cb(struct ev_loop *loop, ev_timer *w, int revents) {
  sd_notify(0, "WATCHDOG=1");
}
