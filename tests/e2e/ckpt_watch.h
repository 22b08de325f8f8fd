/* For end-to-end tests of restarts: read what a model's restart
 * checkpoint (state/models/<model>/shutdown.ckpt, written at SIGTERM and by
 * autosave) holds, and wait for an autosave that includes a given run.
 * Header-only, inside Check test bodies. */
#ifndef PE_TESTS_CKPT_WATCH_H
#define PE_TESTS_CKPT_WATCH_H

#include "daemon_harness.h"
#include "server/checkpoint/file.h"

static inline void cw_path(const dh_daemon *d, const char *model, char *path, size_t len) {
  snprintf(path, len, "%s/models/%s/shutdown.ckpt", d->state, model);
}

/* The run origin the restart checkpoint of model records for client
 * (false when the file is missing, unreadable or has none), and, when
 * value is not NULL, a malloc'd copy of parameter `name`'s bytes (*n). */
static inline bool cw_read(const dh_daemon *d, const char *model, uint64_t client,
                           pe_run_origin *out, const char *name, uint8_t **value, size_t *n) {
  char path[512];
  cw_path(d, model, path, sizeof path);
  uint8_t *buf;
  size_t len;
  bool found = false;
  pe_status *st = pe_read_file(path, (size_t)1 << 30, &buf, &len);
  if (!st) {
    pe_ckpt_entry *e;
    int ne;
    pe_model_mark mk;
    st = pe_ckpt_decode(buf, len, path, &e, &ne, &mk);
    free(buf);
    if (!st) {
      for (int i = 0; i < mk.n_origins; i++)
        if (mk.origins[i].client == client) {
          *out = mk.origins[i];
          found = true;
        }
      for (int i = 0; value && i < ne; i++)
        if (!strcmp(e[i].name, name)) {
          *n = pe_tensor_bytes(&e[i].t);
          *value = malloc(*n ? *n : 1);
          memcpy(*value, e[i].t.data, *n);
        }
      pe_model_mark_release(&mk);
      pe_ckpt_entries_free(e, ne);
    }
  }
  pe_status_free(st);
  return found;
}

/* Wait (10 s at most) until the restart checkpoint of model records
 * request `request` of client; returns that origin. */
static inline pe_run_origin cw_wait_autosaved(const dh_daemon *d, const char *model,
                                              uint64_t client, uint64_t request) {
  double t0 = dh_now();
  for (;;) {
    pe_run_origin o;
    if (cw_read(d, model, client, &o, NULL, NULL, NULL) && o.request == request) return o;
    ck_assert_msg(dh_now() - t0 < 10, "no autosave of request %llu of model '%s' after 10 s",
                  (unsigned long long)request, model);
    dh_sleep_ms(20);
  }
}

#endif
