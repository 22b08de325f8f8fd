/* Background batch gathering (contract in pe_batch_prefetch.h).
 *
 * Batch k goes to pair k % 2. A pair is filled by the thread, handed to
 * the consumer by next, and is free again when the consumer calls next
 * once more. `ready`, `n`, `held`, `done` and `stop` are guarded by mu; the
 * thread writes a pair's buffers without the lock, only while that pair is
 * neither ready nor held, and publishes them by setting ready under mu. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pe_batch_prefetch.h"

struct pe_batch_prefetch {
  pe_batcher *bt;
  const pe_feed_data *rows; /* NULL: bt's own dataset (pe_batcher_next) */
  bool index;               /* x[k] gets the batch's row indices, y is unused */
  void *x[2], *y[2];
  long max; /* batches to gather, 0: to the epoch's end */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* any change of ready, held, done or stop */
  bool ready[2];     /* gathered, not yet handed out */
  int n[2];          /* its size */
  int held;          /* the pair the consumer holds, -1: none */
  long next;         /* the batch next hands out (consumer) */
  bool done;         /* the thread gathered its last batch */
  bool stop;
};

/* The next batch into pair s; false at the epoch's end. */
static bool gather(pe_batch_prefetch *pf, int s, int *n) {
  if (!pf->rows && !pf->index) return pe_batcher_next(pf->bt, pf->x[s], pf->y[s], n);
  const int64_t *idx;
  if (!pe_batcher_claim(pf->bt, &idx, n)) return false;
  if (pf->index)
    memcpy(pf->x[s], idx, (size_t)*n * sizeof *idx);
  else
    pe_feed_data_gather(pf->rows, idx, 0, *n, pf->x[s], pf->y[s]);
  return true;
}

static void *prefetch_main(void *arg) {
  pe_batch_prefetch *pf = arg;
  for (long k = 0;; k++) {
    int s = (int)(k % 2);
    pthread_mutex_lock(&pf->mu);
    while ((pf->ready[s] || pf->held == s) && !pf->stop) pthread_cond_wait(&pf->cv, &pf->mu);
    bool stop = pf->stop;
    pthread_mutex_unlock(&pf->mu);
    int n = 0;
    bool more = !stop && (!pf->max || k < pf->max) && gather(pf, s, &n);
    pthread_mutex_lock(&pf->mu);
    if (more) {
      pf->n[s] = n;
      pf->ready[s] = true;
    } else {
      pf->done = true;
    }
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
    if (!more) return NULL;
  }
}

static int start(pe_batcher *bt, const pe_feed_data *rows, bool index, void *const x[2],
                 void *const y[2], long max_batches, pe_batch_prefetch **out) {
  if (out) *out = NULL;
  if (!bt || !x || !y || !x[0] || !x[1] || !y[0] || !y[1] || !out || max_batches < 0) {
    errno = EINVAL;
    return -1;
  }
  pe_batch_prefetch *pf = calloc(1, sizeof *pf);
  if (!pf) return -1; /* errno: ENOMEM */
  *pf = (pe_batch_prefetch){.bt = bt,
                            .rows = rows,
                            .index = index,
                            .x = {x[0], x[1]},
                            .y = {y[0], y[1]},
                            .max = max_batches,
                            .held = -1};
  pthread_mutex_init(&pf->mu, NULL);
  pthread_cond_init(&pf->cv, NULL);
  int err = pthread_create(&pf->thread, NULL, prefetch_main, pf);
  if (err) {
    pthread_cond_destroy(&pf->cv);
    pthread_mutex_destroy(&pf->mu);
    free(pf);
    errno = err;
    return -1;
  }
  *out = pf;
  return 0;
}

int pe_batch_prefetch_start_rows(pe_batcher *bt, const pe_feed_data *rows, void *const x[2],
                                 void *const y[2], long max_batches, pe_batch_prefetch **out) {
  return start(bt, rows, false, x, y, max_batches, out);
}

int pe_batch_prefetch_start_index(pe_batcher *bt, int64_t *const idx[2], long max_batches,
                                  pe_batch_prefetch **out) {
  /* y is never written: the index buffers stand in for it. */
  void *const xs[2] = {idx ? idx[0] : NULL, idx ? idx[1] : NULL};
  return start(bt, NULL, true, xs, xs, max_batches, out);
}

int pe_batch_prefetch_start(pe_batcher *bt, float *const x[2], int64_t *const y[2],
                            long max_batches, pe_batch_prefetch **out) {
  void *const xs[2] = {x ? x[0] : NULL, x ? x[1] : NULL}, *const ys[2] = {y ? y[0] : NULL,
                                                                          y ? y[1] : NULL};
  return start(bt, NULL, false, xs, ys, max_batches, out);
}

int pe_batch_prefetch_next(pe_batch_prefetch *pf, int *n) {
  int s = (int)(pf->next % 2);
  pthread_mutex_lock(&pf->mu);
  pf->held = -1; /* the previous pair: the thread may refill it */
  pthread_cond_broadcast(&pf->cv);
  while (!pf->ready[s] && !pf->done) pthread_cond_wait(&pf->cv, &pf->mu);
  bool ok = pf->ready[s];
  if (ok) {
    pf->ready[s] = false;
    pf->held = s;
    *n = pf->n[s];
    pf->next++;
  }
  pthread_mutex_unlock(&pf->mu);
  if (!ok) *n = 0;
  return ok ? s : -1;
}

void pe_batch_prefetch_stop(pe_batch_prefetch *pf) {
  if (!pf) return;
  pthread_mutex_lock(&pf->mu);
  pf->stop = true;
  pthread_cond_broadcast(&pf->cv);
  pthread_mutex_unlock(&pf->mu);
  pthread_join(pf->thread, NULL);
  pthread_cond_destroy(&pf->cv);
  pthread_mutex_destroy(&pf->mu);
  free(pf);
}
