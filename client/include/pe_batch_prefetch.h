/* Background batch gathering for a trainer's step loop (the client-side
 * counterpart of the daemon's input prefetch): a thread runs pe_batcher_next into the next of two
 * buffer pairs while the caller's request for the current batch is in flight, so the gather (a
 * random-access copy of every example) leaves the step's critical path.
 *
 * Ownership and threads: the caller owns the batcher and the buffers. From
 * pe_batch_prefetch_start to pe_batch_prefetch_stop only the prefetch
 * thread touches the batcher, and it writes a buffer pair only while the
 * caller does not hold it. One consumer thread calls next and stop.
 *
 * One epoch (or its first max_batches batches):
 *   float *x[2] = {x0, x1};
 *   int64_t *y[2] = {y0, y1};
 *   pe_batch_prefetch *pf;
 *   if (pe_batch_prefetch_start(bt, x, y, 0, &pf)) ...;
 *   int n, k;
 *   while ((k = pe_batch_prefetch_next(pf, &n)) >= 0)
 *     ... use x[k][0 .. n*dim), y[k][0 .. n) until the next call ...
 *   pe_batch_prefetch_stop(pf);
 */
#ifndef PE_BATCH_PREFETCH_H
#define PE_BATCH_PREFETCH_H

#include <stdint.h>

#include "pe_dataset.h"
#include "pe_feed_data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pe_batch_prefetch pe_batch_prefetch;

/* x[k] has room for a batch of images, y[k] for its labels (k = 0, 1).
 * max_batches > 0 stops after that many batches (the batcher is then left
 * mid-epoch: pe_batcher_reset it); 0 runs to the epoch's end. Starts the
 * thread, which gathers the first two batches at once. Returns 0, or -1
 * with errno (EINVAL: a NULL argument; ENOMEM; pthread_create's error). */
int pe_batch_prefetch_start(pe_batcher *bt, float *const x[2], int64_t *const y[2],
                            long max_batches, pe_batch_prefetch **out);
/* The same over rows' input and label rows: bt is pe_feed_data_batcher's
 * for rows, x[k] has room for a batch of input rows, y[k] for its label
 * rows (pe_feed_data_gather copies them). */
int pe_batch_prefetch_start_rows(pe_batcher *bt, const pe_feed_data *rows, void *const x[2],
                                 void *const y[2], long max_batches, pe_batch_prefetch **out);
/* The batches' row indices only (pe_batcher_claim's), idx[k] with room for
 * a batch: for a trainer whose data set lies in a shared-memory region and
 * whose feeds name rows of it (pe_client_tensor.shm_rows). */
int pe_batch_prefetch_start_index(pe_batcher *bt, int64_t *const idx[2], long max_batches,
                                  pe_batch_prefetch **out);
/* Hands back the buffer pair that the previous call returned (it may be
 * refilled from now on) and waits for the next batch: returns its pair's
 * index (0 or 1) and sets *n to its size, or returns -1 at the end. */
int pe_batch_prefetch_next(pe_batch_prefetch *pf, int *n);
/* Stops the thread (after the batch it is gathering, if any) and frees pf;
 * the batcher and every buffer are the caller's alone again. NULL is a
 * no-op. */
void pe_batch_prefetch_stop(pe_batch_prefetch *pf);

#ifdef __cplusplus
}
#endif

#endif
