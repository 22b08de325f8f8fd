/* The places trial's timing: candidates held at once and timed in
 * interleaved rounds (used by the daemon's trial, server/places_trial.h,
 * and pe-bench's, bench/bench_places.h).
 *
 * Why. Other processes' load on a shared machine comes and goes in bursts
 * of seconds. Timed one after another, a candidate that met a burst lost to
 * one that did not, and candidates within 5-15 % of each other were ordered
 * by the load, not by their speed. In rounds, every held candidate takes a
 * turn of PE_PLACES_SLOT_MS in each round, and a candidate's score is the
 * median over the rounds of its step time against the round's geometric
 * mean: a burst that covers whole rounds slows every turn of those rounds
 * alike and leaves their ratios as they were, and one that starts or ends
 * within a round moves the ratios of that round only, one of many. The order
 * within a round rotates (and reverses every other round), so no candidate
 * always runs right after the same one (whose caches and threads it meets).
 *
 * Every held candidate is built and warmed up (its first step) before the
 * first round, so no candidate's timed steps meet another's first
 * allocations or kernel compilation.
 *
 * The loop itself needs no clock of its own: a turn reports its steps and
 * their time, and the deadline is a callback. Threads: the caller's. */
#ifndef PE_SERVER_PLACES_ROUNDS_H
#define PE_SERVER_PLACES_ROUNDS_H

#include <stdbool.h>

#include "core/status.h"
#include "server/places_choice.h"

/* A turn times steps for at least this long (and at least one step). */
#define PE_PLACES_SLOT_MS 50.0
/* Every candidate is timed for at least this long in all, over at least
 * the trial's steps (config [runtime] places_trial_steps). */
#define PE_PLACES_TRIAL_MIN_MS 500.0
/* At most this many rounds. */
#define PE_PLACES_MAX_ROUNDS 200

/* One turn of candidate `cand` (an index into the caller's candidates):
 * run steps until at least slot_ms of them are timed (at least one step)
 * and report how many (*steps) and their time (*ms). An error ends that
 * candidate's trial (its message becomes the candidate's error). */
typedef pe_status *(*pe_places_turn_fn)(void *ctx, int cand, double slot_ms, int *steps,
                                        double *ms);
/* True when the trial's time is up: no further round starts. */
typedef bool (*pe_places_deadline_fn)(void *ctx);

/* Time the candidates c[idx[0]], ..., c[idx[n-1]] (built and warmed up by
 * the caller) in rounds until each has `steps` steps and
 * PE_PLACES_TRIAL_MIN_MS timed, PE_PLACES_MAX_ROUNDS have run, or the
 * deadline (NULL: none) says so after a first round. Sets each one's step_ms
 * to its score times the median of the rounds' geometric means (a step time
 * at the trial's typical load, in the order of the scores), or its error
 * when a turn failed. PE_ENOMEM only (the candidates keep their previous
 * state). */
pe_status *pe_places_rounds(pe_places_candidate *c, const int *idx, int n, int steps,
                            pe_places_turn_fn turn, pe_places_deadline_fn deadline, void *ctx);

/* The order of round `round` over n held candidates into order[0..n):
 * a rotation by `round`, reversed in odd rounds. */
void pe_places_round_order(int n, int round, int *order);

#endif
