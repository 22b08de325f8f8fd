/* The places trial's interleaved rounds (server/places_rounds.h). */
#include "server/places_rounds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void pe_places_round_order(int n, int round, int *order) {
  for (int k = 0; k < n; k++) order[k] = (round + k) % n;
  if (round % 2)
    for (int a = 0, b = n - 1; a < b; a++, b--) {
      int x = order[a];
      order[a] = order[b];
      order[b] = x;
    }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* What each held candidate has been timed for so far. */
typedef struct held {
  double turn_ms[PE_PLACES_MAX_ROUNDS]; /* per round: its turn's mean step time (0: none) */
  int steps;
  double timed_ms;
} held;

static bool needs_more(const pe_places_candidate *c, const held *h, int steps) {
  return !c->error[0] && (h->steps < steps || h->timed_ms < PE_PLACES_TRIAL_MIN_MS);
}

/* Each live candidate's step_ms from the rounds in which every live
 * candidate had a turn: the median of its time over the round's geometric
 * mean (a ratio within the round, which the load of that round cancels
 * out of), times the median of the rounds' geometric means (so that it
 * reads as a step time at the trial's typical load). */
static void score(pe_places_candidate *c, const int *idx, int n, const held *h, int rounds) {
  double gm[PE_PLACES_MAX_ROUNDS], ratio[PE_PLACES_MAX_ROUNDS];
  int use[PE_PLACES_MAX_ROUNDS], n_use = 0;
  for (int r = 0; r < rounds; r++) {
    double log_sum = 0;
    int live = 0;
    bool whole = true;
    for (int k = 0; k < n; k++) {
      if (c[idx[k]].error[0]) continue;
      live++;
      if (h[k].turn_ms[r] > 0)
        log_sum += log(h[k].turn_ms[r]);
      else
        whole = false;
    }
    if (!whole || !live) continue;
    gm[n_use] = exp(log_sum / live);
    use[n_use++] = r;
  }
  for (int k = 0; k < n; k++) c[idx[k]].step_ms = 0;
  if (n_use > 0) {
    for (int k = 0; k < n; k++) {
      pe_places_candidate *ck = &c[idx[k]];
      if (ck->error[0]) continue;
      for (int u = 0; u < n_use; u++) ratio[u] = h[k].turn_ms[use[u]] / gm[u];
      ck->step_ms = median(ratio, n_use);
    }
    double typical = median(gm, n_use); /* sorts gm: the ratios are taken */
    for (int k = 0; k < n; k++) {
      pe_places_candidate *ck = &c[idx[k]];
      if (ck->error[0]) continue;
      ck->step_ms *= typical;
      if (ck->step_ms <= 0) ck->step_ms = 1e-6; /* measured, below the clock's resolution */
    }
  }
}

pe_status *pe_places_rounds(pe_places_candidate *c, const int *idx, int n, int steps,
                            pe_places_turn_fn turn, pe_places_deadline_fn deadline, void *ctx) {
  if (n <= 0) return NULL;
  held *h = calloc((size_t)n, sizeof *h);
  int *order = calloc((size_t)n, sizeof *order);
  if (!h || !order) {
    free(h);
    free(order);
    return pe_error(PE_ENOMEM, "places trial: out of memory");
  }
  int round = 0;
  for (; round < PE_PLACES_MAX_ROUNDS; round++) {
    bool more = false;
    for (int k = 0; k < n; k++) more |= needs_more(&c[idx[k]], &h[k], steps);
    if (!more || (round > 0 && deadline && deadline(ctx))) break;
    pe_places_round_order(n, round, order);
    for (int k = 0; k < n; k++) {
      int j = order[k];
      pe_places_candidate *cj = &c[idx[j]];
      /* A candidate with its steps keeps taking turns while others need
       * more: every round then loads the machine alike. */
      if (cj->error[0]) continue;
      int done = 0;
      double ms = 0;
      pe_status *st = turn(ctx, idx[j], PE_PLACES_SLOT_MS, &done, &ms);
      if (st) {
        snprintf(cj->error, sizeof cj->error, "%s", pe_status_msg(st));
        pe_status_free(st);
        continue;
      }
      if (done <= 0) continue;
      held *hj = &h[j];
      hj->turn_ms[round] = ms > 0 ? ms / done : 1e-9; /* below the clock's resolution */
      hj->steps += done;
      hj->timed_ms += ms;
    }
  }
  score(c, idx, n, h, round);
  free(h);
  free(order);
  return NULL;
}
