/* GET /metrics over libmicrohttpd (see metrics/http.h). */
#include "server/metrics/http.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct pe_metrics_http {
  struct MHD_Daemon *mhd;
  pe_metrics_page_fn *page;
  void *ctx;
  char addr[320]; /* for libmicrohttpd's error lines */
};

/* A fixed short body with status `code`. */
static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned code, const char *text) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET");
  enum MHD_Result ok = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ok;
}

/* libmicrohttpd's thread: every request is answered on its first call (a
 * body, which no GET has, is not read). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  pe_metrics_http *h = cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET))
    return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n");
  if (strcmp(url, "/metrics")) return reply_text(c, MHD_HTTP_NOT_FOUND, "only GET /metrics\n");
  size_t len = 0;
  char *page = h->page(h->ctx, &len);
  if (!page)
    return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory rendering the metrics\n");
  struct MHD_Response *r = MHD_create_response_from_buffer(len, page, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(page);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
  enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ok;
}

/* libmicrohttpd's own errors (a failed accept, a broken connection). */
static void on_mhd_error(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = 0;
  PE_LOGW("metrics %s: %s", (const char *)cls, msg);
}

/* "HOST:PORT" or "[HOST]:PORT" into host and port strings. */
static pe_status *split_address(const char *addr, char *host, size_t host_len, char *port,
                                size_t port_len) {
  const char *colon = strrchr(addr, ':');
  const char *h = addr;
  size_t n = colon ? (size_t)(colon - addr) : 0;
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    h++;
    n -= 2;
  }
  if (!colon || n == 0 || n >= host_len || !colon[1] || strlen(colon + 1) >= port_len)
    return pe_error(PE_EINVAL, "'%s': expected HOST:PORT like 127.0.0.1:9464", addr);
  memcpy(host, h, n);
  host[n] = 0;
  snprintf(port, port_len, "%s", colon + 1);
  return NULL;
}

/* A listening TCP socket (non-blocking, close-on-exec) on the first
 * address addr's host resolves to that binds. */
static pe_status *bind_address(const char *addr, int *fd_out, int *family) {
  char host[256], port[16];
  PE_TRY(split_address(addr, host, sizeof host, port, sizeof port));
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
  struct addrinfo *list;
  int rc = getaddrinfo(host, port, &hints, &list);
  if (rc) return pe_error(PE_EINVAL, "'%s': host '%s': %s", addr, host, gai_strerror(rc));
  int fd = -1, err = 0;
  for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    /* SO_REUSEADDR: a restart binds while the last one's connections are
     * in TIME_WAIT. */
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      err = errno;
      close(fd);
      fd = -1;
      continue;
    }
    *family = ai->ai_family;
  }
  freeaddrinfo(list);
  if (fd < 0) return pe_error(PE_EIO, "%s: cannot bind: %s", addr, strerror(err));
  *fd_out = fd;
  return NULL;
}

pe_status *pe_metrics_http_start(const char *addr, pe_metrics_page_fn *page, void *ctx,
                                 pe_metrics_http **out) {
  *out = NULL;
  int fd = -1, family = AF_INET;
  PE_TRY(bind_address(addr, &fd, &family));
  pe_metrics_http *h = calloc(1, sizeof *h);
  if (!h) {
    close(fd);
    return pe_error(PE_ENOMEM, "%s: out of memory", addr);
  }
  h->page = page;
  h->ctx = ctx;
  snprintf(h->addr, sizeof h->addr, "%s", addr);
  /* The port argument is unused with a listen socket given. */
  unsigned flags =
      MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | (family == AF_INET6 ? MHD_USE_IPv6 : 0);
  /* The logger first: libmicrohttpd's messages about later options go to it. */
  h->mhd =
      MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
                       on_mhd_error, h->addr, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                       MHD_OPTION_CONNECTION_LIMIT, (unsigned)PE_METRICS_HTTP_CONNECTIONS,
                       MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)PE_METRICS_HTTP_TIMEOUT_S,
                       MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32 * 1024), MHD_OPTION_END);
  if (!h->mhd) {
    close(fd);
    free(h);
    return pe_error(PE_EIO, "%s: libmicrohttpd did not start on it", addr);
  }
  *out = h;
  return NULL;
}

void pe_metrics_http_stop(pe_metrics_http *h) {
  if (!h) return;
  MHD_stop_daemon(h->mhd); /* joins its thread and closes the listen socket */
  free(h);
}
