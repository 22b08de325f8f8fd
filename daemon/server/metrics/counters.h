/* Counters the Status reply has no field for, kept for the Prometheus
 * endpoint (metrics/endpoint.h): requests by kind and reply code, the run
 * latency histogram, and autosaves by result.
 *
 * Threads: request threads and the autosave thread add with relaxed
 * atomics (no lock); the endpoint's thread reads them the same way
 * (metrics/render.c), each value exact, not all from one instant. The
 * struct lives in pe_server, zeroed with it. */
#ifndef PE_SERVER_METRICS_COUNTERS_H
#define PE_SERVER_METRICS_COUNTERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

/* Requests by kind: slot k counts body case k (0: none, unknown kinds
 * too); the last slot counts requests that did not decode. */
#define PE_METRICS_KINDS 32
#define PE_METRICS_KIND_UNDECODED (PE_METRICS_KINDS - 1)

/* The run latency histogram's upper bounds in seconds (1 ms .. 10 s);
 * one more bucket, +Inf, takes the rest. */
#define PE_METRICS_RUN_BUCKETS 13
extern const double pe_metrics_run_bounds[PE_METRICS_RUN_BUCKETS];

typedef struct pe_metrics_counters {
  atomic_uint_fast64_t requests[PE_METRICS_KINDS][PE_ECODE_COUNT];
  /* Runs per bucket, not cumulative; the last: over the largest bound. */
  atomic_uint_fast64_t run_buckets[PE_METRICS_RUN_BUCKETS + 1];
  atomic_uint_fast64_t run_ns_sum;
  atomic_uint_fast64_t autosaves, autosave_failures;
} pe_metrics_counters;

/* A request answered with `code` (pe_code; out of range counts as
 * INTERNAL) after `seconds`: kind is its body case, or
 * PE_METRICS_KIND_UNDECODED. A run (PE__REQUEST__BODY_RUN) also goes into
 * the latency histogram. m NULL: nothing. */
void pe_metrics_count_reply(pe_metrics_counters *m, int kind, int code, double seconds);
/* An autosave of one model, written or failed. m NULL: nothing. */
void pe_metrics_count_autosave(pe_metrics_counters *m, bool ok);
/* One counter's value, for a reader on another thread. */
uint64_t pe_metrics_get(const atomic_uint_fast64_t *c);

#endif
