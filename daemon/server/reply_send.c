/* Sending replies (server/loop.h): from the request threads directly, or
 * queued for the main thread when the socket pushes back, in the order
 * they were handed over. */
#include <errno.h>
#include <nanomsg/nn.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "server/loop.h"

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
