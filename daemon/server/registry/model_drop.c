/* Dropping a model (see registry/model_drop.h). */
#include "server/registry/model_drop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "server/checkpoint/save_load.h"
#include "server/client_tag.h"
#include "server/places_recall.h"
#include "server/registry/registry.h"

typedef struct drop_ctx {
  const char *state_dir, *ckpt, *model;
  char *removed; /* malloc'd path once removed */
} drop_ctx;

/* Remove the model's restart checkpoint and the places it was created on
 * (server/places_recall.h), durably; its directory goes too when nothing
 * else (named checkpoints) is left in it. */
static pe_status *remove_restart(drop_ctx *a) {
  char dir[4096], file[128];
  PE_TRY(pe_checkpoint_path(a->state_dir, a->model, a->ckpt, dir, sizeof dir, file, sizeof file));
  bool existed = false, had_places = false;
  pe_status *st = pe_remove_durable(dir, PE_PLACES_MODEL_FILE, &had_places);
  if (!st) st = pe_remove_durable(dir, file, &existed);
  if (existed) {
    size_t n = strlen(dir) + strlen(file) + 2;
    a->removed = malloc(n);
    if (a->removed) snprintf(a->removed, n, "%s/%s", dir, file);
  }
  if ((existed || had_places) && !st && rmdir(dir) != 0) PE_LOGD("drop: %s kept (not empty)", dir);
  return st;
}

/* No model of that name lives: its restart checkpoint may still be there
 * (registry lock held: no register creates the model meanwhile). */
static pe_status *drop_absent(void *arg) {
  drop_ctx *a = arg;
  PE_TRY(pe_status_wrap(remove_restart(a), "drop_model: model '%s'", a->model));
  if (!a->removed)
    return pe_error(PE_ENOTFOUND,
                    "drop_model: no model '%s' in the daemon and no restart checkpoint '%s' of it "
                    "under %s/models",
                    a->model, a->ckpt, a->state_dir);
  return NULL;
}

pe_status *pe_model_drop(pe_server *s, uint64_t client, const char *name, pe_drop_result *out) {
  memset(out, 0, sizeof *out);
  drop_ctx a = {s->cfg.state_dir, s->cfg.shutdown_checkpoint, name, NULL};
  pe_srv_model *m = NULL;
  pe_status *st = pe_registry_drop_begin(s->reg, client, name, drop_absent, &a, &m, &out->programs);
  if (!st && m) {
    /* After this no write of the model's checkpoints happens, and the one
     * in flight (if any) has renamed its file: the removal is the last word. */
    pthread_mutex_lock(&m->save_mu);
    m->saves_closed = true;
    st = remove_restart(&a);
    pthread_mutex_unlock(&m->save_mu);
    if (st)
      st = pe_status_wrap(
          st, "drop_model: model '%s' is dropped, but its restart checkpoint is not", name);
    pe_registry_drop_end(s->reg, m);
    out->freed = true;
  }
  out->removed = a.removed;
  if (!st)
    PE_LOGI(
        "drop_model: client %s dropped model '%s'%s (%d program(s) of its own); restart "
        "checkpoint %s",
        pe_client_tag(client).s, name, m ? "" : " (not loaded)", out->programs,
        a.removed ? a.removed : "none");
  return st;
}
