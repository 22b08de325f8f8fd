/* The daemon-wide budget of the runs' temporaries (run/budget.h). */
#include "server/run/budget.h"

#include <time.h>

#include "core/clock.h"

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
  b->resident = 0;
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

/* A run of bytes fits within the runs' limit and, beside the resident
 * bytes, within the total (lock held). */
static bool fits(const pe_run_budget *b, int64_t bytes, int64_t limit, int64_t total) {
  return (limit <= 0 || bytes <= limit - b->reserved) &&
         (total <= 0 || bytes <= total - b->reserved - b->resident);
}

static int64_t total_of(const pe_budget_wait *w) {
  return w->total ? w->total(w->arg) : 0;
}

pe_status *pe_run_budget_acquire(pe_run_budget *b, int64_t bytes, const pe_budget_wait *w) {
  pe_budget_waiter me = {.bytes = bytes};
  int64_t limit = w->limit(w->arg), total = total_of(w);
  pthread_mutex_lock(&b->mu);
  if (!b->head && fits(b, bytes, limit, total)) { /* the common case: no wait */
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
    if (b->head == &me && fits(b, bytes, limit, total)) {
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
    total = total_of(w);
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

bool pe_run_budget_hold(pe_run_budget *b, int64_t *held, int64_t want, int64_t total,
                        int64_t *resident, int64_t *reserved) {
  pthread_mutex_lock(&b->mu);
  int64_t grow = want - *held;
  bool ok = grow <= 0 || total <= 0 || grow <= total - b->reserved - b->resident;
  if (ok && grow > 0) {
    b->resident += grow;
    *held = want;
  }
  if (resident) *resident = b->resident;
  if (reserved) *reserved = b->reserved;
  pthread_mutex_unlock(&b->mu);
  return ok;
}

void pe_run_budget_set(pe_run_budget *b, int64_t *held, int64_t want) {
  pthread_mutex_lock(&b->mu);
  b->resident += want - *held;
  /* Less resident: a waiting run may fit now. */
  if (want < *held && b->head) pthread_cond_broadcast(&b->cv);
  *held = want;
  pthread_mutex_unlock(&b->mu);
}

int64_t pe_run_budget_resident(pe_run_budget *b) {
  pthread_mutex_lock(&b->mu);
  int64_t r = b->resident;
  pthread_mutex_unlock(&b->mu);
  return r;
}

void pe_run_budget_get(pe_run_budget *b, int64_t *reserved, int *waiting) {
  pthread_mutex_lock(&b->mu);
  if (reserved) *reserved = b->reserved;
  if (waiting) *waiting = b->n_waiting;
  pthread_mutex_unlock(&b->mu);
}
