/* A stream's first-error slot, for device kinds whose launch returns before
 * anything else can see the failure (cpu, cuda): the bookkeeping of
 * device.h's "Errors" rules in one place.
 *
 * Each kept error gets a number (seq counts the errors kept so far); an
 * event records seq when it is recorded (pe_stream_error_mark), so that
 * pe_stream_error_at reports the kept error only if it came from work at or
 * before the event's position. Only the first error since the last take is
 * kept; later ones are numbered and freed.
 *
 * Threads: any; keep, take and at take mu, mark reads seq without it. */
#ifndef PE_ENGINE_STREAM_ERROR_H
#define PE_ENGINE_STREAM_ERROR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pe_stream_error {
  pthread_mutex_t mu;   /* guards err, err_id */
  pe_status *err;       /* first error since the last take */
  uint64_t err_id;      /* its number in seq */
  _Atomic uint64_t seq; /* errors numbered so far (written under mu) */
} pe_stream_error;

void pe_stream_error_init(pe_stream_error *x);
/* Frees a kept error. */
void pe_stream_error_destroy(pe_stream_error *x);
/* Keep st (owned) when the slot is empty, else free it; number it either way. */
void pe_stream_error_keep(pe_stream_error *x, pe_status *st);
/* The kept error (caller owns), the slot emptied; NULL when none. */
pe_status *pe_stream_error_take(pe_stream_error *x);
/* The position an event recorded now holds: errors numbered so far. */
uint64_t pe_stream_error_mark(pe_stream_error *x);
/* A copy of the kept error if it came from work at or before `mark` (caller
 * owns), else NULL; the slot is left alone. */
pe_status *pe_stream_error_at(pe_stream_error *x, uint64_t mark);

#endif
