/* The dependency engine: push(fn, reads, mutates) and the engine
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
 * that worker's queue, where idle workers steal them. (An asynchronous
 * completion from outside the pool or inside an op's fn submits them all.)
 *
 * Priority (an int, default 0) is a hint and never overrides a
 * dependency. It does exactly two things: (1) among the ops released
 * together by one completion, the highest priority runs inline and the rest
 * are queued highest first (ties keep push order); (2) an op that is ready
 * when it is pushed from outside the pool and has priority > 0 goes to the
 * pool's urgent queue, which workers empty before the normal one. Ops
 * already queued are not reordered.
 *
 * Asynchronous completion. fn may return PE_ENGINE_PENDING instead of
 * NULL or a failure: it started work that finishes later elsewhere (for
 * example chunks it submitted to the pool). The op then stays running: its
 * variables stay granted, on_done is not called, and the waits do not
 * return for it, until someone calls pe_engine_op_complete(op, st) exactly
 * once, from any thread (typically the pool task that finishes last). That
 * call is the op's completion: it releases the variables and schedules the
 * successors as described under Running; the outcome it is given follows
 * the rules under Errors like one returned by fn. fn learns its op handle from
 * pe_engine_op_current() (or its caller keeps the one pe_engine_op_new
 * returned with extra_deps > 0). A skipped op never calls fn, so it never
 * pends.
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
 * for itself; the same holds for the work of a pending op, which must not
 * wait for its op's variables or for wait_all before it completes the op).
 * A worker that waits for a variable runs other pool tasks meanwhile. */
#ifndef PE_ENGINE_DEP_ENGINE_H
#define PE_ENGINE_DEP_ENGINE_H

#include "core/status.h"
#include "engine/threadpool.h"

typedef struct pe_engine pe_engine;
typedef struct pe_engine_var pe_engine_var;
typedef struct pe_engine_op pe_engine_op;

/* The work of an op. Runs on a pool thread; returns NULL or a failure,
 * which the engine takes ownership of, or PE_ENGINE_PENDING. */
typedef pe_status *(*pe_engine_fn)(void *arg);

/* Returned by an op's fn instead of NULL or a failure: the op is not
 * finished when fn returns. Whoever finishes its work later must call
 * pe_engine_op_complete exactly once; until then the op's variables stay
 * granted, on_done is not called and pe_engine_wait_all / wait_var do not
 * return for it. Once fn returned it, fn's thread must not touch the op
 * again: the completion may already have happened. Never a real status:
 * do not free it or report it. */
extern const char pe_engine_pending_tag;
#define PE_ENGINE_PENDING ((pe_status *)&pe_engine_pending_tag)

/* The pool is borrowed and must outlive the engine. */
pe_status *pe_engine_new(pe_pool *pool, pe_engine **out);
/* Waits for every op, then frees the engine and the variables not deleted.
 * Every op handle's extra dependencies must have been dropped, and every
 * pending op must get its pe_engine_op_complete (free waits for it). */
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
  /* Optional; called exactly once per op on the thread that completed it
   * (for a pending op, the one that called pe_engine_op_complete),
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
  /* 0: none; w + 1: when the op becomes ready on a thread outside the pool
   * (or through pe_engine_op_start), queue it on pool worker w
   * (pe_pool_submit_to). Ops made ready by a completing op stay on that
   * worker, as always. */
  int affinity;
} pe_engine_op_args;

/* Register an op. With extra_deps > 0, *out (if out is not NULL) stays
 * valid until the call to pe_engine_op_dep_done that drops the last extra
 * dependency, and, if fn then returns PE_ENGINE_PENDING, until the call to
 * pe_engine_op_complete (the engine frees the op there, not before); with
 * extra_deps == 0 the op may already be running when this returns and *out
 * is set to NULL (fn gets its handle from pe_engine_op_current). */
pe_status *pe_engine_op_new(pe_engine *eng, const pe_engine_op_args *args, pe_engine_op **out);
/* One extra dependency of op is satisfied. Any thread; exactly extra_deps
 * calls per op. The call that makes the op ready submits it to the pool. */
void pe_engine_op_dep_done(pe_engine *eng, pe_engine_op *op);
/* pe_engine_op_dep_done for a dependency the caller held to start the op
 * (not a predecessor that completed): a ready op goes to the front of its
 * affinity worker's queue (pe_pool_submit_to_front), also when the caller
 * is a pool worker. */
void pe_engine_op_start(pe_engine *eng, pe_engine_op *op);

/* Kept ops: an op built once and pushed for many runs (the ops of a
 * compiled step), so that a push only resets its counter and enters its
 * variables' queues: no allocation, no sorting, and it cannot fail.
 *
 * pe_engine_op_keep builds the op from args (extra_deps and priority are
 * given at each push instead) and registers nothing. The caller owns it.
 * pe_engine_op_push_kept registers it like pe_engine_op_new with these
 * extra dependencies: the handle drives pe_engine_op_dep_done /
 * pe_engine_op_start / pe_engine_op_complete as usual. A kept op may be
 * pushed again, or freed with pe_engine_op_free_kept, once its on_done has
 * been called for the previous push (or, without on_done, once the
 * caller knows it completed, e.g. after pe_engine_wait_all); never while
 * it is pushed and not completed. Errors follow the usual rules on every
 * push: a failure is stored on the mutated variables, and a push after it
 * is skipped until pe_engine_clear_error. Free kept ops before the engine. */
pe_status *pe_engine_op_keep(pe_engine *eng, const pe_engine_op_args *args, pe_engine_op **out);
void pe_engine_op_push_kept(pe_engine *eng, pe_engine_op *op, int priority, int extra_deps);
void pe_engine_op_free_kept(pe_engine_op *op);

/* The op whose fn is running on the calling thread (the innermost one if a
 * waiting fn runs other ops meanwhile), NULL outside an op's fn. For an fn
 * that returns PE_ENGINE_PENDING to hand its own op to whoever completes it;
 * the handle is valid until that pe_engine_op_complete. */
pe_engine_op *pe_engine_op_current(void);

/* Finish an op whose fn returned PE_ENGINE_PENDING. Any thread, exactly
 * once per such op; it may even come from inside fn before fn returns.
 * st is NULL or the op's failure, which the engine takes ownership of (the
 * same rules as a failure returned by fn: stored on the mutated variables
 * and reported by wait_all). Releases the variables, calls on_done, frees
 * the op, and schedules the ops that became ready: called from a pool task
 * on a worker of the engine's pool, the highest-priority one runs inline,
 * inside this call (as after a normal completion), the others are queued;
 * called from inside an op's fn (also fn's own, before it returns
 * PE_ENGINE_PENDING) or from a thread outside the pool, they are all
 * submitted (from a worker to its own queue, where it runs next). So call
 * it last in the task, holding no lock that those ops might take. The
 * successors see what the calling thread wrote, or had acquired, before the
 * call (so chunks that count down to the last one must use acq_rel). The
 * pending op keeps the engine from being freed until this call has
 * released it. */
void pe_engine_op_complete(pe_engine *eng, pe_engine_op *op, pe_status *st);

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
