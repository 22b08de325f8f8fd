/* The endpoint's own counters (see metrics/counters.h). */
#include "server/metrics/counters.h"

#include "service.pb-c.h"

const double pe_metrics_run_bounds[PE_METRICS_RUN_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

static void add(atomic_uint_fast64_t *c, uint64_t n) {
  atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

void pe_metrics_count_reply(pe_metrics_counters *m, int kind, int code, double seconds) {
  if (!m) return;
  if (kind < 0 || kind >= PE_METRICS_KINDS) kind = 0;
  if (code < 0 || code >= PE_ECODE_COUNT) code = PE_EINTERNAL;
  add(&m->requests[kind][code], 1);
  if (kind != PE__REQUEST__BODY_RUN) return;
  if (!(seconds >= 0)) seconds = 0; /* NaN too */
  int b = 0;
  while (b < PE_METRICS_RUN_BUCKETS && seconds > pe_metrics_run_bounds[b]) b++;
  add(&m->run_buckets[b], 1);
  /* 2^64 ns: 584 years of runs. */
  add(&m->run_ns_sum, (uint64_t)(seconds * 1e9));
}

void pe_metrics_count_autosave(pe_metrics_counters *m, bool ok) {
  if (!m) return;
  add(ok ? &m->autosaves : &m->autosave_failures, 1);
}

uint64_t pe_metrics_get(const atomic_uint_fast64_t *c) {
  /* C11's atomic_load takes no const object. */
  return atomic_load_explicit((atomic_uint_fast64_t *)c, memory_order_relaxed);
}
