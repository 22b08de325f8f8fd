/* A stream's first-error slot; see stream_error.h. */
#include "stream_error.h"

void pe_stream_error_init(pe_stream_error *x) {
  pthread_mutex_init(&x->mu, NULL);
  x->err = NULL;
  x->err_id = 0;
  atomic_init(&x->seq, 0);
}

void pe_stream_error_destroy(pe_stream_error *x) {
  pe_status_free(x->err);
  x->err = NULL;
  pthread_mutex_destroy(&x->mu);
}

void pe_stream_error_keep(pe_stream_error *x, pe_status *st) {
  pthread_mutex_lock(&x->mu);
  /* Under mu, so numbers and the kept error agree; relaxed suffices for
   * the increment, the release orders it for mark's acquire load. */
  uint64_t id = atomic_load_explicit(&x->seq, memory_order_relaxed) + 1;
  atomic_store_explicit(&x->seq, id, memory_order_release);
  if (!x->err) {
    x->err = st;
    x->err_id = id;
    st = NULL;
  }
  pthread_mutex_unlock(&x->mu);
  pe_status_free(st);
}

pe_status *pe_stream_error_take(pe_stream_error *x) {
  pthread_mutex_lock(&x->mu);
  pe_status *st = x->err;
  x->err = NULL;
  pthread_mutex_unlock(&x->mu);
  return st;
}

uint64_t pe_stream_error_mark(pe_stream_error *x) {
  /* acquire: pairs with keep's release (an error kept by a launch that
   * finished before the mark is counted). */
  return atomic_load_explicit(&x->seq, memory_order_acquire);
}

pe_status *pe_stream_error_at(pe_stream_error *x, uint64_t mark) {
  pe_status *st = NULL;
  pthread_mutex_lock(&x->mu);
  if (x->err && x->err_id <= mark) st = pe_error(x->err->code, "%s", x->err->msg);
  pthread_mutex_unlock(&x->mu);
  return st;
}
