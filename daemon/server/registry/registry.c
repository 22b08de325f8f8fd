/* Models and programs (see registry/registry.h); sessions are in registry/sessions.c, the
 * compile of a registered program in registry/compile.c. */
#include "server/registry/registry.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "server/checkpoint/save_load.h"
#include "server/client_tag.h"
#include "server/heap_trim.h"
#include "server/registry/internal.h"

bool pe_reg_grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int c = *cap ? *cap * 2 : 8;
  while (c < need) c *= 2;
  void *p = realloc(*arr, (size_t)c * elem);
  if (!p) return false;
  *arr = p;
  *cap = c;
  return true;
}

pe_status *pe_registry_new(pe_server *s, pe_registry **out) {
  pe_registry *r = calloc(1, sizeof *r);
  if (!r) return pe_error(PE_ENOMEM, "registry: out of memory");
  r->s = s;
  pthread_mutex_init(&r->mu, NULL);
  *out = r;
  return NULL;
}

static void var_infos_free(pe_var_info *v, int n) {
  if (!v) return;
  for (int i = 0; i < n; i++) free(v[i].name);
  free(v);
}

/* Frees executors; must not hold the registry lock (waits for the engine). */
static void program_destroy(pe_srv_program *p) {
  size_t program_bytes = p->key_len; /* the program's bytes, its model's name, its options */
  if (p->model) pe_run_budget_set(&p->model->srv->run_budget, &p->kept_bytes, 0);
  pe_par_exec_free(p->exec);
  pe_par_exec_free(p->startup);
  var_infos_free(p->params, p->n_params);
  var_infos_free(p->feeds, p->n_feeds);
  free(p->key);
  free(p->owners);
  free(p);
  pe_heap_trim_after_program(program_bytes);
}

static void model_destroy(pe_srv_model *m) {
  pe_run_budget_set(&m->srv->run_budget, &m->charged_bytes, 0);
  pe_model_free(m->m);
  pe_shape_claims_destroy(&m->shapes);
  pthread_mutex_destroy(&m->save_mu);
  pthread_mutex_destroy(&m->ckpt_mu);
  pthread_mutex_destroy(&m->init_mu);
  pe_strmap_destroy(&m->initialized);
  free(m);
}

void pe_registry_free(pe_registry *r) {
  if (!r) return;
  for (int i = 0; i < r->n_progs; i++) program_destroy(r->progs[i]);
  for (int i = 0; i < r->n_models; i++) model_destroy(r->models[i]);
  free(r->progs);
  free(r->models);
  free(r->sessions);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

/* --- lookups (lock held) -------------------------------------------------- */
static int prog_index(pe_registry *r, uint64_t handle) {
  for (int i = 0; i < r->n_progs; i++)
    if (r->progs[i]->handle == handle) return i;
  return -1;
}

static pe_srv_model *model_find(pe_registry *r, const char *name) {
  for (int i = 0; i < r->n_models; i++)
    if (!strcmp(r->models[i]->name, name)) return r->models[i];
  return NULL;
}

/* A model without programs, users or persistence goes; returns it to free
 * outside the lock, or NULL. A dropped model has left the table already. */
static pe_srv_model *model_maybe_unlink(pe_registry *r, pe_srv_model *m) {
  if (m->n_programs > 0 || m->refs > 0 || m->persistent) return NULL;
  if (m->unlinked) return m;
  for (int i = 0; i < r->n_models; i++)
    if (r->models[i] == m) {
      r->models[i] = r->models[--r->n_models];
      return m;
    }
  return NULL;
}

/* Unlink a dead program without users; returns what to free (program, and
 * maybe its model) outside the lock. */
void pe_reg_prog_maybe_unlink(pe_registry *r, pe_srv_program *p, pe_srv_program **free_p,
                              pe_srv_model **free_m) {
  *free_p = NULL;
  *free_m = NULL;
  if (!p->dead || p->refs > 0) return;
  int i = prog_index(r, p->handle);
  if (i >= 0 && r->progs[i] == p) r->progs[i] = r->progs[--r->n_progs];
  p->model->n_programs--;
  *free_p = p;
  *free_m = model_maybe_unlink(r, p->model);
}

void pe_reg_destroy_later(pe_srv_program *p, pe_srv_model *m) {
  if (p) {
    PE_LOGI("program 0x%016llx freed", (unsigned long long)p->handle);
    program_destroy(p);
  }
  if (m) {
    PE_LOGI("model '%s' freed (no programs left, not persistent)", m->name);
    model_destroy(m);
  }
}

/* --- handles (the compile is registry/compile.c) ---------------------------- */
static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h ? h : 1;
}

static pe_status *make_key(const Pe__RegisterRequest *rq, uint8_t **key, size_t *len) {
  size_t ol = rq->options ? pe__register_options__get_packed_size(rq->options) : 0;
  size_t ml = strlen(rq->model);
  size_t n = rq->program.len + 1 + ml + 1 + ol;
  uint8_t *k = malloc(n);
  if (!k) return pe_error(PE_ENOMEM, "register: out of memory hashing %zu bytes", n);
  size_t o = 0;
  if (rq->program.len) memcpy(k, rq->program.data, rq->program.len);
  o += rq->program.len;
  k[o++] = 0;
  memcpy(k + o, rq->model, ml);
  o += ml;
  k[o++] = 0;
  if (ol) pe__register_options__pack(rq->options, k + o);
  *key = k;
  *len = n;
  return NULL;
}

static pe_status *add_owner(pe_srv_program *p, uint64_t client) {
  for (int i = 0; i < p->n_owners; i++)
    if (p->owners[i] == client) return NULL;
  if (!pe_reg_grow((void **)&p->owners, &p->cap_owners, p->n_owners + 1, sizeof *p->owners))
    return pe_error(PE_ENOMEM, "register: out of memory");
  p->owners[p->n_owners++] = client;
  return NULL;
}

/* Whether client owns a live program of m (lock held). */
static bool client_uses_locked(pe_registry *r, const pe_srv_model *m, uint64_t client) {
  for (int j = 0; j < r->n_progs; j++)
    if (r->progs[j]->model == m && !r->progs[j]->dead)
      for (int k = 0; k < r->progs[j]->n_owners; k++)
        if (r->progs[j]->owners[k] == client) return true;
  return false;
}

/* Parameter bytes of m, with the persistables of items (n; may be 0)
 * that it has not claimed yet: what its claims describe (registry/model_shapes.h),
 * so a registered program's persistables count before its Init. Every
 * value has its claim's shape, so values count too, without reading them
 * (an engine read would wait for the model's runs under the registry
 * lock); a claim with a -1 dim counts 0. */
static int64_t model_bytes_locked(pe_srv_model *m, const pe_var_info *items, int n) {
  return pe_shape_claims_bytes(&m->shapes, items, n, NULL);
}

/* Bytes of the models in which client owns a program (lock held). */
static int64_t client_bytes_locked(pe_registry *r, uint64_t client) {
  int64_t total = 0;
  for (int i = 0; i < r->n_models; i++)
    if (client_uses_locked(r, r->models[i], client))
      total = pe_bytes_add(total, model_bytes_locked(r->models[i], NULL, 0));
  return total;
}

/* memory_per_client (limit > 0): what the client holds once program p
 * binds to model m (NULL: a new model, holding p's persistables) must
 * stay within the limit. p's persistables the model has (an eval program
 * of a trained model) and a model the client holds already are not counted
 * twice; a program that adds nothing is never refused (lock held). */
static pe_status *check_memory_locked(pe_registry *r, uint64_t client, const char *model,
                                      pe_srv_model *m, const pe_srv_program *p, int64_t limit) {
  int64_t used = client_bytes_locked(r, client), prog = 0;
  for (int i = 0; i < p->n_params; i++) prog = pe_bytes_add(prog, pe_var_info_bytes(&p->params[i]));
  int64_t before = m && client_uses_locked(r, m, client) ? model_bytes_locked(m, NULL, 0) : 0;
  int64_t after = m ? model_bytes_locked(m, p->params, p->n_params) : prog;
  int64_t grows = after - before;
  if (grows <= 0 || grows <= limit - used) return NULL; /* limit - used: no overflow */
  return pe_error(PE_ENOMEM,
                  "register: model '%s': client %s holds %lld parameter bytes, and with this "
                  "program (persistables of %lld bytes) it would hold %lld, over the limit "
                  "memory_per_client = %lld",
                  model, pe_client_tag(client).s, (long long)used, (long long)prog,
                  (long long)pe_bytes_add(used, grows), (long long)limit);
}

int64_t pe_registry_client_bytes(pe_registry *r, uint64_t client) {
  pthread_mutex_lock(&r->mu);
  int64_t b = client_bytes_locked(r, client);
  pthread_mutex_unlock(&r->mu);
  return b;
}

/* An existing live program with this key: add the owner and acquire it
 * (lock held). *st set on a collision or a dying program. */
static pe_srv_program *existing_locked(pe_registry *r, uint64_t handle, const uint8_t *key,
                                       size_t key_len, uint64_t client, bool persistent,
                                       pe_status **st) {
  *st = NULL;
  int i = prog_index(r, handle);
  if (i < 0) return NULL;
  pe_srv_program *p = r->progs[i];
  if (p->dead) {
    *st = pe_error(PE_EINVAL, "register: program 0x%016llx is being deregistered; retry",
                   (unsigned long long)handle);
    return NULL;
  }
  if (p->key_len != key_len || memcmp(p->key, key, key_len)) {
    *st = pe_error(PE_EINTERNAL, "register: handle 0x%016llx collides with a different program",
                   (unsigned long long)handle);
    return NULL;
  }
  *st = add_owner(p, client);
  if (*st) return NULL;
  p->refs++;
  if (persistent) p->model->persistent = true;
  return p;
}

/* The model `name` on (kind, n), created when absent; refs++ (lock held). */
static pe_status *model_get_locked(pe_registry *r, const char *name, pe_place_kind kind,
                                   int n_places, uint64_t seed, pe_srv_model **out) {
  pe_srv_model *m = model_find(r, name);
  if (m && m->dropping)
    return pe_error(PE_EINVAL, "register: model '%s' is being dropped; retry", m->name);
  if (m) {
    if (m->kind != kind || m->n_places != n_places)
      return pe_error(PE_EINVAL, "register: model '%s' lives on %s:%d, the program asks for %s:%d",
                      m->name, pe_place_kind_name(m->kind), m->n_places, pe_place_kind_name(kind),
                      n_places);
    m->refs++;
    *out = m;
    return NULL;
  }
  if (!pe_reg_grow((void **)&r->models, &r->cap_models, r->n_models + 1, sizeof *r->models))
    return pe_error(PE_ENOMEM, "register: out of memory");
  m = calloc(1, sizeof *m);
  if (!m) return pe_error(PE_ENOMEM, "register: out of memory");
  snprintf(m->name, sizeof m->name, "%s", name);
  snprintf(m->restart_name, sizeof m->restart_name, "%s", r->s->cfg.shutdown_checkpoint);
  m->srv = r->s;
  m->kind = kind;
  m->n_places = n_places;
  m->seed = seed;
  pe_status *st = pe_runtime_serve_places(r->s->rt, kind, n_places);
  if (st) PE_LOGW("register: model '%s': %s", name, pe_status_msg(st)); /* runs all the same */
  pe_status_free(st);
  st = pe_model_new(r->s->rt, kind, n_places, seed, &m->m);
  if (st) {
    free(m);
    return pe_status_wrap(st, "register: model '%s'", name);
  }
  /* Recursive: a restore holds it across its load, which marks the names
   * it sets. */
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&m->init_mu, &attr);
  pthread_mutexattr_destroy(&attr);
  pthread_mutex_init(&m->ckpt_mu, NULL);
  pthread_mutex_init(&m->save_mu, NULL);
  pe_strmap_init(&m->initialized);
  pe_shape_claims_init(&m->shapes);
  r->models[r->n_models++] = m;
  m->refs = 1;
  PE_LOGI("model '%s' created on %s:%d seed %llu", m->name, pe_place_kind_name(kind), n_places,
          (unsigned long long)seed);
  *out = m;
  return NULL;
}

/* --- the daemon's memory budget ------------------------------------------- */
/* The resident bytes of persistables of `claims` bytes: a copy on every
 * place (the optimizer state of Reduce and Sharded lives on one: a bound). */
static int64_t on_places(int64_t claims, int n_places) {
  return n_places > 0 && claims > INT64_MAX / n_places ? INT64_MAX : claims * n_places;
}

/* "1.8 MiB", "100.0 GiB": a byte count for a reader, next to the exact one. */
static const char *mib_gib(int64_t bytes, char *buf, size_t len) {
  if (bytes >= (int64_t)1 << 30)
    snprintf(buf, len, "%.1f GiB", bytes / 1073741824.0);
  else
    snprintf(buf, len, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

/* Charge m's persistables, with those of items (n) not claimed yet, to the
 * daemon's memory budget ([limits] memory_total, run/budget.h) before any
 * of them is allocated. NULL when they fit (or nothing is new); else
 * PE_ENOMEM naming the model, the new bytes, the largest new variable with
 * its shape and bytes, the budget and what is left of it. */
static pe_status *charge_model(pe_srv_model *m, const pe_var_info *items, int n, int64_t total) {
  int64_t added, resident, reserved;
  int64_t want = on_places(pe_shape_claims_bytes(&m->shapes, items, n, &added), m->n_places);
  if (pe_run_budget_hold(&m->srv->run_budget, &m->charged_bytes, want, total, &resident, &reserved))
    return NULL;
  int n_new = 0, big = pe_shape_claims_largest_new(&m->shapes, items, n, &n_new);
  char largest[128 + PE_SHAPE_STRLEN + 96] = "";
  if (big >= 0) {
    char shape[PE_SHAPE_STRLEN];
    pe_shape_str(&items[big].shape, shape, sizeof shape);
    snprintf(largest, sizeof largest, "; the largest, '%.128s', is %s %s: %lld bytes",
             items[big].name, pe_dtype_name(items[big].dtype), shape,
             (long long)pe_var_info_bytes(&items[big]));
  }
  int64_t left = total - resident - reserved;
  char a[32], t[32];
  return pe_error(PE_ENOMEM,
                  "model '%s': %d new persistable(s) of %lld bytes (%s; on %s:%d, %lld) do not "
                  "fit the daemon's memory budget [limits] memory_total = %lld bytes (%s): %lld "
                  "are left (%lld resident: models' persistables and kept temporaries; %lld "
                  "reserved by runs in flight)%s",
                  m->name, n_new, (long long)added, mib_gib(added, a, sizeof a),
                  pe_place_kind_name(m->kind), m->n_places,
                  (long long)on_places(added, m->n_places), (long long)total,
                  mib_gib(total, t, sizeof t), (long long)(left > 0 ? left : 0),
                  (long long)resident, (long long)reserved, largest);
}

/* After a refused register or value set: m's charge back to what its
 * claims describe, giving back what was charged for names it did not
 * claim. A charge of another request for names it has not claimed yet is
 * given back too: that request's own charge of a later name charges it
 * again. */
static void charge_to_claims(pe_srv_model *m) {
  int64_t want = on_places(pe_shape_claims_bytes(&m->shapes, NULL, 0, NULL), m->n_places);
  pe_run_budget_set(&m->srv->run_budget, &m->charged_bytes, want);
}

/* p's persistables fit the model's (registry/model_shapes.h); with claim, p's
 * declarations become the model's claims (lock held). */
static pe_status *claim_decls_locked(pe_srv_model *m, const pe_srv_program *p, bool claim) {
  pe_status *st =
      pe_shape_claims_check(&m->shapes, m->name, p->params, p->n_params, PE_FIT_DECL, claim);
  if (!st || pe_status_code(st) == PE_ENOMEM) return pe_status_wrap(st, "register");
  pe_status *out = pe_error(pe_status_code(st),
                            "register: %s; register the program under another model name, or "
                            "drop the model first (pe-client drop-model --model %s)",
                            pe_status_msg(st), m->name);
  pe_status_free(st);
  return out;
}

/* One strategy trains a model on more than one place: the optimizer state
 * is laid out for it (AllReduce: on every place; Reduce: with each
 * parameter's owner; Sharded: on place 0 only), and a training program of
 * another strategy would read state that is missing there or stale. The
 * first training program sets it (lock held). */
static pe_status *claim_train_strategy_locked(pe_srv_model *m, const pe_srv_program *p) {
  if (p->for_test || m->n_places < 2) return NULL;
  if (!m->has_train_strategy) {
    m->has_train_strategy = true;
    m->train_strategy = p->strategy;
    return NULL;
  }
  if (m->train_strategy == p->strategy) return NULL;
  const char *have = pe_strategy_name(m->train_strategy), *want = pe_strategy_name(p->strategy);
  return pe_error(PE_EINVAL,
                  "register: model '%s' is trained with the %s strategy on %s:%d, and its "
                  "optimizer state is laid out for it; this training program asks for %s: "
                  "register it with strategy %s (or auto where that resolves to it), or under "
                  "another model name",
                  m->name, have, pe_place_kind_name(m->kind), m->n_places, want, have);
}

pe_status *pe_registry_register(pe_registry *r, uint64_t client, const Pe__RegisterRequest *rq,
                                pe_srv_program **out, bool *existed) {
  *out = NULL;
  *existed = false;
  PE_TRY(pe_name_check("register: model name", rq->model));
  if (rq->program.len == 0) return pe_error(PE_EINVAL, "register: program is empty (0 bytes)");
  const Pe__RegisterOptions *o = rq->options;
  pe_server *s = r->s;
  pe_place_kind kind = s->place_kind;
  int n_places = s->n_places;
  if (o && o->places && o->places[0]) {
    PE_TRY(
        pe_status_wrap(pe_places_parse(o->places, &kind, &n_places), "register: options.places"));
  } else {
    /* No places named: an existing model's (a model created meanwhile on
     * others refuses the register below, as for named places). */
    pthread_mutex_lock(&r->mu);
    pe_srv_model *have = model_find(r, rq->model);
    if (have && !have->dropping) {
      kind = have->kind;
      n_places = have->n_places;
    }
    pthread_mutex_unlock(&r->mu);
  }
  pe_sync_strategy sync = s->sync;
  if (o && o->sync && o->sync[0] && !pe_sync_strategy_parse(o->sync, &sync))
    return pe_error(PE_EINVAL, "register: options.sync '%.32s' unknown (event, producer)", o->sync);
  uint64_t seed = o && o->seed ? o->seed : 1;
  bool persistent = o && o->persistent;
  pe_limits lim = pe_server_limits(s);

  uint8_t *key = NULL;
  size_t key_len = 0;
  PE_TRY(make_key(rq, &key, &key_len));
  uint64_t handle = fnv1a(key, key_len);

  /* 1 (locked): the same program again is the common case; answer it now. */
  pe_status *st = NULL;
  pthread_mutex_lock(&r->mu);
  pe_srv_program *p = existing_locked(r, handle, key, key_len, client, persistent, &st);
  pthread_mutex_unlock(&r->mu);
  if (p || st) {
    free(key);
    *out = p;
    *existed = p != NULL;
    return st;
  }

  /* 2 (unlocked): decode and compile; a bad program never creates a model. */
  p = calloc(1, sizeof *p);
  if (!p) {
    free(key);
    return pe_error(PE_ENOMEM, "register: out of memory");
  }
  p->handle = handle;
  p->sync = sync;
  p->for_test = o && o->for_test;
  p->key = key;
  p->key_len = key_len;
  pe_graph *g = NULL, *sg = NULL;
  st = pe_reg_compile(s, rq, &lim, kind, n_places, &g, &sg, p);

  /* 3 (locked): limits, then the model to bind to. */
  pe_srv_model *m = NULL;
  pe_srv_program *winner = NULL;
  pthread_mutex_lock(&r->mu);
  if (!st) winner = existing_locked(r, handle, key, key_len, client, persistent, &st);
  if (!st && !winner && r->n_progs >= lim.max_programs)
    st = pe_error(PE_EEXHAUSTED,
                  "register: %d programs registered (all clients), limit max_programs = %d: "
                  "retry later, or ask the admin to raise [limits] max_programs",
                  r->n_progs, lim.max_programs);
  if (!st && !winner && lim.memory_per_client > 0)
    st = check_memory_locked(r, client, rq->model, model_find(r, rq->model), p,
                             lim.memory_per_client);
  if (!st && !winner) st = model_get_locked(r, rq->model, kind, n_places, seed, &m);
  pe_srv_model *refused = NULL;
  /* Shapes first: a program that does not fit claims no strategy; the
   * memory last: a program refused charges nothing. */
  if (!st && !winner &&
      ((st = claim_decls_locked(m, p, false)) || (st = claim_train_strategy_locked(m, p)) ||
       (st = pe_status_wrap(charge_model(m, p->params, p->n_params, lim.memory_total),
                            "register")))) {
    m->refs--;
    refused = model_maybe_unlink(r, m);
  }
  /* Every program, persistent or not: a model's first register restores
   * its restart checkpoint, so no values that did not come from the file
   * can later be made persistent and replace it (checkpoint/save_load.h). */
  bool restore = !st && !winner;
  pthread_mutex_unlock(&r->mu);
  if (st || winner) {
    pe_graph_free(g);
    pe_graph_free(sg);
    program_destroy(p);
    pe_reg_destroy_later(NULL, refused);
    *out = winner;
    *existed = winner != NULL;
    return st;
  }

  /* 4 (unlocked): a model without values starts from its restart
   * checkpoint, before the graphs bind to it: a checkpoint that does not
   * fit p refuses p, and nothing of it is set (the file stays). */
  p->model = m;
  if (restore)
    st = pe_checkpoint_restore(s->cfg.state_dir, s->cfg.shutdown_checkpoint, m, p->params,
                               p->n_params);
  /* Bind the graphs to the model. */
  if (st)
    pe_graph_free(g);
  else
    st =
        pe_status_wrap(pe_par_exec_new(m->m, g, &p->exec), "register: bind to model '%s'", m->name);
  if (!st && sg) {
    st = pe_status_wrap(pe_par_exec_new(m->m, sg, &p->startup),
                        "register: bind startup to model '%s'", m->name);
    sg = NULL;
  }
  pe_graph_free(sg); /* g is the executor's now, also on failure */
  if (!st) st = add_owner(p, client);

  /* 5 (locked): publish, unless the same program was published meanwhile,
   * the model is being dropped, or a program or value of other shapes came
   * first (checked again, and claimed, under the lock). */
  pe_srv_model *fm = NULL;
  pthread_mutex_lock(&r->mu);
  m->refs--;
  if (!st) winner = existing_locked(r, handle, key, key_len, client, persistent, &st);
  if (!st && !winner && m->dropping)
    st = pe_error(PE_EINVAL, "register: model '%s' was dropped meanwhile; register again", m->name);
  /* Again: another register of the client may have been published since
   * step 3, and a restored checkpoint may hold more than p declares. */
  if (!st && !winner && lim.memory_per_client > 0)
    st = check_memory_locked(r, client, m->name, m, p, lim.memory_per_client);
  if (!st && !winner)
    st = pe_status_wrap(charge_model(m, p->params, p->n_params, lim.memory_total), "register");
  if (!st && !winner) st = claim_decls_locked(m, p, true);
  if (!st && !winner) {
    if (!pe_reg_grow((void **)&r->progs, &r->cap_progs, r->n_progs + 1, sizeof *r->progs)) {
      st = pe_error(PE_ENOMEM, "register: out of memory");
    } else {
      r->progs[r->n_progs++] = p;
      m->n_programs++;
      p->refs = 1;
      if (persistent) m->persistent = true;
    }
  }
  bool published = !st && !winner;
  if (!published) {
    charge_to_claims(m);
    fm = model_maybe_unlink(r, m);
  }
  pthread_mutex_unlock(&r->mu);
  if (!published) program_destroy(p);
  pe_reg_destroy_later(NULL, fm);
  if (st) return st;
  *out = published ? p : winner;
  *existed = !published;
  return NULL;
}

pe_status *pe_registry_acquire(pe_registry *r, uint64_t handle, pe_srv_program **out) {
  pthread_mutex_lock(&r->mu);
  int i = prog_index(r, handle);
  pe_srv_program *p = i >= 0 && !r->progs[i]->dead ? r->progs[i] : NULL;
  if (p) p->refs++;
  pthread_mutex_unlock(&r->mu);
  *out = p;
  if (!p)
    return pe_error(
        PE_ENOTFOUND,
        "handle 0x%016llx: no such program (never registered, deregistered or its session expired)",
        (unsigned long long)handle);
  return NULL;
}

bool pe_registry_read_only(pe_registry *r, uint64_t handle) {
  pthread_mutex_lock(&r->mu);
  int i = prog_index(r, handle);
  bool ro = i >= 0 && !r->progs[i]->dead && r->progs[i]->read_only;
  pthread_mutex_unlock(&r->mu);
  return ro;
}

void pe_registry_release(pe_registry *r, pe_srv_program *p) {
  if (!p) return;
  pe_srv_program *fp;
  pe_srv_model *fm;
  pthread_mutex_lock(&r->mu);
  p->refs--;
  pe_reg_prog_maybe_unlink(r, p, &fp, &fm);
  pthread_mutex_unlock(&r->mu);
  pe_reg_destroy_later(fp, fm);
}

/* Remove client from p's owners; marks p dead when none are left (lock held). */
void pe_reg_drop_owner_locked(pe_srv_program *p, uint64_t client) {
  for (int i = 0; i < p->n_owners; i++)
    if (p->owners[i] == client) {
      p->owners[i] = p->owners[--p->n_owners];
      break;
    }
  if (p->n_owners == 0) p->dead = true;
}

/* The error for a client that is not among p's owners (lock held): names
 * the program, its model, how many clients own it and what dropping it
 * would do to them. */
static pe_status *not_owner_locked(pe_registry *r, const pe_srv_program *p) {
  double now = pe_now_s(), idle = -1;
  for (int i = 0; i < r->n_sessions; i++)
    for (int k = 0; k < p->n_owners; k++)
      if (r->sessions[i].client == p->owners[k] &&
          (idle < 0 || now - r->sessions[i].last_seen < idle))
        idle = now - r->sessions[i].last_seen;
  bool last_user = !p->model->persistent && p->model->n_programs == 1;
  return pe_error(
      PE_EPERM,
      "program 0x%016llx (model '%s') belongs to %d other client(s) (last request %.0f s "
      "ago); only they can deregister it, and it goes when their sessions end. "
      "Dropping it would fail their runs%s; to drop it anyway: pe-client deregister "
      "--force --handle 0x%016llx",
      (unsigned long long)p->handle, p->model->name, p->n_owners, idle < 0 ? 0 : idle,
      last_user ? " and free the model's values (not persistent)" : "",
      (unsigned long long)p->handle);
}

pe_status *pe_registry_deregister(pe_registry *r, uint64_t client, uint64_t handle, bool force) {
  pe_srv_program *p;
  PE_TRY(pe_status_wrap(pe_registry_acquire(r, handle, &p), "deregister"));
  pe_status *st = NULL;
  pthread_mutex_lock(&r->mu);
  bool owner = false;
  for (int i = 0; i < p->n_owners; i++) owner |= p->owners[i] == client;
  if (owner) {
    pe_reg_drop_owner_locked(p, client);
  } else if (force) {
    PE_LOGW("client %s force-deregistered program 0x%016llx (model '%s') of %d other client(s)",
            pe_client_tag(client).s, (unsigned long long)handle, p->model->name, p->n_owners);
    p->dead = true;
  } else {
    st = not_owner_locked(r, p);
  }
  pthread_mutex_unlock(&r->mu);
  pe_registry_release(r, p);
  return st ? pe_status_wrap(st, "deregister") : NULL;
}

pe_status *pe_registry_model_acquire(pe_registry *r, const char *name, pe_srv_model **out) {
  PE_TRY(pe_name_check("model name", name));
  pthread_mutex_lock(&r->mu);
  pe_srv_model *m = model_find(r, name);
  bool dropping = m && m->dropping;
  if (dropping) m = NULL;
  if (m) m->refs++;
  pthread_mutex_unlock(&r->mu);
  *out = m;
  if (!m)
    return pe_error(
        PE_ENOTFOUND, "model '%s': %s", name,
        dropping ? "being dropped" : "no such model (register a program under it first)");
  return NULL;
}

void pe_registry_model_release(pe_registry *r, pe_srv_model *m) {
  if (!m) return;
  pthread_mutex_lock(&r->mu);
  m->refs--;
  pe_srv_model *fm = model_maybe_unlink(r, m);
  pthread_mutex_unlock(&r->mu);
  pe_reg_destroy_later(NULL, fm);
}

/* --- drop --------------------------------------------------------------------- */
/* The live programs of m that a client other than `client` owns, as an
 * error naming them (lock held); NULL when there are none. */
static pe_status *other_users_locked(pe_registry *r, const pe_srv_model *m, uint64_t client,
                                     const char *op, const char *way_out) {
  enum { SHOWN = 4 };
  char list[SHOWN * 64] = "";
  size_t o = 0;
  int n = 0;
  for (int i = 0; i < r->n_progs; i++) {
    const pe_srv_program *p = r->progs[i];
    if (p->model != m || p->dead) continue;
    for (int k = 0; k < p->n_owners; k++) {
      if (p->owners[k] == client) continue;
      if (n++ < SHOWN && o < sizeof list)
        o += (size_t)snprintf(list + o, sizeof list - o, "%sprogram 0x%016llx of client %s",
                              o ? ", " : "", (unsigned long long)p->handle,
                              pe_client_tag(p->owners[k]).s);
    }
  }
  if (!n) return NULL;
  char more[32] = "";
  if (n > SHOWN) snprintf(more, sizeof more, " and %d more", n - SHOWN);
  return pe_error(PE_EPERM, "%s: model '%s' is in use by %s%s; %s", op, m->name, list, more,
                  way_out);
}

pe_status *pe_registry_model_in_use(pe_registry *r, const pe_srv_model *m, uint64_t client,
                                    const char *op, const char *way_out) {
  pthread_mutex_lock(&r->mu);
  pe_status *st = other_users_locked(r, m, client, op, way_out);
  pthread_mutex_unlock(&r->mu);
  return st;
}

pe_status *pe_registry_drop_begin(pe_registry *r, uint64_t client, const char *name,
                                  pe_status *(*absent)(void *arg), void *arg, pe_srv_model **out,
                                  int *programs) {
  *out = NULL;
  *programs = 0;
  PE_TRY(pe_name_check("drop_model: model name", name));
  pthread_mutex_lock(&r->mu);
  pe_srv_model *m = model_find(r, name);
  pe_srv_program **fps = NULL;
  pe_status *st = NULL;
  if (!m)
    st = absent(arg);
  else if (m->dropping)
    st = pe_error(PE_EINVAL, "drop_model: model '%s' is being dropped already", name);
  else
    st = other_users_locked(r, m, client, "drop_model",
                            "its clients must deregister those programs or close their sessions "
                            "first (or an operator drops them: pe-client deregister --force "
                            "--handle H)");
  if (!st && m && !(fps = calloc(r->n_progs ? (size_t)r->n_progs : 1, sizeof *fps)))
    st = pe_error(PE_ENOMEM, "drop_model: out of memory");
  int n_free = 0;
  if (!st && m) {
    m->dropping = true;
    m->persistent = false;
    m->refs++; /* so no program's unlink below frees it */
    /* The caller's programs of m (the only live ones left) go, as with a
     * deregister; downwards: an unlink moves the last program into slot i. */
    for (int i = r->n_progs - 1; i >= 0; i--) {
      pe_srv_program *p = r->progs[i];
      if (p->model != m || p->dead) continue;
      ++*programs;
      pe_reg_drop_owner_locked(p, client);
      pe_srv_model *fm;
      pe_reg_prog_maybe_unlink(r, p, &fps[n_free], &fm);
      if (fps[n_free]) n_free++;
    }
    *out = m;
  }
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; i < n_free; i++) pe_reg_destroy_later(fps[i], NULL);
  free(fps);
  return st;
}

void pe_registry_drop_end(pe_registry *r, pe_srv_model *m) {
  if (!m) return;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n_models; i++)
    if (r->models[i] == m) {
      r->models[i] = r->models[--r->n_models];
      break;
    }
  m->unlinked = true;
  m->refs--;
  pe_srv_model *fm = model_maybe_unlink(r, m);
  pthread_mutex_unlock(&r->mu);
  pe_reg_destroy_later(NULL, fm);
}

pe_status *pe_srv_model_claim_values(pe_srv_model *m, const char *const *names,
                                     const pe_tensor *values, int n) {
  pe_var_info *items = calloc(n ? (size_t)n : 1, sizeof *items);
  if (!items)
    return pe_error(PE_ENOMEM, "model '%s': out of memory checking %d values", m->name, n);
  for (int i = 0; i < n; i++)
    items[i] = (pe_var_info){(char *)names[i], values[i].dtype, values[i].shape};
  pe_status *st = charge_model(m, items, n, pe_server_limits(m->srv).memory_total);
  if (!st) {
    st = pe_shape_claims_check(&m->shapes, m->name, items, n, PE_FIT_VALUE, true);
    if (st) charge_to_claims(m);
  }
  free(items);
  return st;
}

bool pe_srv_model_has_values(pe_srv_model *m) {
  pthread_mutex_lock(&m->init_mu);
  bool any = m->initialized.len > 0;
  pthread_mutex_unlock(&m->init_mu);
  return any;
}

void pe_model_mark_initialized(pe_srv_model *m, const char *const *names, int n) {
  pthread_mutex_lock(&m->init_mu);
  for (int i = 0; i < n; i++)
    if (!pe_strmap_put(&m->initialized, names[i], (void *)1))
      PE_LOGW("model '%s': out of memory marking '%s' initialised", m->name, names[i]);
  pthread_mutex_unlock(&m->init_mu);
}

/* --- status ------------------------------------------------------------------ */
void pe_registry_snapshot(pe_registry *r, bool with_bytes, pe_model_snapshot **models,
                          int *n_models, int *n_programs, int *n_clients) {
  pthread_mutex_lock(&r->mu);
  *models = calloc(r->n_models ? (size_t)r->n_models : 1, sizeof **models);
  *n_models = *models ? r->n_models : 0;
  for (int i = 0; i < *n_models; i++) {
    pe_srv_model *m = r->models[i];
    pe_model_snapshot *x = &(*models)[i];
    snprintf(x->name, sizeof x->name, "%s", m->name);
    x->programs = m->n_programs;
    /* The claims' count, as memory_per_client's, not the values: reading
     * them is an engine op, which waits for the model's step in flight
     * (seconds when other runs keep the pool's worker busy) while holding
     * the registry lock, so every request would wait with the Status. */
    x->param_bytes = with_bytes ? model_bytes_locked(m, NULL, 0) : 0;
    x->persistent = m->persistent;
    x->kind = m->kind;
    x->n_places = m->n_places;
    pthread_mutex_lock(&m->ckpt_mu);
    x->ckpt = m->ckpt;
    pthread_mutex_unlock(&m->ckpt_mu);
    snprintf(x->restart_name, sizeof x->restart_name, "%s", m->restart_name);
    x->changes = pe_model_changes(m->m);
  }
  int live = 0;
  for (int i = 0; i < r->n_progs; i++) live += !r->progs[i]->dead;
  *n_programs = live;
  *n_clients = r->n_sessions;
  pthread_mutex_unlock(&r->mu);
}

void pe_registry_persistent_models(pe_registry *r, char ***names, int *n) {
  pthread_mutex_lock(&r->mu);
  *names = calloc(r->n_models ? (size_t)r->n_models : 1, sizeof **names);
  *n = 0;
  for (int i = 0; *names && i < r->n_models; i++)
    if (r->models[i]->persistent) {
      char *s = strdup(r->models[i]->name);
      if (s) (*names)[(*n)++] = s;
    }
  pthread_mutex_unlock(&r->mu);
}

void pe_srv_model_note_save(pe_srv_model *m, const char *name, uint64_t version,
                            const pe_status *st) {
  pthread_mutex_lock(&m->ckpt_mu);
  pe_ckpt_record *c = &m->ckpt;
  if (st) {
    c->failed++;
    snprintf(c->last_error, sizeof c->last_error, "%s", pe_status_msg(st));
  } else {
    c->saved++;
    snprintf(c->last, sizeof c->last, "%s", name);
    c->last_time = pe_now_s();
    c->last_version = version;
    if (!strcmp(name, m->restart_name)) {
      c->restart_known = true;
      c->restart_read = false;
      c->restart_time = c->last_time;
      c->restart_version = version;
    }
  }
  pthread_mutex_unlock(&m->ckpt_mu);
}

void pe_srv_model_note_restart_read(pe_srv_model *m, uint64_t version) {
  pthread_mutex_lock(&m->ckpt_mu);
  pe_ckpt_record *c = &m->ckpt;
  c->restart_known = true;
  c->restart_read = true;
  c->restart_time = pe_now_s();
  c->restart_version = version;
  pthread_mutex_unlock(&m->ckpt_mu);
}
