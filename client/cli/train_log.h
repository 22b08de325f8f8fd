/* pe-client train's record of its recent training requests: where each
 * began (global step, samples, its epoch's running sums), so that the
 * trainer can go back to the step a restored model's parameters stand at
 * and repeat the steps the restore rolled back, in their order, on the
 * same batches. Owned by the trainer; one thread. */
#ifndef PE_CLI_TRAIN_LOG_H
#define PE_CLI_TRAIN_LOG_H

#include <stdbool.h>
#include <stddef.h>

/* One epoch's running sums: loss and accuracy weighted by the samples
 * whose fetches came back (samples); steps counts every step. */
typedef struct epoch_sums {
  double loss, acc, last_loss;
  long samples, steps;
} epoch_sums;

/* A request: the run's totals before it, what it covered (nb mini-batches
 * of the batch size, or one short batch of rows), its epoch's sums before
 * it. */
typedef struct train_mark {
  long step, samples;
  long nb, rows;
  epoch_sums e;
} train_mark;

/* The newest `cap` marks, oldest first. */
typedef struct train_log {
  train_mark *m;
  size_t cap, start, n;
} train_log;

bool train_log_init(train_log *l, size_t cap);
void train_log_free(train_log *l);
/* Record a request (the oldest mark goes when full). */
void train_log_push(train_log *l, const train_mark *m);
/* The state at global step `step`, in *at: the mark of the request that
 * holds it, advanced by the *unfetched steps of that request before `step`
 * (their losses are unknown: counted in e.steps, not in e.samples). The
 * marks of requests from `step` on are forgotten (they are repeated).
 * False when `step` is older than the oldest mark or past the newest
 * request's end. */
bool train_log_rewind(train_log *l, long step, long batch, train_mark *at, long *unfetched);

#endif
