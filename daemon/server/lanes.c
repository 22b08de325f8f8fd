/* The request lanes' queues and threads, the order they keep between the
 * requests of one client, and the work threads' turns at read-only runs
 * (see lanes.h). */
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

/* One lane: its jobs free to go, how many wait for it, its threads and
 * their wake-up. All under the lanes' mu. */
typedef struct lane_queue {
  job_fifo ready; /* free to go (no earlier request of their client unstarted) */
  job_fifo ro;    /* the run lane's read-only runs that are free to go */
  int queued;     /* ready, ro, and waiting in the order map */
  int threads;    /* started */
  int active;     /* handling a job */
  pthread_cond_t cv;
} lane_queue;

/* A request thread: the lane it serves, and its client's job that it took
 * and that has not started yet (pe_lanes_started), which the client's
 * later ones wait for. */
typedef struct lane_thread {
  pe_lanes *ls;
  pe_lane lane;
  pthread_t th;
  bool starting; /* under the lanes' mu, as are the two below */
  bool borrowed; /* a work thread handling a read-only run */
  uint64_t client;
} lane_thread;

static _Thread_local lane_thread *self; /* a request thread's own */

struct pe_lanes {
  pthread_mutex_t mu; /* q, order, borrowed, closing, alive, the threads' starting */
  lane_queue q[PE_LANES];
  pe_lanes_order order; /* the clients' requests waiting for earlier ones */
  int borrowed;         /* work threads handling read-only runs */
  bool closing;
  int alive; /* threads not yet ended */
  pe_lane_counts *counts;
  pe_job_handler *fn;
  pe_run_read_only *read_only; /* main thread only; NULL: no run is */
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

/* Whether a work thread may take a read-only run now (mu held): one is
 * free to go, every run thread is busy, and a work thread at least stays
 * for the work lane's own requests. */
static bool may_borrow(const pe_lanes *ls) {
  const lane_queue *run = &ls->q[PE_LANE_RUN];
  return run->ro.head && run->active >= run->threads &&
         ls->borrowed < ls->q[PE_LANE_WORK].threads - 1;
}

/* Wake the work threads when one may take a read-only run (mu held): all
 * of them, as the one a signal woke could take a work request instead. */
static void wake_borrowers(pe_lanes *ls) {
  if (may_borrow(ls)) pthread_cond_broadcast(&ls->q[PE_LANE_WORK].cv);
}

/* j is free to go: queue it in its lane and wake a thread (mu held). */
static void push_ready(pe_lanes *ls, pe_job *j) {
  lane_queue *q = &ls->q[j->lane];
  fifo_push(j->lane == PE_LANE_RUN && j->read_only ? &q->ro : &q->ready, j);
  pthread_cond_signal(&q->cv);
  wake_borrowers(ls);
}

bool pe_lanes_enqueue(pe_lanes *ls, pe_job *j) {
  /* Unreadable: zeroed (client 0 keeps no order); a control thread
   * answers it at once. */
  j->routed = pe_request_peek_read(j->body, j->len, &j->peek);
  j->lane = j->routed ? pe_request_lane(j->peek.kind) : PE_LANE_CONTROL;
  j->client = j->peek.client;
  /* Asked here, on the main thread and outside mu (it takes the
   * registry's lock): a program registered later is not looked up again. */
  j->read_only = j->lane == PE_LANE_RUN && j->peek.run_handle && ls->read_only &&
                 ls->read_only(ls->ctx, j->peek.run_handle);
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
 * held); NULL: none. Of its lane's ready jobs the one queued first; for a
 * work thread with none, a read-only run when may_borrow. */
static pe_job *take(pe_lanes *ls, lane_thread *t) {
  lane_queue *q = &ls->q[t->lane];
  pe_job *j;
  bool borrow = false;
  if (q->ready.head && (!q->ro.head || q->ready.head->seq < q->ro.head->seq))
    j = fifo_pop(&q->ready);
  else if (q->ro.head)
    j = fifo_pop(&q->ro);
  else if (t->lane == PE_LANE_WORK && may_borrow(ls))
    j = fifo_pop(&ls->q[PE_LANE_RUN].ro), borrow = true;
  else
    return NULL;
  ls->q[j->lane].queued--;
  atomic_fetch_sub(&ls->counts[j->lane].queued, 1);
  if (borrow) {
    /* Counted busy in the lane of the thread that handles it. */
    j->lane = PE_LANE_WORK;
    ls->borrowed++;
  }
  t->borrowed = borrow;
  q->active++;
  atomic_fetch_add(&ls->counts[t->lane].busy, 1);
  t->starting = true;
  t->client = j->client;
  /* The last run thread busy now: a read-only run queued behind this one
   * may go to a work thread. */
  if (t->lane == PE_LANE_RUN) wake_borrowers(ls);
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
    q->active--;
    if (t->borrowed) ls->borrowed--;
    t->borrowed = false;
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
                          pe_run_read_only *read_only, void *ctx, pe_lanes **out) {
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
  ls->read_only = read_only;
  ls->ctx = ctx;
  for (int l = 0; l < PE_LANES; l++)
    for (int i = 0; i < threads[l]; i++) {
      lane_thread *t = &ls->threads[ls->n_threads];
      t->ls = ls;
      t->lane = (pe_lane)l;
      /* Counted before it runs: its first take reads the counts. */
      pthread_mutex_lock(&ls->mu);
      ls->q[l].threads++;
      ls->alive++;
      pthread_mutex_unlock(&ls->mu);
      if (pthread_create(&t->th, NULL, lane_main, t) != 0) {
        pthread_mutex_lock(&ls->mu);
        ls->q[l].threads--;
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
    fifo_free(&ls->q[l].ro);
    pthread_cond_destroy(&ls->q[l].cv);
  }
  pe_lanes_order_destroy(&ls->order);
  pthread_mutex_destroy(&ls->mu);
  free(ls->threads);
  free(ls);
}
