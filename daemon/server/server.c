/* The server object (see server.h): its limits, places, construction and
 * free; its event loop is server/loop.h's files. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/log.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "server/checkpoint/stale.h"
#include "server/loop.h"
#include "server/registry/registry.h"
#include "server/shm.h"
#include "server/state_lock.h"

int pe_server_pending(pe_server *s) {
  int n = 0;
  for (int l = 0; l < PE_LANES; l++)
    n += atomic_load(&s->lanes[l].queued) + atomic_load(&s->lanes[l].busy);
  return n;
}

pe_limits pe_server_limits(pe_server *s) {
  pthread_mutex_lock(&s->cfg_mu);
  pe_limits l = {s->cfg.max_message,
                 s->cfg.max_programs,
                 s->cfg.memory_per_client,
                 s->cfg.session_ttl_s,
                 (uint32_t)s->cfg.max_steps_per_request,
                 s->cfg.max_program_ops,
                 s->cfg.max_program_vars,
                 s->cfg.memory_per_run,
                 s->cfg.memory_runs_total,
                 s->cfg.memory_kept_per_program,
                 s->cfg.memory_total,
                 s->cfg.check_finite,
                 s->cfg.memory_per_request,
                 s->cfg.memory_requests_total};
  pthread_mutex_unlock(&s->cfg_mu);
  /* 0: twice the largest message (its bytes fields are copied) and room
   * for the structures of a message of ordinary entries. */
  if (l.memory_per_request <= 0) l.memory_per_request = 2 * l.max_message + (16 << 20);
  if (l.memory_requests_total > 0 && l.memory_requests_total < l.memory_per_request)
    l.memory_requests_total = l.memory_per_request;
  return l;
}

pe_status *pe_server_resolve_places(const char *spec, pe_place_kind *kind, int *n) {
  if (strcmp(spec, "auto")) return pe_places_parse(spec, kind, n);
#ifdef PE_HAVE_CUDA
  int gpus = 0;
  for (int i = 0; i < PE_MAX_PLACES; i++) {
    char dev[32];
    snprintf(dev, sizeof dev, "/dev/nvidia%d", i);
    if (access(dev, F_OK) == 0) gpus++;
  }
  if (gpus > 0) { /* every GPU; a driver that does not work: open_default_places */
    *kind = PE_PLACE_CUDA;
    *n = gpus;
    return NULL;
  }
#endif
  *kind = PE_PLACE_CPU;
  *n = 1;
  return NULL;
}

/* The runtime (its pool sized for the daemon's places) and the default
 * places' devices, opened now so that a configured device that does not
 * work (no GPU, a broken driver) stops start-up with the reason instead of
 * failing every Register. */
static pe_status *start_runtime(pe_server *s) {
  int workers = s->cfg.worker_threads > 0 ? s->cfg.worker_threads
                                          : pe_runtime_default_workers(s->place_kind, s->n_places);
  pe_runtime_opts ro = {.threads = workers, .keep_denormals = !s->cfg.flush_denormals};
  int conv_mode = PE_CONV_ALGO_DEFAULT; /* the key's check accepted the value */
  pe_conv_algo_parse(s->cfg.conv_algo, &conv_mode);
  pe_conv_algo_set_mode(conv_mode);
  int layout_mode = PE_CONV_LAYOUT_BLOCKED;
  pe_conv_layout_parse(s->cfg.conv_layout, &layout_mode);
  pe_conv_layout_set_mode(layout_mode);
  PE_TRY(pe_status_wrap(pe_runtime_new(&ro, &s->rt), "runtime"));
  pe_status *st = NULL;
  /* places = auto on cpu: each model's places are its own (a trial's,
   * registry/register.c), and a cpu place opens on first use with the
   * threads of the first model on it (cores / its places), as in a daemon
   * started with that model's places; a cpu device has nothing to check. */
  if (!strcmp(s->cfg.places, "auto") && s->place_kind == PE_PLACE_CPU) return NULL;
  for (int p = 0; p < s->n_places && !st; p++) {
    pe_device *d;
    st = pe_runtime_device(s->rt, (pe_place){s->place_kind, p}, s->n_places, &d);
  }
  return pe_status_wrap(st, "config [runtime] places '%s'", s->cfg.places);
}

/* start_runtime, where `auto` that chose GPUs falls back to cpu:1 with a
 * warning (the daemon is still useful without them). The fallback starts a
 * new runtime: the first one's pool was sized for GPUs (the cores), which
 * would leave cpu:1 one-thread kernels on every worker. */
static pe_status *start_runtime_or_cpu(pe_server *s) {
  pe_status *st = start_runtime(s);
  if (!st || strcmp(s->cfg.places, "auto") || s->place_kind == PE_PLACE_CPU) return st;
  PE_LOGW("places auto: %s; using cpu:1", pe_status_msg(st));
  pe_status_free(st);
  pe_runtime_free(s->rt); /* closes the GPUs that did open */
  s->rt = NULL;
  s->place_kind = PE_PLACE_CPU;
  s->n_places = 1;
  return start_runtime(s);
}

pe_status *pe_server_new(pe_srv_config *cfg, const char *config_path, const pe_config_override *ov,
                         int n_ov, pe_server **out) {
  pe_server *s = calloc(1, sizeof *s);
  if (!s) return pe_error(PE_ENOMEM, "server: out of memory");
  s->cfg = *cfg;
  memset(cfg, 0, sizeof *cfg);
  pthread_mutex_init(&s->cfg_mu, NULL);
  pthread_mutex_init(&s->trial_mu, NULL);
  pe_run_table_init(&s->runs);
  pe_run_budget_init(&s->run_budget);
  s->start_time = pe_now_s();
  s->state_lock = -1;
  pe_status *st = NULL;
  if (config_path && !(s->config_path = strdup(config_path)))
    st = pe_error(PE_ENOMEM, "server: out of memory");
  if (!st && n_ov > 0) {
    s->overrides = malloc((size_t)n_ov * sizeof *ov);
    if (s->overrides) {
      memcpy(s->overrides, ov, (size_t)n_ov * sizeof *ov);
      s->n_overrides = n_ov;
    } else {
      st = pe_error(PE_ENOMEM, "server: out of memory");
    }
  }
  /* The state dir's lock first: a second daemon on it stops here, before
   * it opens devices or reads a checkpoint (state_lock.h). */
  if (!st) st = pe_mkdir_p(s->cfg.state_dir, 0750);
  if (!st) st = pe_state_lock(s->cfg.state_dir, &s->state_lock);
  /* The only writer now: temporaries left by a crash are stale. */
  if (!st) pe_ckpt_remove_stale(s->cfg.state_dir);
  if (!st)
    st = pe_status_wrap(pe_server_resolve_places(s->cfg.places, &s->place_kind, &s->n_places),
                        "config [runtime] places");
  if (!st)
    st = pe_status_wrap(pe_model_check_places(s->place_kind, s->n_places),
                        "config [runtime] places '%s'", s->cfg.places);
  if (!st && !pe_sync_strategy_parse(s->cfg.sync, &s->sync))
    st = pe_error(PE_EINVAL, "config [runtime] sync '%s' unknown", s->cfg.sync);
  if (!st) st = start_runtime_or_cpu(s);
  if (!st) st = pe_registry_new(s, &s->reg);
  if (!st) st = pe_shm_table_new(&s->shm);
  if (!st && !(s->dedup = pe_reply_cache_new((size_t)s->cfg.dedup_entries,
                                             (size_t)s->cfg.dedup_bytes, send_to_job, s)))
    st = pe_error(PE_ENOMEM, "server: out of memory for the reply cache");
  if (st) {
    pe_server_free(s);
    return st;
  }
  pe_log_set_level(s->cfg.log_level);
  *out = s;
  return NULL;
}

void pe_server_free(pe_server *s) {
  if (!s) return;
  pe_registry_free(s->reg);
  pe_shm_table_free(s->shm);
  pe_reply_cache_free(s->dedup);
  pe_runtime_free(s->rt);
  pe_config_free(&s->cfg);
  free(s->config_path);
  free(s->overrides);
  pe_state_unlock(s->state_lock); /* last: the shutdown checkpoint is written */
  pthread_mutex_destroy(&s->cfg_mu);
  pthread_mutex_destroy(&s->trial_mu);
  pe_run_table_destroy(&s->runs);
  pe_run_budget_destroy(&s->run_budget);
  free(s);
}
