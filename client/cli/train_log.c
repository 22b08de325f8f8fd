/* pe-client train's request marks (train_log.h). */
#include "train_log.h"

#include <stdlib.h>

bool train_log_init(train_log *l, size_t cap) {
  *l = (train_log){.m = malloc(cap * sizeof *l->m), .cap = cap};
  return l->m != NULL;
}

void train_log_free(train_log *l) {
  free(l->m);
  *l = (train_log){0};
}

void train_log_push(train_log *l, const train_mark *m) {
  if (l->n == l->cap) {
    l->start = (l->start + 1) % l->cap;
    l->n--;
  }
  l->m[(l->start + l->n++) % l->cap] = *m;
}

bool train_log_rewind(train_log *l, long step, long batch, train_mark *at, long *unfetched) {
  /* Newest first: the first mark at or before step holds it. */
  for (size_t i = l->n; i-- > 0;) {
    const train_mark *m = &l->m[(l->start + i) % l->cap];
    if (m->step > step) continue;
    long k = step - m->step;
    if (k > m->nb) return false; /* past the newest request's end */
    *at = *m;
    at->step = step;
    at->samples += k == m->nb ? m->rows : k * batch;
    at->e.steps += k;
    *unfetched = k;
    l->n = k ? i + 1 : i; /* forget what is repeated; keep a mark before step */
    return true;
  }
  return false;
}
