/* The OpenMP wait policy of a process whose kernels share the cores
 * (pe-executord, pe-bench).
 *
 * Why. oneDNN runs on libgomp. Without OMP_WAIT_POLICY (or GOMP_SPINCOUNT)
 * in the environment, a libgomp thread that finished its share of a
 * parallel region spins ~300,000 iterations (a few ms) before it sleeps.
 * The daemon's pool workers, other places' teams and other processes then
 * wait for cores those threads burn, and a region whose team member was
 * descheduled waits for it at the barrier. Measured (MLP on
 * 2 shared cores): 1.6-165x fewer samples/s than with OMP_WAIT_POLICY=passive
 * (the more load, the more; README), which every published number used.
 *
 * How. libgomp reads its environment in a library constructor, before
 * main, so a setenv in main is too late for this process. pe_omp_policy_init,
 * first thing in main, therefore sets OMP_WAIT_POLICY=passive and re-executes
 * the program (/proc/self/exe, same argv, same pid, nothing opened yet) when
 * the user set neither variable; an explicit OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT is kept as it is (a dedicated machine may prefer
 * OMP_WAIT_POLICY=active). If the re-exec fails, the process carries on with
 * libgomp's default and pe_omp_policy_describe says so.
 *
 * Not thread-safe: call it before any thread exists. */
#ifndef PE_CORE_OMP_POLICY_H
#define PE_CORE_OMP_POLICY_H

#include <stdbool.h>
#include <stddef.h>

/* Set the policy (see above); returns only when no re-exec happened or it
 * failed (false then). prog names the program in describe's text
 * ("pe-executord"). */
bool pe_omp_policy_init(const char *prog, char **argv);
/* One line for the log: the policy in force and where it came from. */
const char *pe_omp_policy_describe(char *buf, size_t n);
/* OMP_WAIT_POLICY as libgomp read it (NULL: unset, libgomp's default or
 * GOMP_SPINCOUNT's spin count). */
const char *pe_omp_policy_value(void);

#endif
