/* Periodic checkpoints of the persistent models (see checkpoint/autosave.h). */
#include "server/checkpoint/autosave.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/strmap.h"
#include "server/checkpoint/save_load.h"
#include "server/metrics/counters.h"
#include "server/registry/registry.h"

/* The longest single wait: the deadline is re-read after it, so a huge
 * interval never overflows a timespec. */
#define PE_AUTOSAVE_MAX_WAIT_S 3600.0

/* What the thread remembers of one model's last successful autosave. The
 * model pointer tells a model freed and created again under the same name
 * (its change count restarts) from the one that was saved. */
typedef struct saved_model {
  const pe_model *model;
  uint64_t changes; /* pe_model_changes read before that save */
} saved_model;

struct pe_autosave {
  pe_registry *reg;
  char *state_dir;
  char *name; /* the restart checkpoint's name */
  pthread_t thread;

  pthread_mutex_t mu; /* interval_s, last_s, stop */
  pthread_cond_t cv;  /* CLOCK_MONOTONIC */
  double interval_s;  /* <= 0: off */
  double last_s;      /* monotonic end of the last pass (or when counting began) */
  bool stop;

  /* Autosave thread only: model name -> saved_model (malloc'd). */
  pe_strmap saved;
};

static bool stopping(pe_autosave *a) {
  pthread_mutex_lock(&a->mu);
  bool stop = a->stop;
  pthread_mutex_unlock(&a->mu);
  return stop;
}

static void saved_free_all(pe_strmap *map) {
  for (size_t i = 0; i < map->cap; i++)
    if (map->slots[i].key) free(map->slots[i].value);
  pe_strmap_destroy(map);
}

/* The file a model's autosave writes, for messages. */
static void target_path(const pe_autosave *a, const char *model, char *buf, size_t len) {
  char dir[4096], file[128];
  pe_status *st =
      pe_checkpoint_path(a->state_dir, model, a->name, dir, sizeof dir, file, sizeof file);
  if (st)
    snprintf(buf, len, "%s (checkpoint '%s')", a->state_dir, a->name);
  else
    snprintf(buf, len, "%s/%s", dir, file);
  pe_status_free(st);
}

/* Save one model when it changed since its last autosave. Returns its
 * bookkeeping for the next pass: `prev` (unchanged, skipped or failed: the
 * next pass compares against the same count and retries), a new entry, or
 * NULL when there is nothing to remember. */
static saved_model *save_one(pe_autosave *a, const char *name, saved_model *prev) {
  pe_srv_model *m;
  pe_status *st = pe_registry_model_acquire(a->reg, name, &m);
  if (st) { /* gone since the list was taken */
    pe_status_free(st);
    return NULL;
  }
  saved_model *keep = prev;
  if (!pe_srv_model_has_values(m)) {
    PE_LOGD("autosave: model '%s' has no initialised parameter yet: not saved", name);
    pe_registry_model_release(a->reg, m);
    return keep;
  }
  /* Read before the save: a run pushed meanwhile makes the count differ
   * from the saved one, so at worst the next pass saves again. */
  uint64_t changes = pe_model_changes(m->m);
  if (prev && prev->model == m->m && prev->changes == changes) {
    pe_registry_model_release(a->reg, m);
    return keep;
  }
  char *path = NULL;
  uint64_t bytes = 0;
  double t0 = pe_now_s();
  st = pe_checkpoint_save_restart(a->state_dir, m, &path, &bytes);
  double ms = (pe_now_s() - t0) * 1e3;
  pe_metrics_count_autosave(m->srv ? &m->srv->metrics : NULL, !st);
  if (st) {
    char where[4400];
    target_path(a, name, where, sizeof where);
    PE_LOGE("autosave: model '%s' to %s failed (retried in one interval): %s", name, where,
            pe_status_msg(st));
    pe_status_free(st);
  } else {
    PE_LOGI("autosave: model '%s' saved to %s (%llu bytes, %.1f ms)", name, path,
            (unsigned long long)bytes, ms);
    saved_model *now = prev ? prev : malloc(sizeof *now);
    if (now) {
      now->model = m->m;
      now->changes = changes;
    }
    keep = now; /* out of memory: saved again next pass, harmless */
  }
  free(path);
  pe_registry_model_release(a->reg, m);
  return keep;
}

/* One pass over the persistent models. The bookkeeping is rebuilt from the
 * models listed now, so models that are gone are forgotten. */
static void run_pass(pe_autosave *a) {
  char **names;
  int n;
  pe_registry_persistent_models(a->reg, &names, &n);
  pe_strmap next;
  pe_strmap_init(&next);
  for (int i = 0; i < n; i++) {
    saved_model *prev = pe_strmap_get(&a->saved, names[i]);
    /* Stopping: the models not reached keep their entries unvisited. */
    saved_model *keep = stopping(a) ? prev : save_one(a, names[i], prev);
    if (keep && !pe_strmap_put(&next, names[i], keep)) {
      /* Out of memory: this model is saved again next pass. prev is freed
       * below with a->saved. */
      if (keep != prev) free(keep);
      keep = NULL;
    }
    if (keep && prev) pe_strmap_put(&a->saved, names[i], NULL); /* moved to next */
    free(names[i]);
  }
  free(names);
  saved_free_all(&a->saved); /* what is left: models gone */
  a->saved = next;
}

static struct timespec to_timespec(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

static void *autosave_main(void *arg) {
  pe_autosave *a = arg;
  pthread_mutex_lock(&a->mu);
  while (!a->stop) {
    if (a->interval_s <= 0) {
      pthread_cond_wait(&a->cv, &a->mu);
      continue;
    }
    double now = pe_now_s(), due = a->last_s + a->interval_s;
    if (now < due) {
      struct timespec ts = to_timespec(fmin(due, now + PE_AUTOSAVE_MAX_WAIT_S));
      pthread_cond_timedwait(&a->cv, &a->mu, &ts);
      continue; /* woken, timed out or spurious: look again */
    }
    pthread_mutex_unlock(&a->mu);
    run_pass(a);
    pthread_mutex_lock(&a->mu);
    a->last_s = pe_now_s();
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

static void autosave_free(pe_autosave *a) {
  saved_free_all(&a->saved);
  pthread_cond_destroy(&a->cv);
  pthread_mutex_destroy(&a->mu);
  free(a->state_dir);
  free(a->name);
  free(a);
}

pe_status *pe_autosave_start(pe_registry *reg, const char *state_dir, const char *name,
                             double interval_s, pe_autosave **out) {
  *out = NULL;
  pe_autosave *a = calloc(1, sizeof *a);
  if (!a) return pe_error(PE_ENOMEM, "autosave: out of memory");
  a->reg = reg;
  a->interval_s = interval_s;
  a->last_s = pe_now_s();
  pe_strmap_init(&a->saved);
  pthread_mutex_init(&a->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* pe_now_s's clock */
  pthread_cond_init(&a->cv, &ca);
  pthread_condattr_destroy(&ca);
  a->state_dir = strdup(state_dir);
  a->name = strdup(name);
  if (!a->state_dir || !a->name) {
    autosave_free(a);
    return pe_error(PE_ENOMEM, "autosave: out of memory");
  }
  int err = pthread_create(&a->thread, NULL, autosave_main, a);
  if (err) {
    autosave_free(a);
    return pe_error(PE_EINTERNAL, "autosave: cannot start its thread: %s", strerror(err));
  }
  if (interval_s > 0)
    PE_LOGI("autosave: persistent models every %.3g s to checkpoint '%s'", interval_s, name);
  *out = a;
  return NULL;
}

void pe_autosave_set_interval(pe_autosave *a, double interval_s) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  double old = a->interval_s;
  if (old <= 0 && interval_s > 0) a->last_s = pe_now_s();
  a->interval_s = interval_s;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
  if (old != interval_s) {
    if (interval_s > 0)
      PE_LOGI("autosave: persistent models every %.3g s (was %.3g s)", interval_s, old);
    else
      PE_LOGI("autosave: off (was every %.3g s)", old);
  }
}

void pe_autosave_stop(pe_autosave *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  a->stop = true;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
  pthread_join(a->thread, NULL);
  autosave_free(a);
}
