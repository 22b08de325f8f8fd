/* The dependency engine (seed 004): push(fn, reads, mutates) and the engine
 * runs fn on the pool once every earlier conflicting op is done.
 *
 * Variables are tags; the engine never looks inside them. For each
 * variable, accesses are granted in push order: consecutive reads run in
 * parallel, a mutation runs alone, after every access pushed before it and
 * before every access pushed after it. Deleting a variable is a mutation
 * that frees it. An op that lists a variable both as read and as mutated
 * mutates it.
 *
 * Counting. Each op has one atomic counter: the number of its variables
 * not yet granted, plus `extra_deps` (see pe_engine_op_new), plus one
 * while the push itself is in progress, so that an op cannot start while
 * it is half registered. Whoever brings the counter to zero schedules the
 * op. Every variable has its own lock; there is no global lock on the
 * dependency path. A push takes the locks of its variables together, in
 * address order, so concurrent pushes from several threads are ordered
 * consistently on every variable they share (no deadlock between them).
 *
 * Running. The worker that completes an op releases its variables; the
 * ops that become ready are scheduled there: the one with the highest
 * priority runs next on the same worker (no queue hop), the others go to
 * that worker's queue, where idle workers steal them.
 *
 * Priority (an int, default 0) is a hint and never overrides a
 * dependency. It does exactly two things: (1) among the ops released
 * together by one completion, the highest priority runs inline and the rest
 * are queued highest first (ties keep push order); (2) an op that is ready
 * when it is pushed from outside the pool and has priority > 0 goes to the
 * pool's urgent queue, which workers empty before the normal one. Ops
 * already queued are not reordered.
 *
 * Errors (MXNet's rule). fn returns NULL or a failure. A failure is stored
 * on every variable the op mutates (a variable keeps its first error). An
 * op whose variables (read or mutated) carry an error is skipped: its fn
 * is not called, the error is copied to the variables it mutates, and it
 * still completes so that its dependants drain. A variable's error stays
 * until pe_engine_clear_error. The engine also keeps the first failure
 * (or skip) since the last pe_engine_wait_all, which returns it.
 *
 * Threads. Every function may be called from any thread, including from
 * inside an op, except the waits: pe_engine_wait_all must not be called
 * from a pool worker (it returns PE_EINVAL there), and pe_engine_wait_var
 * must not be called by an op that itself uses the variable (it would wait
 * for itself). A worker that waits for a variable runs other pool tasks
 * meanwhile. */
#ifndef PE_ENGINE_DEP_ENGINE_H
#define PE_ENGINE_DEP_ENGINE_H

#include "core/status.h"
#include "engine/threadpool.h"

typedef struct pe_engine pe_engine;
typedef struct pe_engine_var pe_engine_var;
typedef struct pe_engine_op pe_engine_op;

/* The work of an op. Runs on a pool thread; returns NULL or a failure,
 * which the engine takes ownership of. */
typedef pe_status *(*pe_engine_fn)(void *arg);

/* The pool is borrowed and must outlive the engine. */
pe_status *pe_engine_new(pe_pool *pool, pe_engine **out);
/* Waits for every op, then frees the engine and the variables not deleted.
 * Every op handle's extra dependencies must have been dropped. */
void pe_engine_free(pe_engine *eng);

pe_status *pe_engine_new_var(pe_engine *eng, pe_engine_var **out);

/* Push fn(arg). The variable arrays are copied. fn may be NULL (an op that
 * only orders). On failure nothing was pushed and fn is never called. */
pe_status *pe_engine_push(pe_engine *eng, pe_engine_fn fn, void *arg, pe_engine_var *const *reads,
                          int n_reads, pe_engine_var *const *mutates, int n_mutates, int priority);

/* The lower level under pe_engine_push. */
typedef struct pe_engine_op_args {
  pe_engine_fn fn; /* may be NULL */
  void *arg;
  /* Optional; called exactly once per op on the thread that completed it,
   * whether fn ran, failed or was skipped, after the op's variables were
   * released and before pe_engine_wait_all can return. st is the op's
   * outcome (borrowed). Use it to free arg or to count completions. */
  void (*on_done)(void *arg, const pe_status *st);
  pe_engine_var *const *reads;
  int n_reads;
  pe_engine_var *const *mutates;
  int n_mutates;
  int priority;
  /* Dependencies the engine does not know about, counted into the same
   * counter. A compiled graph passes each op's static in-degree here and
   * calls pe_engine_op_dep_done when a predecessor finishes. The op takes
   * its place in its variables' queues now (push order is fixed by this
   * call); it runs once those grant it and extra_deps dep_done calls were
   * made. Beware: a mutation waiting on extra deps blocks later accesses to
   * its variables, so an extra dependency must not itself wait for those
   * variables through ops pushed later. */
  int extra_deps;
} pe_engine_op_args;

/* Register an op. With extra_deps > 0, *out (if out is not NULL) stays
 * valid until the call to pe_engine_op_dep_done that drops the last extra
 * dependency; with extra_deps == 0 the op may already be running when this
 * returns and *out is set to NULL. */
pe_status *pe_engine_op_new(pe_engine *eng, const pe_engine_op_args *args, pe_engine_op **out);
/* One extra dependency of op is satisfied. Any thread; exactly extra_deps
 * calls per op. The call that makes the op ready submits it to the pool. */
void pe_engine_op_dep_done(pe_engine *eng, pe_engine_op *op);

/* Wait until every op pushed before this call that uses var has completed.
 * Returns a copy of the variable's error at that point (NULL if none);
 * the caller owns it. The error is not cleared. */
pe_status *pe_engine_wait_var(pe_engine *eng, pe_engine_var *var);
/* Wait until no op is pending. Returns the first failure since the last
 * wait_all (and clears it), NULL if none. */
pe_status *pe_engine_wait_all(pe_engine *eng);

/* A mutation that frees var after every op pushed before it; var must not
 * be used by ops pushed after this call. Errors on var are discarded. */
pe_status *pe_engine_delete_var(pe_engine *eng, pe_engine_var *var);
/* Variables created and not yet freed by a delete (for tests and leak
 * checks). */
int pe_engine_var_count(pe_engine *eng);

/* A mutation that clears var's stored error (ops pushed afterwards that
 * use var run again). */
pe_status *pe_engine_clear_error(pe_engine *eng, pe_engine_var *var);

#endif
