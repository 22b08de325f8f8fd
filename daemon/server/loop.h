/* The server's event loop, private to the files that make it up (see
 * server.h for the threads):
 *   server.c     the server object: limits, places, construction, free
 *   loop.c       pe_server_run: start, the loop, drain and shutdown
 *   socket.c     the nanomsg socket and its ipc file
 *   receive.c    receiving requests (main thread), handling one (request
 *                threads)
 *   reply_send.c replies: sent by the request threads or queued for the
 *                main thread, in order
 *   timers.c     the tick (session expiry, silent ends, status), watchdog
 *   signals.c    SIGTERM/SIGINT (drain), SIGHUP (reload), ignored signals
 * Threads: pe_loop belongs to the main thread but for mu and what it
 * guards (the out queue). */
#ifndef PE_SERVER_LOOP_H
#define PE_SERVER_LOOP_H

#include <ev.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/checkpoint/autosave.h"
#include "server/conn_watch.h"
#include "server/lanes.h"
#include "server/metrics/endpoint.h"
#include "server/reply_pack.h"
#include "server/server.h"

/* One reply on its way to the main thread. */
typedef struct out_msg {
  void *ctrl; /* routing header (nanomsg chunk) */
  void *body; /* nanomsg chunk */
  struct out_msg *next;
} out_msg;

struct pe_loop {
  struct ev_loop *loop;
  int sock;
  ev_io rcv_w, snd_w;
  ev_async reply_async;
  ev_signal sigterm_w, sigint_w, sighup_w, sigusr1_w, sigusr2_w;
  ev_timer tick_w, watchdog_w, drain_w;

  pthread_mutex_t mu; /* out */
  out_msg *out_head, *out_tail;
  uint64_t recv_seq; /* main thread only */

  pe_lanes *lanes;       /* the request threads and their queues */
  pe_autosave *autosave; /* its own thread; stopped before the shutdown checkpoint */
  /* [metrics] listen (NULL: off); stopped before the server is freed. */
  pe_metrics_http *metrics;
  bool stopping;
  char ipc_path[4096]; /* the socket file of an ipc:// address, else "" */
  /* Connections that ended before delivering a request (conn_watch.h),
   * not logged yet, and when the last warning went out. */
  pe_conn_watch *conns;
  uint64_t silent_ends;
  double silent_since, silent_logged;
};

/* At most one warning about silent connection ends per this many seconds
 * (a REQ client resending an oversized message ends one every 100 ms). */
#define SILENT_LOG_EVERY_S 60.0

/* reply_send.c */
void queue_reply(pe_server *s, void *ctrl, const uint8_t *bytes, size_t len);
void flush_replies(pe_server *s);
void reply_async_cb(struct ev_loop *loop, ev_async *w, int revents);
void snd_cb(struct ev_loop *loop, ev_io *w, int revents);
const uint8_t *pack_reply(pe_server *s, Pe__Reply *rep, pe_reply_buf *rb, size_t *len, bool *owned);
void send_to_job(void *ctx, void *copy, const uint8_t *reply, size_t len);
/* receive.c */
void job_answering(pe_server *s, pe_job *j);
void handle_job(void *ctx, pe_job *j);
void rcv_cb(struct ev_loop *loop, ev_io *w, int revents);
/* timers.c */
void notify_status(pe_server *s);
void tick_cb(struct ev_loop *loop, ev_timer *w, int revents);
void watchdog_cb(struct ev_loop *loop, ev_timer *w, int revents);
/* signals.c */
void drain_cb(struct ev_loop *loop, ev_timer *w, int revents);
void stop_cb(struct ev_loop *loop, ev_signal *w, int revents);
void ignored_sig_cb(struct ev_loop *loop, ev_signal *w, int revents);
void hup_cb(struct ev_loop *loop, ev_signal *w, int revents);
/* socket.c */
pe_status *open_socket(pe_server *s);

#endif
