/* The loop's signals (server/loop.h): SIGTERM/SIGINT stop and drain,
 * SIGHUP reloads the config, SIGUSR1/SIGUSR2 are ignored. */
#include <nanomsg/nn.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "core/log.h"
#include "server/loop.h"

static int in_flight(pe_server *s) {
  int n = 0;
  for (int l = 0; l < PE_LANES; l++) n += atomic_load(&s->lanes[l].busy);
  return n;
}
static int queued(pe_server *s) {
  int n = 0;
  for (int l = 0; l < PE_LANES; l++) n += atomic_load(&s->lanes[l].queued);
  return n;
}

void drain_cb(struct ev_loop *loop, ev_timer *w, int revents) {
  pe_server *s = w->data;
  pe_loop *L = s->loop;
  flush_replies(s);
  /* The threads first: once none is left, no reply joins the queue. */
  bool done = pe_lanes_alive(L->lanes) == 0;
  pthread_mutex_lock(&L->mu);
  done = done && !L->out_head;
  pthread_mutex_unlock(&L->mu);
  if (done) ev_break(loop, EVBREAK_ALL);
}

void stop_cb(struct ev_loop *loop, ev_signal *w, int revents) {
  pe_server *s = w->data;
  pe_loop *L = s->loop;
  if (L->stopping) {
    PE_LOGW("signal %d: already stopping (waiting for %d requests in flight)", w->signum,
            in_flight(s));
    return;
  }
  L->stopping = true;
  atomic_store(&s->stopping, true);
  PE_LOGI(
      "signal %d: stopping: new requests are refused (SHUTTING_DOWN); finishing %d in flight (%d "
      "run(s): each stops at its "
      "next step boundary), %d queued",
      w->signum, in_flight(s), pe_run_table_count(&s->runs), queued(s));
  sd_notify(0, "STOPPING=1");
  /* The socket is still read: what arrives now is answered SHUTTING_DOWN
   * at once (receive.c), so no client waits out its timeout. */
  pe_lanes_close(L->lanes);
  ev_timer_start(loop, &L->drain_w);
}

/* SIGUSR1 and SIGUSR2 have no use here; their default action would end the
 * daemon without its shutdown checkpoints and leave its socket file. */
void ignored_sig_cb(struct ev_loop *loop, ev_signal *w, int revents) {
  PE_LOGW("signal %d (%s) ignored: SIGTERM stops the daemon, SIGHUP reloads its config", w->signum,
          strsignal(w->signum));
}

/* Reload: the config is built as at start (file, then the command line),
 * its reloadable keys take effect, and each key that needs a restart and
 * changed is named with both values (it keeps its current one).
 * systemd: the reload runs from RELOADING=1 to READY=1, which `systemctl
 * reload` waits for (systemd/README.md); MONOTONIC_USEC says when it began,
 * as Type=notify-reload wants. A failed reload ends with READY=1 too: the
 * daemon serves on with its settings. */
void hup_cb(struct ev_loop *loop, ev_signal *w, int revents) {
  pe_server *s = w->data;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading the configuration",
             (unsigned long long)t0.tv_sec * 1000000ull + (unsigned long long)t0.tv_nsec / 1000);
  pe_srv_config nc;
  pe_status *st = pe_config_build(&nc, s->config_path, s->overrides, s->n_overrides);
  if (st) {
    PE_LOGE("SIGHUP: reload failed, keeping the current settings: %s", pe_status_msg(st));
    sd_notifyf(0, "READY=1\nSTATUS=reload failed, keeping the current settings: %s",
               pe_status_msg(st));
    pe_status_free(st);
    return;
  }
  char *restart = pe_config_restart_changes(&s->cfg, &nc);
  if (restart) PE_LOGW("SIGHUP: not applied, these need a restart: %s", restart);
  free(restart);
  pthread_mutex_lock(&s->cfg_mu);
  pe_config_reloadable_apply(&s->cfg, &nc);
  pthread_mutex_unlock(&s->cfg_mu);
  pe_log_set_level(nc.log_level);
  pe_autosave_set_interval(s->loop->autosave, nc.checkpoint_interval_s);
  int maxsz = (int)nc.max_message;
  if (nn_setsockopt(s->loop->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz, sizeof maxsz) < 0)
    PE_LOGW("SIGHUP: NN_RCVMAXSIZE: %s", nn_strerror(nn_errno()));
  pe_reply_cache_set_limits(s->dedup, (size_t)nc.dedup_entries, (size_t)nc.dedup_bytes);
  PE_LOGI(
      "SIGHUP: reloaded %s%s: log_level %d, ttl %.0f s, max_message %lld, max_programs %d, "
      "memory_per_client %lld, max_steps_per_request %d, checkpoint_interval %.3g s",
      s->config_path ? s->config_path : "embedded defaults",
      s->n_overrides ? " and the command line" : "", (int)nc.log_level, nc.session_ttl_s,
      (long long)nc.max_message, nc.max_programs, (long long)nc.memory_per_client,
      nc.max_steps_per_request, nc.checkpoint_interval_s);
  pe_config_free(&nc);
  sd_notify(0, "READY=1");
  notify_status(s);
}
