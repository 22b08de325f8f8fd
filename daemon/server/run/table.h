/* The Run requests being computed, for Status (StatusReply.runs_in_flight
 * and .runs: client, model, program, steps done of total, age), so that an
 * operator sees what keeps the daemon busy and for how long.
 *
 * Ownership: an entry lives on the stack of the request thread running its
 * run, linked in from after the program is acquired until before it is
 * released; so the model (and its name) outlives the entry.
 *
 * Threads: the list and count under mu (a leaf lock); `done` is written by
 * whoever ends a step (the request thread, or the pool worker that chains
 * a batched run's steps) and read by Status without the run's help. */
#ifndef PE_SERVER_RUN_TABLE_H
#define PE_SERVER_RUN_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/status.h"
#include "server/checkpoint/file.h" /* PE_NAME_MAX */

typedef struct pe_run_entry {
  uint64_t client, handle;
  const char *model; /* the program's model's name */
  uint32_t total;    /* steps asked for (steps, or batches) */
  _Atomic uint32_t done;
  double start; /* pe_now_s() when the run was taken up */
  struct pe_run_entry *prev, *next;
} pe_run_entry;

typedef struct pe_run_table {
  pthread_mutex_t mu;
  pe_run_entry *head, *tail; /* oldest first */
  int n;
} pe_run_table;

void pe_run_table_init(pe_run_table *t);
void pe_run_table_destroy(pe_run_table *t); /* no entry may be linked */
void pe_run_table_add(pe_run_table *t, pe_run_entry *e);
void pe_run_table_remove(pe_run_table *t, pe_run_entry *e);
int pe_run_table_count(pe_run_table *t);

/* One run as Status shows it. */
typedef struct pe_run_info {
  uint64_t client, handle;
  char model[PE_NAME_MAX + 1];
  uint32_t done, total;
  double age_s;
} pe_run_info;

/* The runs at `now`, oldest first: *out (malloc'd, NULL when none), *n. */
pe_status *pe_run_table_snapshot(pe_run_table *t, double now, pe_run_info **out, int *n);

#endif
