/* The Status reply: uptime, places with parameter bytes, models (with what
 * their checkpoints did), programs, queue depth, the runs in flight (client,
 * model, steps done of total, age), the request lanes (threads, busy,
 * queued), request counters, clients,
 * reply cache counters, the autosave interval, the process's memory,
 * whether steps run as captured CUDA graphs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/allocator.h"
#include "core/arena.h"
#include "core/clock.h"
#include "engine/device.h"
#include "engine/step_graph_key.h"
#include "server/client_tag.h"
#include "server/dispatch.h"
#include "server/registry/registry.h"

/* The lanes' threads, busy ones and queues; busy leaves out this Status
 * (taken from `self`). */
static pe_status *fill_lanes(pe_server *s, pe_lane self, Pe__StatusReply *r, pe_arena *a) {
  r->lanes = pe_arena_alloc(a, sizeof *r->lanes * PE_LANES);
  if (!r->lanes) return pe_error(PE_ENOMEM, "status: out of memory");
  for (int l = 0; l < PE_LANES; l++) {
    Pe__LaneStatus *x = pe_arena_alloc(a, sizeof *x);
    if (!x) return pe_error(PE_ENOMEM, "status: out of memory");
    pe__lane_status__init(x);
    x->name = (char *)pe_lane_name((pe_lane)l);
    x->threads = atomic_load(&s->lanes[l].threads);
    x->queued = atomic_load(&s->lanes[l].queued);
    x->busy = atomic_load(&s->lanes[l].busy) - (l == (int)self);
    if (x->busy < 0) x->busy = 0;
    r->lanes[r->n_lanes++] = x;
  }
  return NULL;
}

/* The process's resident bytes (statm's second field, in pages); 0 when
 * unknown. */
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  int n = f ? fscanf(f, "%llu %llu", &size, &resident) : 0;
  if (f) fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  return n == 2 && page > 0 ? resident * (uint64_t)page : 0;
}

/* The process's memory and the daemon's budget: resident and host
 * allocator bytes, the runs' reservations and waiters, memory_total. */
static void fill_memory(pe_server *s, Pe__StatusReply *r) {
  pe_alloc_stats host = pe_allocator_stats(pe_host_allocator());
  r->rss_bytes = rss_bytes();
  r->host_bytes_in_use = host.bytes_in_use;
  r->host_bytes_cached = host.bytes_cached;
  int64_t reserved;
  int waiting;
  pe_run_budget_get(&s->run_budget, &reserved, &waiting);
  r->run_bytes_reserved = (uint64_t)reserved;
  r->runs_waiting_for_memory = waiting;
  int64_t total = pe_server_limits(s).memory_total;
  r->memory_total_bytes = total > 0 ? (uint64_t)total : 0;
  r->memory_resident_bytes = (uint64_t)pe_run_budget_resident(&s->run_budget);
}

/* Whether steps on the default places are captured, and why not. */
static void fill_cuda_graph(pe_server *s, Pe__StatusReply *r) {
  pe_cuda_graph_mode mode = PE_CUDA_GRAPH_AUTO;
  if (s->cfg.cuda_graph) pe_cuda_graph_mode_parse(s->cfg.cuda_graph, &mode);
  const char *why;
  r->cuda_graph = pe_cuda_graph_decide(mode, s->place_kind, s->n_places,
                                       pe_device_kind_ops(PE_PLACE_CUDA) != NULL, &why);
  r->cuda_graph_reason = (char *)(why ? why : "");
}

/* The runs in flight (run/table.h): client, model, steps done of total,
 * age. */
static pe_status *fill_runs(pe_server *s, uint64_t asker, Pe__StatusReply *r, pe_arena *a) {
  pe_run_info *runs;
  int n_runs;
  PE_TRY(pe_run_table_snapshot(&s->runs, pe_now_s(), &runs, &n_runs));
  if (!pe_arena_own(a, runs, NULL) && n_runs) return pe_error(PE_ENOMEM, "status: out of memory");
  r->runs_in_flight = n_runs;
  r->runs = pe_arena_alloc(a, sizeof *r->runs * (size_t)(n_runs ? n_runs : 1));
  if (!r->runs) return pe_error(PE_ENOMEM, "status: out of memory");
  for (int i = 0; i < n_runs; i++) {
    Pe__RunStatus *x = pe_arena_alloc(a, sizeof *x);
    if (!x) return pe_error(PE_ENOMEM, "status: out of memory");
    pe__run_status__init(x);
    /* Others' runs by their tag only (client_tag.h: an id is a credential). */
    x->client_id = asker && runs[i].client == asker ? asker : 0;
    x->client = pe_arena_strdup(a, pe_client_tag(runs[i].client).s);
    if (!x->client) return pe_error(PE_ENOMEM, "status: out of memory");
    x->model = runs[i].model;
    x->handle = runs[i].handle;
    x->steps_done = runs[i].done;
    x->steps_total = runs[i].total;
    x->age_s = runs[i].age_s;
    r->runs[r->n_runs++] = x;
  }
  return NULL;
}

/* The compute pool's size, the reply cache's counters and the autosave
 * interval. */
static void fill_pool_and_cache(pe_server *s, Pe__StatusReply *r) {
  /* The pool's real size (worker_threads = 0: pe_runtime_default_workers). */
  r->worker_threads = pe_pool_threads(pe_runtime_pool(s->rt));
  pe_reply_cache_stats ds;
  pe_reply_cache_stats_get(s->dedup, &ds);
  r->reply_cache_entries = ds.entries;
  r->reply_cache_bytes = ds.bytes;
  r->resends_answered = ds.hits;
  r->resends_waited = ds.waits;
  r->resends_stale = ds.stale;
  r->reply_cache_evictions = ds.evictions;
  pthread_mutex_lock(&s->cfg_mu);
  r->checkpoint_interval_s = s->cfg.checkpoint_interval_s;
  pthread_mutex_unlock(&s->cfg_mu);
}

/* One model of the registry's snapshot: its programs, parameter bytes and
 * what its checkpoints did; NULL: out of memory. */
static Pe__ModelStatus *model_status(pe_model_snapshot *x, pe_arena *a) {
  Pe__ModelStatus *m = pe_arena_alloc(a, sizeof *m);
  if (!m) return NULL;
  pe__model_status__init(m);
  m->name = x->name;
  m->programs = x->programs;
  m->param_bytes = x->param_bytes * x->n_places;
  m->persistent = x->persistent;
  const pe_ckpt_record *c = &x->ckpt;
  m->checkpoints_saved = c->saved;
  m->checkpoint_failures = c->failed;
  m->last_checkpoint = pe_arena_strdup(a, c->last);
  m->last_checkpoint_error = pe_arena_strdup(a, c->last_error);
  if (!m->last_checkpoint || !m->last_checkpoint_error) return NULL;
  m->last_checkpoint_age_s = c->saved ? pe_now_s() - c->last_time : -1;
  m->changes_since_checkpoint =
      c->saved && x->changes >= c->last_version ? (int64_t)(x->changes - c->last_version) : -1;
  /* What a crash would lose: changes since the restart checkpoint's
   * values (a named save is not restored after a crash). */
  m->restart_checkpoint = pe_arena_strdup(a, x->restart_name);
  if (!m->restart_checkpoint) return NULL;
  m->restart_checkpoint_age_s = c->restart_known ? pe_now_s() - c->restart_time : -1;
  m->changes_since_restart_checkpoint = c->restart_known && x->changes >= c->restart_version
                                            ? (int64_t)(x->changes - c->restart_version)
                                            : -1;
  m->restart_checkpoint_read = c->restart_known && c->restart_read;
  if (x->has_trial && !(m->places_trial = pe_places_trial_pb(&x->trial, a))) return NULL;
  return m;
}

/* The registry's models, programs and clients; the snapshot's models (owned
 * by the arena) in *ms, for the places. */
static pe_status *fill_models(pe_server *s, Pe__StatusReply *r, pe_arena *a, pe_model_snapshot **ms,
                              int *nm) {
  int np = 0, nc = 0;
  pe_registry_snapshot(s->reg, true, ms, nm, &np, &nc);
  if (!pe_arena_own(a, *ms, NULL) && *nm) return pe_error(PE_ENOMEM, "status: out of memory");
  r->programs = np;
  r->clients = nc;
  r->models = pe_arena_alloc(a, sizeof *r->models * (size_t)(*nm ? *nm : 1));
  if (!r->models || !r->version) return pe_error(PE_ENOMEM, "status: out of memory");
  for (int i = 0; i < *nm; i++) {
    Pe__ModelStatus *m = model_status(&(*ms)[i], a);
    if (!m) return pe_error(PE_ENOMEM, "status: out of memory");
    r->models[r->n_models++] = m;
  }
  return NULL;
}

/* Places: the daemon's own plus every place a model lives on (a model
 * registered on cpu:2 or sim:4 opens those places), each with the
 * parameter bytes the models keep there (one replica per place). */
static pe_status *fill_places(pe_server *s, Pe__StatusReply *r, pe_arena *a,
                              const pe_model_snapshot *ms, int nm) {
  int count[PE_PLACE_KINDS] = {0};
  count[s->place_kind] = s->n_places > 0 ? s->n_places : 1;
  for (int k = 0; k < nm; k++)
    if ((unsigned)ms[k].kind < PE_PLACE_KINDS && ms[k].n_places > count[ms[k].kind])
      count[ms[k].kind] = ms[k].n_places;
  int n = 0;
  for (int kind = 0; kind < PE_PLACE_KINDS; kind++) n += count[kind];
  r->places = pe_arena_alloc(a, sizeof *r->places * (size_t)n);
  if (!r->places) return pe_error(PE_ENOMEM, "status: out of memory");
  for (int kind = 0; kind < PE_PLACE_KINDS; kind++)
    for (int i = 0; i < count[kind]; i++) {
      Pe__PlaceStatus *p = pe_arena_alloc(a, sizeof *p);
      char name[32];
      pe_place_str((pe_place){(pe_place_kind)kind, i}, name, sizeof name);
      if (!p) return pe_error(PE_ENOMEM, "status: out of memory");
      pe__place_status__init(p);
      p->place = pe_arena_strdup(a, name);
      for (int k = 0; k < nm; k++)
        if (ms[k].kind == (pe_place_kind)kind && ms[k].n_places > i)
          p->bytes_in_use += ms[k].param_bytes;
      r->places[r->n_places++] = p;
    }
  return NULL;
}

/* Phases: the header and lanes, memory, counters, runs, pool and cache,
 * models, places. */
pe_status *pe_status_fill(pe_server *s, pe_lane self, uint64_t asker, Pe__StatusReply *r,
                          pe_arena *a) {
  r->version = pe_arena_strdup(a, PE_SERVER_VERSION);
  r->uptime_s = pe_now_s() - s->start_time;
  /* Requests waiting or being handled, but for this Status (so that an
   * idle daemon says queue depth 0); self PE_LANES: no request's. */
  int depth = pe_server_pending(s) - (self < PE_LANES);
  r->queue_depth = depth > 0 ? depth : 0;
  PE_TRY(fill_lanes(s, self, r, a));
  fill_memory(s, r);
  fill_cuda_graph(s, r);
  r->requests_total = atomic_load(&s->requests_total);
  r->requests_failed = atomic_load(&s->requests_failed);
  r->runs_total = atomic_load(&s->runs_total);
  PE_TRY(fill_runs(s, asker, r, a));
  fill_pool_and_cache(s, r);
  pe_model_snapshot *ms = NULL;
  int nm = 0;
  PE_TRY(fill_models(s, r, a, &ms, &nm));
  return fill_places(s, r, a, ms, nm);
}
