/* The Prometheus text exposition format (version 0.0.4) of the daemon's
 * state: the Status reply's fields (pe_status_fill, the same source the
 * status request reads) and the endpoint's own counters
 * (metrics/counters.h). Every family has its HELP and TYPE lines; series
 * of labelled counters appear once counted (a kind and code never seen
 * has no line); label values are escaped (\\, \", \n).
 *
 * Pure: no server state is read here, so a test renders a made-up view. */
#ifndef PE_SERVER_METRICS_RENDER_H
#define PE_SERVER_METRICS_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "server/metrics/counters.h"
#include "server/server.h"
#include "service.pb-c.h"

typedef struct pe_metrics_view {
  const Pe__StatusReply *status;
  const pe_metrics_counters *counters;
  const pe_limits *limits;      /* as pe_server_limits resolves them */
  int64_t request_decode_bytes; /* decoded requests held now (decode_budget.h) */
} pe_metrics_view;

/* The page (malloc'd, NUL-terminated, *len bytes without the NUL), or NULL
 * when out of memory. */
char *pe_metrics_render(const pe_metrics_view *v, size_t *len);

#endif
