/* The event loop: nanomsg raw REP socket + libev on the main thread, request
 * threads, replies through ev_async, signals, timers (see server.h). */
#include "server/server.h"

#include <errno.h>
#include <ev.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/clock.h"
#include "core/log.h"
#include "server/checkpoint/autosave.h"
#include "server/checkpoint/file.h"
#include "server/checkpoint/save_load.h"
#include "server/checkpoint/stale.h"
#include "server/client_tag.h"
#include "server/conn_watch.h"
#include "server/dispatch.h"
#include "server/loop.h"
#include "server/registry/registry.h"
#include "server/reply_pack.h"
#include "server/request_decode.h"
#include "server/shm.h"
#include "server/state_lock.h"

int pe_server_pending(pe_server *s) {
  int n = 0;
  for (int l = 0; l < PE_LANES; l++)
    n += atomic_load(&s->lanes[l].queued) + atomic_load(&s->lanes[l].busy);
  return n;
}

pe_limits pe_server_limits(pe_server *s) {
  pthread_mutex_lock(&s->cfg_mu);
  pe_limits l = {s->cfg.max_message,
                 s->cfg.max_programs,
                 s->cfg.memory_per_client,
                 s->cfg.session_ttl_s,
                 (uint32_t)s->cfg.max_steps_per_request,
                 s->cfg.max_program_ops,
                 s->cfg.max_program_vars,
                 s->cfg.memory_per_run,
                 s->cfg.memory_runs_total,
                 s->cfg.memory_kept_per_program,
                 s->cfg.memory_total,
                 s->cfg.check_finite,
                 s->cfg.memory_per_request,
                 s->cfg.memory_requests_total};
  pthread_mutex_unlock(&s->cfg_mu);
  /* 0: twice the largest message (its bytes fields are copied) and room
   * for the structures of a message of ordinary entries. */
  if (l.memory_per_request <= 0) l.memory_per_request = 2 * l.max_message + (16 << 20);
  if (l.memory_requests_total > 0 && l.memory_requests_total < l.memory_per_request)
    l.memory_requests_total = l.memory_per_request;
  return l;
}

pe_status *pe_server_resolve_places(const char *spec, pe_place_kind *kind, int *n) {
  if (strcmp(spec, "auto")) return pe_places_parse(spec, kind, n);
#ifdef PE_HAVE_CUDA
  int gpus = 0;
  for (int i = 0; i < PE_MAX_PLACES; i++) {
    char dev[32];
    snprintf(dev, sizeof dev, "/dev/nvidia%d", i);
    if (access(dev, F_OK) == 0) gpus++;
  }
  if (gpus > 0) { /* every GPU; a driver that does not work: open_default_places */
    *kind = PE_PLACE_CUDA;
    *n = gpus;
    return NULL;
  }
#endif
  *kind = PE_PLACE_CPU;
  *n = 1;
  return NULL;
}

/* --- construction ------------------------------------------------------------ */

/* The runtime (its pool sized for the daemon's places) and the default
 * places' devices, opened now so that a configured device that does not
 * work (no GPU, a broken driver) stops start-up with the reason instead of
 * failing every Register. */
static pe_status *start_runtime(pe_server *s) {
  int workers = s->cfg.worker_threads > 0 ? s->cfg.worker_threads
                                          : pe_runtime_default_workers(s->place_kind, s->n_places);
  pe_runtime_opts ro = {.threads = workers, .keep_denormals = !s->cfg.flush_denormals};
  PE_TRY(pe_status_wrap(pe_runtime_new(&ro, &s->rt), "runtime"));
  pe_status *st = NULL;
  for (int p = 0; p < s->n_places && !st; p++) {
    pe_device *d;
    st = pe_runtime_device(s->rt, (pe_place){s->place_kind, p}, s->n_places, &d);
  }
  return pe_status_wrap(st, "config [runtime] places '%s'", s->cfg.places);
}

/* start_runtime, where `auto` that chose GPUs falls back to cpu:1 with a
 * warning (the daemon is still useful without them). The fallback starts a
 * new runtime: the first one's pool was sized for GPUs (the cores), which
 * would leave cpu:1 one-thread kernels on every worker. */
static pe_status *start_runtime_or_cpu(pe_server *s) {
  pe_status *st = start_runtime(s);
  if (!st || strcmp(s->cfg.places, "auto") || s->place_kind == PE_PLACE_CPU) return st;
  PE_LOGW("places auto: %s; using cpu:1", pe_status_msg(st));
  pe_status_free(st);
  pe_runtime_free(s->rt); /* closes the GPUs that did open */
  s->rt = NULL;
  s->place_kind = PE_PLACE_CPU;
  s->n_places = 1;
  return start_runtime(s);
}

pe_status *pe_server_new(pe_srv_config *cfg, const char *config_path, const pe_config_override *ov,
                         int n_ov, pe_server **out) {
  pe_server *s = calloc(1, sizeof *s);
  if (!s) return pe_error(PE_ENOMEM, "server: out of memory");
  s->cfg = *cfg;
  memset(cfg, 0, sizeof *cfg);
  pthread_mutex_init(&s->cfg_mu, NULL);
  pe_run_table_init(&s->runs);
  pe_run_budget_init(&s->run_budget);
  s->start_time = pe_now_s();
  s->state_lock = -1;
  pe_status *st = NULL;
  if (config_path && !(s->config_path = strdup(config_path)))
    st = pe_error(PE_ENOMEM, "server: out of memory");
  if (!st && n_ov > 0) {
    s->overrides = malloc((size_t)n_ov * sizeof *ov);
    if (s->overrides) {
      memcpy(s->overrides, ov, (size_t)n_ov * sizeof *ov);
      s->n_overrides = n_ov;
    } else {
      st = pe_error(PE_ENOMEM, "server: out of memory");
    }
  }
  /* The state dir's lock first: a second daemon on it stops here, before
   * it opens devices or reads a checkpoint (state_lock.h). */
  if (!st) st = pe_mkdir_p(s->cfg.state_dir, 0750);
  if (!st) st = pe_state_lock(s->cfg.state_dir, &s->state_lock);
  /* The only writer now: temporaries left by a crash are stale. */
  if (!st) pe_ckpt_remove_stale(s->cfg.state_dir);
  if (!st)
    st = pe_status_wrap(pe_server_resolve_places(s->cfg.places, &s->place_kind, &s->n_places),
                        "config [runtime] places");
  if (!st)
    st = pe_status_wrap(pe_model_check_places(s->place_kind, s->n_places),
                        "config [runtime] places '%s'", s->cfg.places);
  if (!st && !pe_sync_strategy_parse(s->cfg.sync, &s->sync))
    st = pe_error(PE_EINVAL, "config [runtime] sync '%s' unknown", s->cfg.sync);
  if (!st) st = start_runtime_or_cpu(s);
  if (!st) st = pe_registry_new(s, &s->reg);
  if (!st) st = pe_shm_table_new(&s->shm);
  if (!st && !(s->dedup = pe_reply_cache_new((size_t)s->cfg.dedup_entries,
                                             (size_t)s->cfg.dedup_bytes, send_to_job, s)))
    st = pe_error(PE_ENOMEM, "server: out of memory for the reply cache");
  if (st) {
    pe_server_free(s);
    return st;
  }
  pe_log_set_level(s->cfg.log_level);
  *out = s;
  return NULL;
}

void pe_server_free(pe_server *s) {
  if (!s) return;
  pe_registry_free(s->reg);
  pe_shm_table_free(s->shm);
  pe_reply_cache_free(s->dedup);
  pe_runtime_free(s->rt);
  pe_config_free(&s->cfg);
  free(s->config_path);
  free(s->overrides);
  pe_state_unlock(s->state_lock); /* last: the shutdown checkpoint is written */
  pthread_mutex_destroy(&s->cfg_mu);
  pe_run_table_destroy(&s->runs);
  pe_run_budget_destroy(&s->run_budget);
  free(s);
}

/* --- replies ------------------------------------------------------------------ */
/* Non-blocking send of one reply (body and ctrl are nanomsg chunks, taken
 * on success). Returns 0, or the nanomsg errno. */
static int send_now(pe_loop *L, void *body, void *ctrl) {
  struct nn_iovec iov = {&body, NN_MSG};
  struct nn_msghdr hdr = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctrl, .msg_controllen = NN_MSG};
  return nn_sendmsg(L->sock, &hdr, NN_DONTWAIT) >= 0 ? 0 : nn_errno();
}

/* Send bytes under routing header ctrl (taken), from a request thread.
 * When no reply is waiting in the out queue the thread sends it itself
 * (nanomsg sockets are thread-safe, and NN_DONTWAIT never blocks): that
 * saves the main thread's wake-up, a fifth of a small request's round trip.
 * Otherwise, or when the socket pushes back, the reply joins the queue and
 * the main thread sends it (flush_replies). Every send happens under mu and
 * only from the queue's head or into an empty queue, so replies leave in
 * the order they were handed over: the reply cache hands over the replies
 * to the copies of one request oldest first, and they must arrive so. */
void queue_reply(pe_server *s, void *ctrl, const uint8_t *bytes, size_t len) {
  pe_loop *L = s->loop;
  void *body = nn_allocmsg(len, 0);
  out_msg *m = malloc(sizeof *m);
  if (!body || !m) {
    PE_LOGE("reply of %zu bytes dropped: out of memory (the client will resend)", len);
    if (body) nn_freemsg(body);
    free(m);
    nn_freemsg(ctrl);
    return;
  }
  if (len) memcpy(body, bytes, len);
  m->ctrl = ctrl;
  m->body = body;
  m->next = NULL;
  pthread_mutex_lock(&L->mu);
  if (!L->out_head) {
    int err = send_now(L, m->body, m->ctrl);
    if (err != EAGAIN) {
      pthread_mutex_unlock(&L->mu);
      if (err) {
        PE_LOGW("send reply: %s (reply dropped; the client will resend)", nn_strerror(err));
        nn_freemsg(m->body);
        nn_freemsg(m->ctrl);
      }
      free(m); /* sent: nanomsg owns body and ctrl now */
      return;
    }
  }
  if (L->out_tail)
    L->out_tail->next = m;
  else
    L->out_head = m;
  L->out_tail = m;
  pthread_mutex_unlock(&L->mu);
  ev_async_send(L->loop, &L->reply_async);
}

/* Main thread: send what the request threads queued, in order, until the
 * socket pushes back (then wait for NN_SNDFD). Sends happen under mu, like
 * queue_reply's direct send, so a reply never overtakes one queued before
 * it (the reply cache relies on that for the copies of one request). */
void flush_replies(pe_server *s) {
  pe_loop *L = s->loop;
  bool blocked = false;
  pthread_mutex_lock(&L->mu);
  while (L->out_head) {
    out_msg *m = L->out_head;
    int err = send_now(L, m->body, m->ctrl);
    if (err == EAGAIN) {
      blocked = true;
      break;
    }
    L->out_head = m->next;
    if (!L->out_head) L->out_tail = NULL;
    if (err) {
      PE_LOGW("send reply: %s (reply dropped; the client will resend)", nn_strerror(err));
      nn_freemsg(m->body);
      nn_freemsg(m->ctrl);
    }
    free(m); /* sent: nanomsg owns body and ctrl now */
  }
  pthread_mutex_unlock(&L->mu);
  if (blocked)
    ev_io_start(L->loop, &L->snd_w);
  else
    ev_io_stop(L->loop, &L->snd_w);
}

void reply_async_cb(struct ev_loop *loop, ev_async *w, int revents) {
  flush_replies(w->data);
}
void snd_cb(struct ev_loop *loop, ev_io *w, int revents) {
  flush_replies(w->data);
}

/* Pack a reply (server/reply_pack.h: too big or out of memory, an error
 * reply takes its place; never NULL). */
const uint8_t *pack_reply(pe_server *s, Pe__Reply *rep, pe_reply_buf *rb, size_t *len,
                          bool *owned) {
  return pe_reply_pack(rep, pe_server_limits(s).max_message, malloc, rb, len, owned);
}

/* The reply cache's send (under its lock): queue the reply to a copy's
 * routing header, which the queue takes over. */
void send_to_job(void *ctx, void *copy, const uint8_t *reply, size_t len) {
  pe_job *j = copy;
  job_answering(ctx, j); /* a resend answered from the cache, before the reply leaves */
  queue_reply(ctx, j->ctrl, reply, len);
  j->ctrl = NULL;
}

/* --- request handling ------------------------------------------------------- */
/* The job stops counting in Status' queue depth (its lane's busy), once,
 * before its reply leaves: a client that has its reply never finds its
 * request still counted while the thread tidies up. Called by the thread
 * that holds the job: its handler, or send_to_job (from pe_reply_cache_begin
 * for a resend answered from the cache, on the same thread; from
 * pe_reply_cache_finish for a parked copy, whose handler let go of it). */
void job_answering(pe_server *s, pe_job *j) {
  if (j->answered) return;
  j->answered = true;
  atomic_fetch_sub(&s->lanes[j->lane].busy, 1);
}

/* A request thread's handling of one request (lanes.h: pe_job_handler):
 * decode, deduplicate, dispatch, reply. */
void handle_job(void *ctx, pe_job *j) {
  pe_server *s = ctx;
  double t0 = pe_now_s();
  atomic_fetch_add(&s->requests_total, 1);
  /* Decoded within its budget and only as it was routed (request_decode.h);
   * the budget outlives rq, which is freed through it. */
  pe_limits lim = pe_server_limits(s);
  pe_decode_budget budget;
  pe_decode_budget_init(&budget, &s->decode_pool, lim.memory_requests_total,
                        lim.memory_per_request);
  Pe__Request *rq;
  pe_status *dst = pe_request_decode(j->body, j->len, j->routed ? &j->peek : NULL, &budget, &rq);
  nn_freemsg(j->body);
  j->body = NULL;
  if (dst) {
    /* Not handled, but answered, with the ids read off the bytes (none
     * when they are unreadable). */
    Pe__Reply rep = PE__REPLY__INIT;
    rep.client_id = j->peek.client;
    rep.request_id = j->peek.request;
    rep.code = (int32_t)pe_status_code(dst);
    rep.message = (char *)pe_status_msg(dst);
    size_t len;
    bool owned;
    pe_reply_buf rb;
    const uint8_t *buf = pack_reply(s, &rep, &rb, &len, &owned);
    atomic_fetch_add(&s->requests_failed, 1);
    PE_LOGW("req client=%s id=%llu kind=? code=%s: %s", pe_client_tag(rep.client_id).s,
            (unsigned long long)rep.request_id, pe_code_name((pe_code)rep.code), rep.message);
    job_answering(s, j);
    queue_reply(s, j->ctrl, buf, len);
    j->ctrl = NULL;
    if (owned) free((void *)buf);
    pe_status_free(dst);
    pe_job_free(j);
    return;
  }
  const char *kind = pe_request_kind_name(rq->body_case);
  uint64_t cid = rq->client_id, rid = rq->request_id;
  pe_reply_cache_state seen = pe_reply_cache_begin(s->dedup, cid, rid, j->seq, j);
  if (seen != PE_DEDUP_NEW) {
    /* DONE: answered from the cache (send_to_job took it off busy first);
     * WAITING: parked, and no longer this thread's: the original's
     * finish answers it (and may free it at any moment); STALE: dropped. */
    if (seen == PE_DEDUP_STALE) job_answering(s, j);
    static const char *const what[] = {
        [PE_DEDUP_DONE] = "resend answered from the reply cache (not applied again)",
        [PE_DEDUP_WAITING] = "duplicate of a request in progress, waiting for its reply",
        [PE_DEDUP_STALE] =
            "an older copy of a request whose newer copy was answered first: not "
            "answered",
    };
    PE_LOGI("req client=%s id=%llu kind=%s: %s", pe_client_tag(cid).s, (unsigned long long)rid,
            kind, what[seen]);
    if (seen != PE_DEDUP_WAITING) pe_job_free(j); /* WAITING: parked, the original answers it */
    pe__request__free_unpacked(rq, &budget.alloc);
    return;
  }
  Pe__Reply rep = PE__REPLY__INIT;
  pe_arena arena = {0};
  pe_dispatch(s, rq, j->received, j->lane, &rep, &arena);
  size_t len = 0;
  bool owned;
  pe_reply_buf rb;
  const uint8_t *buf = pack_reply(s, &rep, &rb, &len, &owned);
  if (rep.code) atomic_fetch_add(&s->requests_failed, 1); /* a reply too big counts */
  double ms = (pe_now_s() - t0) * 1e3;
  if (rep.code)
    PE_LOGW("req client=%s id=%llu kind=%s code=%s %.2f ms: %s", pe_client_tag(cid).s,
            (unsigned long long)rid, kind, pe_code_name((pe_code)rep.code), ms, rep.message);
  else if (rq->body_case == PE__REQUEST__BODY_RUN || rq->body_case == PE__REQUEST__BODY_PING ||
           rq->body_case == PE__REQUEST__BODY_STATUS)
    PE_LOGD("req client=%s (%016llx) id=%llu kind=%s code=OK %.2f ms", pe_client_tag(cid).s,
            (unsigned long long)cid, (unsigned long long)rid, kind, ms);
  else
    PE_LOGI("req client=%s id=%llu kind=%s code=OK %.2f ms", pe_client_tag(cid).s,
            (unsigned long long)rid, kind, ms);
  pe_arena_free(&arena);
  pe__request__free_unpacked(rq, &budget.alloc);
  /* Always finished, also with the out-of-memory notice: an entry left in
   * flight would park this request's resends forever. */
  pe_reply_cache_copy *parked;
  job_answering(s, j);
  int n = pe_reply_cache_finish(s->dedup, cid, rid, j->seq, j, buf, len, &parked);
  for (int i = 0; i < n; i++) pe_job_free(parked[i].job);
  free(parked);
  if (owned) free((void *)buf);
  pe_job_free(j);
}

void rcv_cb(struct ev_loop *loop, ev_io *w, int revents) {
  pe_server *s = w->data;
  pe_loop *L = s->loop;
  /* Take a bounded batch per wakeup: NN_RCVFD stays readable while more are
   * waiting, so the loop comes back without starving replies and signals. */
  for (int k = 0; k < 64; k++) {
    void *body = NULL, *ctrl = NULL;
    struct nn_iovec iov = {&body, NN_MSG};
    struct nn_msghdr hdr = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctrl, .msg_controllen = NN_MSG};
    int n = nn_recvmsg(L->sock, &hdr, NN_DONTWAIT);
    if (n < 0) {
      int err = nn_errno();
      if (err != EAGAIN && err != EINTR) PE_LOGW("receive: %s", nn_strerror(err));
      return;
    }
    pe_job *j = calloc(1, sizeof *j);
    if (!j || !ctrl) {
      PE_LOGE("request of %d bytes dropped: %s", n, j ? "no routing header" : "out of memory");
      nn_freemsg(body);
      if (ctrl) nn_freemsg(ctrl);
      free(j);
      continue;
    }
    pe_conn_watch_message(L->conns, &hdr);
    j->body = body;
    j->len = (size_t)n;
    j->ctrl = ctrl;
    j->received = pe_now_s();
    j->seq = ++L->recv_seq;
    if (!pe_lanes_enqueue(L->lanes, j)) {
      PE_LOGE("request of %d bytes dropped: out of memory for the request order", n);
      pe_job_free(j);
    }
  }
}

/* --- timers ---------------------------------------------------------------------- */
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

/* --- signals --------------------------------------------------------------------- */
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
      "signal %d: stopping: no new requests; finishing %d in flight (%d run(s): each stops at its "
      "next step boundary), %d queued",
      w->signum, in_flight(s), pe_run_table_count(&s->runs), queued(s));
  sd_notify(0, "STOPPING=1");
  ev_io_stop(loop, &L->rcv_w);
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

/* --- socket ------------------------------------------------------------------------ */
pe_status *open_socket(pe_server *s) {
  pe_loop *L = s->loop;
  const char *addr = s->cfg.socket;
  L->sock = nn_socket(AF_SP_RAW, NN_REP);
  if (L->sock < 0) return pe_error(PE_EIO, "socket: nn_socket: %s", nn_strerror(nn_errno()));
  int maxsz = (int)s->cfg.max_message;
  if (nn_setsockopt(L->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz, sizeof maxsz) < 0)
    return pe_error(PE_EIO, "socket: NN_RCVMAXSIZE %d: %s", maxsz, nn_strerror(nn_errno()));
  if (!strncmp(addr, "ipc://", 6)) {
    snprintf(L->ipc_path, sizeof L->ipc_path, "%s", addr + 6);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", L->ipc_path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
      *slash = 0;
      PE_TRY(pe_status_wrap(pe_mkdir_p(dir, 0755), "socket %s", addr));
    }
  }
  /* An ipc socket file is created with 0777 & ~umask: under a permissive
   * umask it would be open to everyone until the chmod below, and a
   * connection made meanwhile stays. So it is created with socket_mode's
   * owner bits only, then given socket_group, and only then its group and
   * other bits (chmod below). The umask is process-wide: this runs during start-up, before
   * the request and autosave threads exist, and the pool's and devices'
   * threads create no files. */
  mode_t umask_was = 0;
  if (L->ipc_path[0]) umask_was = umask(~(mode_t)(s->cfg.socket_mode & 0700) & 0777);
  int bound = nn_bind(L->sock, addr);
  int bind_err = bound < 0 ? nn_errno() : 0;
  if (L->ipc_path[0]) {
    /* nanomsg 1.1.5 binds on this thread; wait (1 s) in case a version
     * creates the file on its worker thread, still under the umask. */
    struct stat sb;
    for (int i = 0; bound >= 0 && i < 100 && stat(L->ipc_path, &sb) != 0; i++) usleep(10000);
    umask(umask_was);
  }
  if (bound < 0) return pe_error(PE_EIO, "socket: bind %s: %s", addr, nn_strerror(bind_err));
  if (L->ipc_path[0]) {
    if (s->cfg.socket_group && s->cfg.socket_group[0]) {
      struct group *g = getgrnam(s->cfg.socket_group);
      if (!g)
        return pe_error(PE_ENOTFOUND, "socket %s: group '%s' not found", addr, s->cfg.socket_group);
      if (chown(L->ipc_path, (uid_t)-1, g->gr_gid) != 0)
        return pe_error(PE_EIO, "socket %s: chgrp %s: %s", addr, s->cfg.socket_group,
                        strerror(errno));
    }
    if (chmod(L->ipc_path, s->cfg.socket_mode) != 0)
      return pe_error(PE_EIO, "socket %s: chmod %o: %s", addr, s->cfg.socket_mode, strerror(errno));
  }
  return NULL;
}

static int sock_fd(int sock, int opt) {
  int fd;
  size_t sz = sizeof fd;
  if (nn_getsockopt(sock, NN_SOL_SOCKET, opt, &fd, &sz) < 0) return -1;
  return fd;
}

/* --- request threads: start -------------------------------------------------------- */
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

/* --- shutdown ------------------------------------------------------------------------ */
/* Returns how many persistent models could not be checkpointed. */
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
  /* Autosave: its saves run off the loop and the pool, for seconds. */
  if (!st)
    st = pe_autosave_start(s->reg, s->cfg.state_dir, s->cfg.shutdown_checkpoint,
                           s->cfg.checkpoint_interval_s, &L->autosave);
  if (!st) {
    char places[32];
    snprintf(places, sizeof places, "%s:%d", pe_place_kind_name(s->place_kind), s->n_places);
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
