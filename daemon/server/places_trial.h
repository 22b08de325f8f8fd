/* places = auto's trial (config [runtime] places_trial): a register of a
 * new model on a cpu daemon times the candidates of server/places_choice.h
 * and the model is created on the fastest.
 *
 * Each candidate runs in a runtime, model and executors of its own, built
 * for the trial and freed after it, as a daemon started with places =
 * cpu:k builds them (one pool worker per place, cores / k threads each):
 * the startup once and one warm-up step, on synthetic feeds of the declared
 * shapes (floats in [-1, 1), integers 0; dim 0 the batch). The candidates
 * are held at once, as many as [limits] memory_per_run holds (normally all
 * of them: a trial's models are the user's model once per place), and
 * timed in interleaved rounds (server/places_rounds.h). The user's model is
 * never touched, so training after a trial is
 * the training of the chosen setting given by hand. Threads: the register's
 * (unlocked; no registry state is read). */
#ifndef PE_SERVER_PLACES_TRIAL_H
#define PE_SERVER_PLACES_TRIAL_H

#include "core/arena.h"
#include "server/places_choice.h"
#include "server/server.h"
#include "service.pb-c.h"

typedef struct pe_places_trial {
  pe_places_candidate cand[PE_PLACES_MAX_CANDIDATES];
  int n_cand;
  int chosen;      /* index into cand */
  bool remembered; /* read from the state dir (server/places_recall.h) */
  int64_t batch;
  double trial_s; /* wall time of the timed trial; 0 when remembered */
} pe_places_trial;

/* Time t's candidates (filled by the caller) on rq's program with `batch`
 * samples per step; no candidate is built and no round starts once
 * budget_s (> 0) has passed.
 * Sets t->chosen; PE_EINVAL naming the first candidate's error when none
 * could be measured. */
pe_status *pe_places_trial_run(pe_server *s, const Pe__RegisterRequest *rq, const pe_limits *lim,
                               int64_t batch, int steps, double budget_s, pe_places_trial *t);

/* The chosen candidate's register options: rq's, with the strategy and
 * fuse flag of t's choice (*o is a shallow copy: its strings are rq's). */
void pe_places_trial_options(const pe_places_trial *t, const Pe__RegisterOptions *base,
                             Pe__RegisterOptions *o);

/* t as a Status / Register field, in arena a; NULL: out of memory. */
Pe__PlacesTrial *pe_places_trial_pb(const pe_places_trial *t, pe_arena *a);

#endif
