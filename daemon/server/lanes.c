/* The request lanes' queues and threads, and the order they keep between
 * the requests of one client (see lanes.h). */
#include "server/lanes.h"

#include <nanomsg/nn.h>
#include <pthread.h>
#include <stdlib.h>

#include "server/dispatch.h"
#include "server/request_peek.h"

/* One lane's queue, in receive order, and the wake-up of its threads. */
typedef struct lane_queue {
  pe_job *head, *tail;
  pthread_cond_t cv;
} lane_queue;

/* A request thread: the lane it serves, and the job it took that has not
 * started yet (pe_lanes_started), which its client's later ones wait for. */
typedef struct lane_thread {
  pe_lanes *ls;
  pe_lane lane;
  pthread_t th;
  bool starting; /* under the lanes' mu */
  uint64_t client, seq;
} lane_thread;

static _Thread_local lane_thread *self; /* a request thread's own */

struct pe_lanes {
  pthread_mutex_t mu; /* q, closing, alive, queued jobs' blockers, threads' starting */
  lane_queue q[PE_LANES];
  bool closing;
  int alive; /* threads not yet ended */
  pe_lane_counts *counts;
  pe_job_handler *fn;
  void *ctx;
  lane_thread *threads;
  int n_threads; /* started */
};

const char *pe_lane_name(pe_lane l) {
  static const char *const names[PE_LANES] = {
      [PE_LANE_WORK] = "work", [PE_LANE_CONTROL] = "control", [PE_LANE_RUN] = "run"};
  return (unsigned)l < PE_LANES ? names[l] : "?";
}

void pe_job_free(pe_job *j) {
  if (j->body) nn_freemsg(j->body);
  if (j->ctrl) nn_freemsg(j->ctrl);
  free(j);
}

/* How many requests of client have not started (mu held): queued in any
 * lane, or taken and not started yet. The queues are short (a client has
 * few requests in flight), and this walks them once per request received. */
static int unstarted(pe_lanes *ls, uint64_t client) {
  int n = 0;
  for (int l = 0; l < PE_LANES; l++)
    for (const pe_job *q = ls->q[l].head; q; q = q->next) n += q->client == client;
  for (int i = 0; i < ls->n_threads; i++)
    n += ls->threads[i].starting && ls->threads[i].client == client;
  return n;
}

void pe_lanes_enqueue(pe_lanes *ls, pe_job *j) {
  pe_request_peek pk; /* unreadable: zeroed, the work lane's thread answers the error */
  j->lane = pe_request_peek_read(j->body, j->len, &pk) ? pe_request_lane(pk.kind) : PE_LANE_WORK;
  j->client = pk.client;
  j->next = NULL;
  pthread_mutex_lock(&ls->mu);
  j->blockers = j->client ? unstarted(ls, j->client) : 0;
  lane_queue *q = &ls->q[j->lane];
  if (q->tail)
    q->tail->next = j;
  else
    q->head = j;
  q->tail = j;
  atomic_fetch_add(&ls->counts[j->lane].queued, 1);
  if (!j->blockers) pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&ls->mu);
}

void pe_lanes_started(void) {
  lane_thread *t = self;
  if (!t || !t->starting) return;
  pe_lanes *ls = t->ls;
  pthread_mutex_lock(&ls->mu);
  t->starting = false;
  if (t->client)
    for (int l = 0; l < PE_LANES; l++)
      for (pe_job *q = ls->q[l].head; q; q = q->next)
        if (q->client == t->client && q->seq > t->seq && --q->blockers == 0)
          pthread_cond_signal(&ls->q[l].cv);
  pthread_mutex_unlock(&ls->mu);
}

/* The first job of t's lane that waits for no earlier request of its
 * client, off its queue and t's until it starts (mu held); NULL: none. */
static pe_job *take(pe_lanes *ls, lane_thread *t) {
  pe_lane l = t->lane;
  lane_queue *q = &ls->q[l];
  pe_job *prev = NULL, *j = q->head;
  while (j && j->blockers) {
    prev = j;
    j = j->next;
  }
  if (!j) return NULL;
  if (prev)
    prev->next = j->next;
  else
    q->head = j->next;
  if (q->tail == j) q->tail = prev;
  j->next = NULL;
  atomic_fetch_sub(&ls->counts[l].queued, 1);
  atomic_fetch_add(&ls->counts[l].busy, 1);
  t->starting = true;
  t->client = j->client;
  t->seq = j->seq;
  return j;
}

static void *lane_main(void *arg) {
  lane_thread *t = arg;
  pe_lanes *ls = t->ls;
  lane_queue *q = &ls->q[t->lane];
  self = t;
  for (;;) {
    pthread_mutex_lock(&ls->mu);
    pe_job *j;
    /* A queue of jobs that all wait keeps its threads, also when closing:
     * the jobs they wait for are taken by the other lanes' threads. */
    while (!(j = take(ls, t)) && !(ls->closing && !q->head)) pthread_cond_wait(&q->cv, &ls->mu);
    pthread_mutex_unlock(&ls->mu);
    if (!j) break;      /* closing and drained */
    ls->fn(ls->ctx, j); /* takes j off its lane's busy */
    pe_lanes_started(); /* a request the handler did not start (no-op if it did) */
  }
  pthread_mutex_lock(&ls->mu);
  ls->alive--;
  pthread_mutex_unlock(&ls->mu);
  return NULL;
}

void pe_lanes_close(pe_lanes *ls) {
  if (!ls) return;
  pthread_mutex_lock(&ls->mu);
  ls->closing = true;
  for (int l = 0; l < PE_LANES; l++) pthread_cond_broadcast(&ls->q[l].cv);
  pthread_mutex_unlock(&ls->mu);
}

int pe_lanes_alive(pe_lanes *ls) {
  pthread_mutex_lock(&ls->mu);
  int n = ls->alive;
  pthread_mutex_unlock(&ls->mu);
  return n;
}

pe_status *pe_lanes_start(const int threads[PE_LANES], pe_lane_counts *counts, pe_job_handler *fn,
                          void *ctx, pe_lanes **out) {
  *out = NULL;
  pe_lanes *ls = calloc(1, sizeof *ls);
  int total = 0;
  for (int l = 0; l < PE_LANES; l++) total += threads[l];
  if (ls) ls->threads = calloc((size_t)total, sizeof *ls->threads);
  if (!ls || !ls->threads) {
    free(ls);
    return pe_error(PE_ENOMEM, "server: out of memory for %d request threads", total);
  }
  pthread_mutex_init(&ls->mu, NULL);
  for (int l = 0; l < PE_LANES; l++) pthread_cond_init(&ls->q[l].cv, NULL);
  ls->counts = counts;
  ls->fn = fn;
  ls->ctx = ctx;
  for (int l = 0; l < PE_LANES; l++)
    for (int i = 0; i < threads[l]; i++) {
      lane_thread *t = &ls->threads[ls->n_threads];
      t->ls = ls;
      t->lane = (pe_lane)l;
      if (pthread_create(&t->th, NULL, lane_main, t) != 0) {
        pe_lanes_free(ls);
        return pe_error(PE_EINTERNAL, "server: cannot start %s request thread %d of %d",
                        pe_lane_name((pe_lane)l), i + 1, threads[l]);
      }
      ls->n_threads++;
      atomic_fetch_add(&counts[l].threads, 1);
      pthread_mutex_lock(&ls->mu);
      ls->alive++;
      pthread_mutex_unlock(&ls->mu);
    }
  *out = ls;
  return NULL;
}

void pe_lanes_free(pe_lanes *ls) {
  if (!ls) return;
  pe_lanes_close(ls);
  for (int i = 0; i < ls->n_threads; i++) pthread_join(ls->threads[i].th, NULL);
  for (int l = 0; l < PE_LANES; l++) {
    while (ls->q[l].head) {
      pe_job *j = ls->q[l].head;
      ls->q[l].head = j->next;
      pe_job_free(j);
    }
    pthread_cond_destroy(&ls->q[l].cv);
  }
  pthread_mutex_destroy(&ls->mu);
  free(ls->threads);
  free(ls);
}
