/* The runs' temporary memory: limits, budget, release (run/memory.h). */
#include "server/run/memory.h"

#include "core/clock.h"
#include "engine/parallel/executor.h"
#include "server/run/cancel.h"
#include "server/server.h"

/* What a waiting run's callbacks need (pe_budget_wait.arg). */
typedef struct wait_ctx {
  pe_server *s;
  const pe_srv_program *p;
  pe_run_memory *m;
} wait_ctx;

static const char *place_str(const pe_srv_program *p, char *buf, size_t len) {
  const pe_graph *g = pe_par_exec_graph(p->exec);
  snprintf(buf, len, "%s:%d", pe_place_kind_name(g->place_kind), g->n_places);
  return buf;
}

/* A step of the run needs more than `limit` (key) on its own. */
static pe_status *too_large(const wait_ctx *w, const char *key, int64_t limit) {
  char pl[32];
  return pe_error(PE_ENOMEM,
                  "run: a batch of %lld rows needs %lld bytes of temporaries per step (%.1f MiB, "
                  "the memory plan of program 0x%016llx on %s), over the limit [limits] "
                  "%s = %lld; send smaller batches",
                  (long long)w->m->rows, (long long)w->m->need, w->m->need / 1048576.0,
                  (unsigned long long)w->p->handle, place_str(w->p, pl, sizeof pl), key,
                  (long long)limit);
}

/* A step of the run needs more than the daemon's budget has beside what
 * is resident (models, kept temporaries) for good. */
static pe_status *no_room(const wait_ctx *w, int64_t total, int64_t resident) {
  char pl[32];
  return pe_error(PE_ENOMEM,
                  "run: a batch of %lld rows needs %lld bytes of temporaries per step (%.1f MiB, "
                  "the memory plan of program 0x%016llx on %s), more than the daemon's memory "
                  "budget [limits] memory_total = %lld has beside the %lld bytes resident "
                  "(models' parameters and optimizer state, kept temporaries): %lld left; send "
                  "smaller batches, or free models (drop or deregister them)",
                  (long long)w->m->rows, (long long)w->m->need, w->m->need / 1048576.0,
                  (unsigned long long)w->p->handle, place_str(w->p, pl, sizeof pl),
                  (long long)total, (long long)resident, (long long)(total - resident));
}

/* Whether the run can ever start: under each limit on its own, and
 * beside the resident bytes within the total. */
static pe_status *fits_alone(const wait_ctx *w, const pe_limits *lim) {
  if (lim->memory_runs_total > 0 && w->m->need > lim->memory_runs_total)
    return too_large(w, "memory_runs_total", lim->memory_runs_total);
  int64_t resident = pe_run_budget_resident(&w->s->run_budget);
  if (lim->memory_total > 0 && w->m->need > lim->memory_total - resident)
    return no_room(w, lim->memory_total, resident);
  return NULL;
}

static int64_t runs_limit(void *arg) {
  return pe_server_limits(((wait_ctx *)arg)->s).memory_runs_total;
}

static int64_t total_limit(void *arg) {
  return pe_server_limits(((wait_ctx *)arg)->s).memory_total;
}

/* A cancel, the daemon stopping, a limit lowered (SIGHUP) below the run's
 * need, or models grown so that it no longer fits beside them ends the
 * wait. */
static pe_status *wait_stop(void *arg) {
  wait_ctx *w = arg;
  pe_run_guard g = {.s = w->s, .p = w->p, .client = w->m->client};
  pe_status *st = pe_run_guard_check(&g, 0, w->m->steps);
  if (st) return st;
  pe_limits lim = pe_server_limits(w->s);
  return fits_alone(w, &lim);
}

static pe_status *wait_expired(void *arg, int64_t in_use, int64_t limit) {
  wait_ctx *w = arg;
  return pe_error(PE_EDEADLINE,
                  "run: timeout of %u ms reached waiting for memory: a batch of %lld rows needs "
                  "%lld bytes of temporaries per step (%.1f MiB), the runs in flight hold %lld "
                  "(%.1f MiB) of [limits] memory_runs_total = %lld; retry later or send smaller "
                  "batches",
                  w->m->timeout_ms, (long long)w->m->rows, (long long)w->m->need,
                  w->m->need / 1048576.0, (long long)in_use, in_use / 1048576.0, (long long)limit);
}

pe_status *pe_run_memory_begin(pe_server *s, const pe_srv_program *p, pe_run_memory *m) {
  m->reserved = 0;
  m->began = false;
  pe_limits lim = pe_server_limits(s);
  wait_ctx w = {.s = s, .p = p, .m = m};
  m->need = pe_graph_run_bytes(pe_par_exec_graph(p->exec), m->rows);
  if (lim.memory_per_run > 0 && m->need > lim.memory_per_run)
    return too_large(&w, "memory_per_run", lim.memory_per_run);
  if (lim.memory_runs_total <= 0 && lim.memory_total <= 0) {
    m->began = true;
    return NULL;
  }
  PE_TRY(fits_alone(&w, &lim));
  pe_budget_wait bw = {.limit = runs_limit,
                       .stop = wait_stop,
                       .expired = wait_expired,
                       .deadline = m->timeout_ms ? pe_now_s() + m->timeout_ms / 1e3 : 0,
                       .arg = &w,
                       .total = total_limit};
  PE_TRY(pe_run_budget_acquire(&s->run_budget, m->need, &bw));
  m->reserved = m->need;
  m->began = true;
  return NULL;
}

void pe_run_memory_end(pe_server *s, pe_srv_program *p, pe_run_memory *m) {
  if (!m->began) return;
  int64_t keep = pe_server_limits(s).memory_kept_per_program;
  bool release = m->need > keep;
  if (release) pe_par_exec_release(p->exec);
  /* Kept temporaries are resident until the next run's end or the
   * program's free, counted as this run's plan sized them (the next run
   * reserves its own plan in full: an over-count while it runs). Set
   * before the reservation goes, so they are counted throughout. */
  pe_run_budget_set(&s->run_budget, &p->kept_bytes, release ? 0 : m->need);
  pe_run_budget_release(&s->run_budget, m->reserved);
  m->reserved = 0;
  m->began = false;
}
