/* The daemon's Prometheus endpoint ([metrics] listen): GET /metrics
 * renders (metrics/render.h) what the status request reports, read with
 * pe_status_fill at each scrape, and the endpoint's own counters
 * (metrics/counters.h), served by libmicrohttpd (metrics/http.h).
 *
 * Threads: start and stop on the main thread, start once the daemon's
 * socket is bound, stop before the registry and the runtime are freed;
 * scrapes run on libmicrohttpd's thread, reading the server as a Status
 * request does. */
#ifndef PE_SERVER_METRICS_ENDPOINT_H
#define PE_SERVER_METRICS_ENDPOINT_H

#include "server/metrics/http.h"
#include "server/server.h"

/* Start serving on s->cfg.metrics_listen; *out NULL when that is empty
 * (off). Errors name the address. */
pe_status *pe_metrics_endpoint_start(pe_server *s, pe_metrics_http **out);

#endif
