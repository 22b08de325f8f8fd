/* The daemon-wide budget of the runs' temporaries (run_budget.h). */
#include "server/run_budget.h"

#include <time.h>

#include "server/server.h" /* pe_now_s */

struct pe_budget_waiter {
  int64_t bytes;
  pe_budget_waiter *next, *prev;
};

void pe_run_budget_init(pe_run_budget *b) {
  pthread_mutex_init(&b->mu, NULL);
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC); /* pe_now_s's clock */
  pthread_cond_init(&b->cv, &a);
  pthread_condattr_destroy(&a);
  b->reserved = 0;
  b->n_waiting = 0;
  b->head = b->tail = NULL;
}

void pe_run_budget_destroy(pe_run_budget *b) {
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
}

static void unlink_locked(pe_run_budget *b, pe_budget_waiter *x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    b->head = x->next;
  if (x->next)
    x->next->prev = x->prev;
  else
    b->tail = x->prev;
  b->n_waiting--;
  /* The next in line may fit now. */
  pthread_cond_broadcast(&b->cv);
}

static bool fits(int64_t reserved, int64_t bytes, int64_t limit) {
  return limit <= 0 || bytes <= limit - reserved;
}

pe_status *pe_run_budget_acquire(pe_run_budget *b, int64_t bytes, const pe_budget_wait *w) {
  pe_budget_waiter me = {.bytes = bytes};
  int64_t limit = w->limit(w->arg);
  pthread_mutex_lock(&b->mu);
  if (!b->head && fits(b->reserved, bytes, limit)) { /* the common case: no wait */
    b->reserved += bytes;
    pthread_mutex_unlock(&b->mu);
    return NULL;
  }
  me.prev = b->tail;
  if (b->tail)
    b->tail->next = &me;
  else
    b->head = &me;
  b->tail = &me;
  b->n_waiting++;
  for (;;) {
    if (b->head == &me && fits(b->reserved, bytes, limit)) {
      b->reserved += bytes;
      unlink_locked(b, &me);
      pthread_mutex_unlock(&b->mu);
      return NULL;
    }
    double now = pe_now_s(), until = now + 0.1;
    if (w->deadline && w->deadline < until) until = w->deadline;
    struct timespec ts = {.tv_sec = (time_t)until,
                          .tv_nsec = (long)((until - (double)(time_t)until) * 1e9)};
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    int64_t in_use = b->reserved;
    pthread_mutex_unlock(&b->mu);
    /* The callbacks run unlocked: they take other locks (the config's). */
    limit = w->limit(w->arg);
    pe_status *st = w->stop ? w->stop(w->arg) : NULL;
    if (!st && w->deadline && pe_now_s() >= w->deadline) st = w->expired(w->arg, in_use, limit);
    pthread_mutex_lock(&b->mu);
    if (st) {
      unlink_locked(b, &me);
      pthread_mutex_unlock(&b->mu);
      return st;
    }
  }
}

void pe_run_budget_release(pe_run_budget *b, int64_t bytes) {
  if (bytes <= 0) return;
  pthread_mutex_lock(&b->mu);
  b->reserved -= bytes;
  if (b->head) pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

void pe_run_budget_get(pe_run_budget *b, int64_t *reserved, int *waiting) {
  pthread_mutex_lock(&b->mu);
  if (reserved) *reserved = b->reserved;
  if (waiting) *waiting = b->n_waiting;
  pthread_mutex_unlock(&b->mu);
}
