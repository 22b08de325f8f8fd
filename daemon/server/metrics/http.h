/* The HTTP side of the Prometheus endpoint: libmicrohttpd on its own
 * thread, serving GET /metrics (404 for other paths, 405 for other
 * methods) with a page made by a callback at each scrape.
 *
 * The address is bound here, before libmicrohttpd starts, so that a bind
 * failure is an error naming the address and the reason. Scrapes are
 * bounded so that they cannot weigh on the daemon: a few connections at a
 * time, each closed after a few idle seconds, small request headers.
 *
 * Threads: start and stop on the main thread; the page callback runs on
 * libmicrohttpd's thread, one scrape at a time. Stop waits for that
 * thread, so what the callback reads must outlive pe_metrics_http_stop. */
#ifndef PE_SERVER_METRICS_HTTP_H
#define PE_SERVER_METRICS_HTTP_H

#include <stddef.h>

#include "core/status.h"

/* The page (malloc'd; taken by the server) and its length, or NULL: the
 * scrape gets 500. */
typedef char *pe_metrics_page_fn(void *ctx, size_t *len);

typedef struct pe_metrics_http pe_metrics_http;

#define PE_METRICS_HTTP_CONNECTIONS 8 /* at once; more wait in the backlog */
#define PE_METRICS_HTTP_TIMEOUT_S 10  /* an idle connection is closed after it */

/* Bind addr ("HOST:PORT"; the host a name, an IPv4 address or an
 * [IPv6] one) and start serving. Errors name the address. */
pe_status *pe_metrics_http_start(const char *addr, pe_metrics_page_fn *page, void *ctx,
                                 pe_metrics_http **out);
/* Stop serving and join the thread (a scrape in progress finishes first);
 * the socket is closed. NULL: nothing. */
void pe_metrics_http_stop(pe_metrics_http *h);

#endif
