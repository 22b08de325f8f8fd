/* The daemon's clock for ages, deadlines and timings: CLOCK_MONOTONIC, so
 * a wall-clock change moves no deadline. Condition variables that wait on
 * its times are set to the same clock (pthread_condattr_setclock). */
#ifndef PE_CORE_CLOCK_H
#define PE_CORE_CLOCK_H

double pe_now_s(void); /* CLOCK_MONOTONIC seconds */

#endif
