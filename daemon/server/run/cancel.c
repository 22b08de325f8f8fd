/* pe_run_guard_check (run/cancel.h). */
#include "server/run/cancel.h"

#include "core/log.h"
#include "server/client_tag.h"

/* Why the run must stop, or NULL. */
static const char *reason(const pe_run_guard *g, char *buf, size_t len) {
  if (atomic_load(&g->s->stopping)) return "the daemon is shutting down (SIGTERM/SIGINT)";
  /* The drop first: it deregisters the model's programs too. */
  if (atomic_load(&g->p->model->dropping)) {
    snprintf(buf, len, "model '%s' is being dropped", g->p->model->name);
    return buf;
  }
  if (atomic_load(&g->p->dead)) {
    snprintf(buf, len, "program 0x%016llx was deregistered", (unsigned long long)g->p->handle);
    return buf;
  }
  return NULL;
}

pe_status *pe_run_guard_check(pe_run_guard *g, uint64_t done, uint64_t total) {
  char buf[96];
  const char *why = reason(g, buf, sizeof buf);
  if (why) {
    PE_LOGI("run of client %s on model '%s' cancelled after %llu of %llu steps: %s",
            pe_client_tag(g->client).s, g->p->model->name, (unsigned long long)done,
            (unsigned long long)total, why);
    /* Shutting down: SHUTTING_DOWN, which libpeclient fails with at once
     * unless a daemon answers again within its restart wait (a restart:
     * it registers again, whose reply names the steps done, and the run is
     * ALREADY_APPLIED). */
    pe_code code = atomic_load(&g->s->stopping) ? PE_ESHUTDOWN : PE_EIO;
    return pe_error(code, "run cancelled after %llu of %llu steps: %s", (unsigned long long)done,
                    (unsigned long long)total, why);
  }
  return NULL;
}
