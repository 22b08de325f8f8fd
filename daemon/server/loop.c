/* pe_server_run (server/loop.h): the loop's start (socket, watchers,
 * request threads, autosave), its run, and the shutdown (drain, the
 * persistent models' checkpoints, cleanup). */
#include "server/loop.h"

#include <nanomsg/nn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "core/log.h"
#include "server/checkpoint/save_load.h"
#include "server/registry/registry.h"

static int sock_fd(int sock, int opt) {
  int fd;
  size_t sz = sizeof fd;
  if (nn_getsockopt(sock, NN_SOL_SOCKET, opt, &fd, &sz) < 0) return -1;
  return fd;
}

/* Whether a Run of handle may take a work thread (lanes.h: read-only
 * runs); on the main thread. */
static bool run_read_only(void *ctx, uint64_t handle) {
  pe_server *s = ctx;
  return pe_registry_read_only(s->reg, handle);
}

/* request_threads for the work lane, run_threads (0: as many) for runs,
 * PE_CONTROL_THREADS for the control lane. */
static pe_status *start_request_threads(pe_server *s) {
  int threads[PE_LANES];
  threads[PE_LANE_WORK] = s->cfg.request_threads > 0 ? s->cfg.request_threads : 1;
  threads[PE_LANE_RUN] = s->cfg.run_threads > 0 ? s->cfg.run_threads : threads[PE_LANE_WORK];
  threads[PE_LANE_CONTROL] = PE_CONTROL_THREADS;
  return pe_lanes_start(threads, s->lanes, handle_job, run_read_only, s, &s->loop->lanes);
}

/* Shutdown: the persistent models' checkpoints. Returns how many could
 * not be written. */
static int checkpoint_persistent(pe_server *s) {
  if (!s->cfg.checkpoint_on_shutdown) return 0;
  int failed = 0;
  char **names;
  int n;
  pe_registry_persistent_models(s->reg, &names, &n);
  for (int i = 0; i < n; i++) {
    pe_srv_model *m;
    pe_status *st = pe_registry_model_acquire(s->reg, names[i], &m);
    char *path = NULL;
    uint64_t bytes = 0;
    bool skip = false;
    if (!st) {
      /* Nothing initialised (its restart checkpoint not restored yet, or no
       * client got to Init): keep whatever file is there. */
      skip = !pe_srv_model_has_values(m);
      if (!skip) st = pe_checkpoint_save_restart(s->cfg.state_dir, m, &path, &bytes);
      pe_registry_model_release(s->reg, m);
    }
    if (skip) {
      PE_LOGW(
          "shutdown: persistent model '%s' has no values; its restart checkpoint is left as "
          "it was",
          names[i]);
    } else if (st) {
      PE_LOGE("shutdown: checkpoint of persistent model '%s' failed: %s", names[i],
              pe_status_msg(st));
      pe_status_free(st);
      failed++;
    } else {
      PE_LOGI("shutdown: persistent model '%s' checkpointed to %s (%llu bytes)", names[i], path,
              (unsigned long long)bytes);
    }
    free(path);
    free(names[i]);
  }
  free(names);
  return failed;
}

pe_status *pe_server_run(pe_server *s) {
  pe_loop *L = calloc(1, sizeof *L);
  if (!L) return pe_error(PE_ENOMEM, "server: out of memory");
  s->loop = L;
  L->sock = -1;
  L->silent_logged = -SILENT_LOG_EVERY_S;
  pthread_mutex_init(&L->mu, NULL);
  signal(SIGPIPE, SIG_IGN);
  L->loop = ev_default_loop(EVFLAG_AUTO);
  pe_status *st = L->loop ? NULL : pe_error(PE_EIO, "server: libev loop");
  if (!st && !(L->conns = pe_conn_watch_new()))
    st = pe_error(PE_ENOMEM, "server: out of memory for the connection watch");
  if (!st) st = open_socket(s);
  int rfd = -1, sfd = -1;
  if (!st) {
    rfd = sock_fd(L->sock, NN_RCVFD);
    sfd = sock_fd(L->sock, NN_SNDFD);
    if (rfd < 0 || sfd < 0)
      st = pe_error(PE_EIO, "socket: NN_RCVFD/NN_SNDFD: %s", nn_strerror(nn_errno()));
  }
  if (!st) {
    ev_io_init(&L->rcv_w, rcv_cb, rfd, EV_READ);
    ev_io_init(&L->snd_w, snd_cb, sfd, EV_READ);
    ev_async_init(&L->reply_async, reply_async_cb);
    ev_signal_init(&L->sigterm_w, stop_cb, SIGTERM);
    ev_signal_init(&L->sigint_w, stop_cb, SIGINT);
    ev_signal_init(&L->sighup_w, hup_cb, SIGHUP);
    ev_signal_init(&L->sigusr1_w, ignored_sig_cb, SIGUSR1);
    ev_signal_init(&L->sigusr2_w, ignored_sig_cb, SIGUSR2);
    ev_timer_init(&L->tick_w, tick_cb, 1.0, 1.0);
    ev_timer_init(&L->drain_w, drain_cb, 0.01, 0.01);
    L->rcv_w.data = L->snd_w.data = L->reply_async.data = s;
    L->sigterm_w.data = L->sigint_w.data = L->sighup_w.data = s;
    L->tick_w.data = L->drain_w.data = L->watchdog_w.data = s;
    ev_io_start(L->loop, &L->rcv_w);
    ev_async_start(L->loop, &L->reply_async);
    ev_signal_start(L->loop, &L->sigterm_w);
    ev_signal_start(L->loop, &L->sigint_w);
    ev_signal_start(L->loop, &L->sighup_w);
    ev_signal_start(L->loop, &L->sigusr1_w);
    ev_signal_start(L->loop, &L->sigusr2_w);
    ev_timer_start(L->loop, &L->tick_w);
    uint64_t wd_usec = 0;
    if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
      double every = (double)wd_usec / 2e6;
      ev_timer_init(&L->watchdog_w, watchdog_cb, every, every);
      ev_timer_start(L->loop, &L->watchdog_w);
      PE_LOGI("systemd watchdog: WATCHDOG=1 every %.2f s", every);
    }
    st = start_request_threads(s);
  }
  if (!st) st = pe_metrics_endpoint_start(s, &L->metrics);
  /* Autosave: its saves run off the loop and the pool, for seconds. */
  if (!st)
    st = pe_autosave_start(s->reg, s->cfg.state_dir, s->cfg.shutdown_checkpoint,
                           s->cfg.checkpoint_interval_s, &L->autosave);
  if (!st) {
    char places[64];
    snprintf(places, sizeof places, "%s:%d", pe_place_kind_name(s->place_kind), s->n_places);
    pthread_mutex_lock(&s->cfg_mu);
    bool trial = s->cfg.places_trial;
    pthread_mutex_unlock(&s->cfg_mu);
    if (s->place_kind == PE_PLACE_CPU && !strcmp(s->cfg.places, "auto") && trial)
      snprintf(places, sizeof places, "auto: a timed trial per new model");
    PE_LOGI(
        "pe-executord %s ready on %s (places %s, request threads: %d for runs, %d for other work, "
        "%d for control requests; state %s, max message %lld)",
        PE_SERVER_VERSION, s->cfg.socket, places, atomic_load(&s->lanes[PE_LANE_RUN].threads),
        atomic_load(&s->lanes[PE_LANE_WORK].threads),
        atomic_load(&s->lanes[PE_LANE_CONTROL].threads), s->cfg.state_dir,
        (long long)s->cfg.max_message);
    sd_notifyf(0, "READY=1\nSTATUS=serving on %s", s->cfg.socket);
    ev_run(L->loop, 0);
  }
  /* Stop the request threads (also on a startup failure); requests left
   * queued (none after a clean drain) are dropped. */
  pe_lanes_free(L->lanes);
  L->lanes = NULL;
  /* Before the shutdown checkpoint, which writes the same files. */
  pe_autosave_stop(L->autosave);
  L->autosave = NULL;
  if (!st) flush_replies(s);
  /* A model that could not be saved makes the exit status 1 (after the
   * cleanup below): its values since its last checkpoint are gone, and a
   * supervisor (systemd) should say so. */
  int unsaved = st ? 0 : checkpoint_persistent(s);
  while (L->out_head) {
    out_msg *m = L->out_head;
    L->out_head = m->next;
    nn_freemsg(m->body);
    nn_freemsg(m->ctrl);
    free(m);
  }
  pe_metrics_http_stop(L->metrics); /* reads the registry and the runtime */
  if (L->sock >= 0) nn_close(L->sock);
  if (L->ipc_path[0] && !st) unlink(L->ipc_path);
  if (L->loop) ev_loop_destroy(L->loop);
  pe_conn_watch_free(L->conns);
  pthread_mutex_destroy(&L->mu);
  free(L);
  s->loop = NULL;
  if (!st && unsaved)
    st = pe_error(PE_EIO,
                  "shutdown: %d persistent model(s) could not be checkpointed (see above); their "
                  "changes since their last checkpoint are lost",
                  unsaved);
  if (!st) PE_LOGI("pe-executord stopped");
  return st;
}
