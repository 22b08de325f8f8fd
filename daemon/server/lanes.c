/* The request lanes' queues and threads, and the order they keep between
 * the requests of one client (see lanes.h). */
#include "server/lanes.h"

#include <nanomsg/nn.h>
#include <pthread.h>
#include <stdlib.h>

#include "server/dispatch.h"
#include "server/lanes_order.h"
#include "server/request_peek.h"

/* Jobs in the order they were queued, linked by next. */
typedef struct job_fifo {
  pe_job *head, *tail;
} job_fifo;

/* One lane: its jobs free to go, how many wait for it, and its threads'
 * wake-up. Under the lanes' mu. */
typedef struct lane_queue {
  job_fifo ready; /* free to go (no earlier request of their client unstarted) */
  int queued;     /* ready, and waiting in the order map */
  pthread_cond_t cv;
} lane_queue;

/* A request thread: the lane it serves, and its client's job that it took
 * and that has not started yet (pe_lanes_started), which the client's
 * later ones wait for. */
typedef struct lane_thread {
  pe_lanes *ls;
  pe_lane lane;
  pthread_t th;
  bool starting; /* under the lanes' mu */
  uint64_t client;
} lane_thread;

static _Thread_local lane_thread *self; /* a request thread's own */

struct pe_lanes {
  pthread_mutex_t mu; /* q, order, closing, alive, the threads' starting */
  lane_queue q[PE_LANES];
  pe_lanes_order order; /* the clients' requests waiting for earlier ones */
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

static void fifo_push(job_fifo *f, pe_job *j) {
  j->next = NULL;
  if (f->tail)
    f->tail->next = j;
  else
    f->head = j;
  f->tail = j;
}

static pe_job *fifo_pop(job_fifo *f) {
  pe_job *j = f->head;
  if (!j) return NULL;
  f->head = j->next;
  if (!f->head) f->tail = NULL;
  j->next = NULL;
  return j;
}

static void fifo_free(job_fifo *f) {
  pe_job *j;
  while ((j = fifo_pop(f))) pe_job_free(j);
}

/* j is free to go: queue it in its lane and wake a thread (mu held). */
static void push_ready(pe_lanes *ls, pe_job *j) {
  lane_queue *q = &ls->q[j->lane];
  fifo_push(&q->ready, j);
  pthread_cond_signal(&q->cv);
}

bool pe_lanes_enqueue(pe_lanes *ls, pe_job *j) {
  pe_request_peek pk; /* unreadable: zeroed, the work lane's thread answers the error */
  j->lane = pe_request_peek_read(j->body, j->len, &pk) ? pe_request_lane(pk.kind) : PE_LANE_WORK;
  j->client = pk.client;
  j->next = NULL;
  pthread_mutex_lock(&ls->mu);
  pe_order_verdict v = j->client ? pe_lanes_order_add(&ls->order, j) : PE_ORDER_GO;
  if (v != PE_ORDER_NOMEM) {
    ls->q[j->lane].queued++;
    atomic_fetch_add(&ls->counts[j->lane].queued, 1);
    if (v == PE_ORDER_GO) push_ready(ls, j);
  }
  pthread_mutex_unlock(&ls->mu);
  return v != PE_ORDER_NOMEM;
}

void pe_lanes_started(void) {
  lane_thread *t = self;
  if (!t || !t->starting) return;
  pe_lanes *ls = t->ls;
  pthread_mutex_lock(&ls->mu);
  t->starting = false;
  pe_job *next = t->client ? pe_lanes_order_started(&ls->order, t->client) : NULL;
  if (next) push_ready(ls, next);
  pthread_mutex_unlock(&ls->mu);
}

/* The job t handles next, off its queue and t's until it starts (mu
 * held): of its lane's ready jobs the one queued first; NULL: none. */
static pe_job *take(pe_lanes *ls, lane_thread *t) {
  pe_lane l = t->lane;
  pe_job *j = fifo_pop(&ls->q[l].ready);
  if (!j) return NULL;
  ls->q[l].queued--;
  atomic_fetch_sub(&ls->counts[l].queued, 1);
  atomic_fetch_add(&ls->counts[l].busy, 1);
  t->starting = true;
  t->client = j->client;
  return j;
}

static void *lane_main(void *arg) {
  lane_thread *t = arg;
  pe_lanes *ls = t->ls;
  lane_queue *q = &ls->q[t->lane];
  self = t;
  pthread_mutex_lock(&ls->mu);
  for (;;) {
    pe_job *j;
    /* A lane whose jobs all wait keeps its threads, also when closing:
     * the jobs they wait for are taken by the other lanes' threads. */
    while (!(j = take(ls, t)) && !(ls->closing && !q->queued)) pthread_cond_wait(&q->cv, &ls->mu);
    if (!j) break; /* closing and drained */
    pthread_mutex_unlock(&ls->mu);
    ls->fn(ls->ctx, j); /* takes j off its lane's busy */
    pe_lanes_started(); /* a request the handler did not start (no-op if it did) */
    pthread_mutex_lock(&ls->mu);
  }
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
  if (!ls || !ls->threads || !pe_lanes_order_init(&ls->order)) {
    if (ls) free(ls->threads);
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
      pthread_mutex_lock(&ls->mu);
      ls->alive++;
      pthread_mutex_unlock(&ls->mu);
      if (pthread_create(&t->th, NULL, lane_main, t) != 0) {
        pthread_mutex_lock(&ls->mu);
        ls->alive--;
        pthread_mutex_unlock(&ls->mu);
        pe_lanes_free(ls);
        return pe_error(PE_EINTERNAL, "server: cannot start %s request thread %d of %d",
                        pe_lane_name((pe_lane)l), i + 1, threads[l]);
      }
      ls->n_threads++;
      atomic_fetch_add(&counts[l].threads, 1);
    }
  *out = ls;
  return NULL;
}

void pe_lanes_free(pe_lanes *ls) {
  if (!ls) return;
  pe_lanes_close(ls);
  for (int i = 0; i < ls->n_threads; i++) pthread_join(ls->threads[i].th, NULL);
  for (int l = 0; l < PE_LANES; l++) {
    fifo_free(&ls->q[l].ready);
    pthread_cond_destroy(&ls->q[l].cv);
  }
  pe_lanes_order_destroy(&ls->order);
  pthread_mutex_destroy(&ls->mu);
  free(ls->threads);
  free(ls);
}
