/* Requests (server/loop.h): received on the main thread and queued in
 * their lanes; handled on a request thread (decode, deduplicate, dispatch,
 * reply). */
#include <errno.h>
#include <nanomsg/nn.h>
#include <stdlib.h>

#include "core/arena.h"
#include "core/clock.h"
#include "core/log.h"
#include "server/client_tag.h"
#include "server/dispatch.h"
#include "server/loop.h"
#include "server/request_decode.h"
#include "server/request_peek.h"

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
    pe_metrics_count_reply(&s->metrics, PE_METRICS_KIND_UNDECODED, rep.code,
                           pe_now_s() - j->received);
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
  pe_metrics_count_reply(&s->metrics, rq->body_case, rep.code, pe_now_s() - j->received);
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

/* A request that arrives while the daemon stops is answered at once, on
 * the main thread, with SHUTTING_DOWN and the ids read off its bytes: its
 * client stops (or waits for a restart) instead of waiting out its reply
 * timeout. Nothing of it is decoded or handled. */
static void refuse_stopping(pe_server *s, void *body, size_t len, void *ctrl) {
  pe_request_peek pk;
  pe_request_peek_read(body, len, &pk); /* unreadable: ids 0, answered all the same */
  nn_freemsg(body);
  Pe__Reply rep = PE__REPLY__INIT;
  rep.client_id = pk.client;
  rep.request_id = pk.request;
  rep.code = PE_ESHUTDOWN;
  rep.message = "the daemon is shutting down: request not handled";
  size_t n;
  bool owned;
  pe_reply_buf rb;
  const uint8_t *buf = pack_reply(s, &rep, &rb, &n, &owned);
  atomic_fetch_add(&s->requests_total, 1);
  atomic_fetch_add(&s->requests_failed, 1);
  pe_metrics_count_reply(&s->metrics, pk.kind, rep.code, 0);
  PE_LOGI("req client=%s id=%llu kind=%s code=SHUTTING_DOWN: not handled (stopping)",
          pe_client_tag(pk.client).s, (unsigned long long)pk.request,
          pe_request_kind_name(pk.kind));
  queue_reply(s, ctrl, buf, n);
  if (owned) free((void *)buf);
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
    if (L->stopping) {
      free(j);
      refuse_stopping(s, body, (size_t)n, ctrl);
      continue;
    }
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
