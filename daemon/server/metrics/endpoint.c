/* The daemon's metrics page (see metrics/endpoint.h). */
#include "server/metrics/endpoint.h"

#include "core/log.h"
#include "server/dispatch.h"
#include "server/metrics/render.h"

/* libmicrohttpd's thread: one scrape. */
static char *page(void *ctx, size_t *len) {
  pe_server *s = ctx;
  Pe__StatusReply r = PE__STATUS_REPLY__INIT;
  pe_arena a = {0};
  /* PE_LANES: not taken from a lane, so no lane's busy count is its own. */
  pe_status *st = pe_status_fill(s, PE_LANES, 0, &r, &a);
  char *text = NULL;
  if (st) {
    PE_LOGW("metrics: %s", pe_status_msg(st));
    pe_status_free(st);
  } else {
    pe_limits lim = pe_server_limits(s);
    pe_metrics_view v = {
        .status = &r,
        .counters = &s->metrics,
        .limits = &lim,
        .request_decode_bytes = atomic_load(&s->decode_pool.used),
    };
    text = pe_metrics_render(&v, len);
  }
  pe_arena_free(&a);
  return text;
}

pe_status *pe_metrics_endpoint_start(pe_server *s, pe_metrics_http **out) {
  *out = NULL;
  const char *addr = s->cfg.metrics_listen;
  if (!addr || !*addr) return NULL;
  PE_TRY(pe_status_wrap(pe_metrics_http_start(addr, page, s, out), "config [metrics] listen"));
  PE_LOGI("metrics: GET http://%s/metrics", addr);
  return NULL;
}
