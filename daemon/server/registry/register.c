/* Registering a program (pe_registry_register): its handle, an existing
 * program of that handle, the model it binds to (created when absent) and
 * that model's claims on it; the compile is registry/compile.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "ops/device_ctx.h"
#include "server/checkpoint/save_load.h"
#include "server/places_recall.h"
#include "server/registry/internal.h"

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
  /* batch_hint is a hint for places = auto's trial, not part of what the
   * program is: the same program fed other batches is the same handle. */
  Pe__RegisterOptions hashed;
  if (rq->options) {
    hashed = *rq->options;
    hashed.batch_hint = 0;
  }
  size_t ol = rq->options ? pe__register_options__get_packed_size(&hashed) : 0;
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
  if (ol) pe__register_options__pack(&hashed, k + o);
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

/* An existing live program with this key: add the owner and acquire it
 * (lock held). *st set on a collision or a dying program. */
static pe_srv_program *existing_locked(pe_registry *r, uint64_t handle, const uint8_t *key,
                                       size_t key_len, uint64_t client, bool persistent,
                                       pe_status **st) {
  *st = NULL;
  int i = pe_reg_prog_index(r, handle);
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
  pe_srv_model *m = pe_reg_model_find(r, name);
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

/* A register's options, resolved (resolve_options). */
typedef struct reg_opts {
  pe_place_kind kind;
  int n_places;
  pe_sync_strategy sync;
  pe_cuda_graph_mode cuda_graph;
  uint64_t seed;
  bool persistent;
  pe_limits lim;
  /* places = auto's trial applies (choose_places); its outcome, for the
   * model (malloc'd, NULL: none), and the register as the choice compiles
   * it (rq with chosen_opts). */
  bool trial;
  bool use_chosen;   /* compile chosen_rq: a trial's choice, or the model's */
  bool model_choice; /* chosen is the model's own, from before a restart */
  pe_places_trial *chosen;
  Pe__RegisterOptions chosen_opts;
  Pe__RegisterRequest chosen_rq;
} reg_opts;

/* ro takes t (malloc'd) as the model's places and the request compiled. */
static void take_choice(reg_opts *ro, const Pe__RegisterRequest *rq, pe_places_trial *t) {
  ro->kind = PE_PLACE_CPU;
  ro->n_places = t->cand[t->chosen].n_places;
  pe_places_trial_options(t, rq->options, &ro->chosen_opts);
  ro->chosen_rq = *rq;
  ro->chosen_rq.options = &ro->chosen_opts;
  ro->chosen = t;
  ro->use_chosen = true;
}

/* A model with a restart checkpoint comes back on the choice it was
 * created on (server/places_recall.h), whichever of its programs registers
 * first; ro takes it as choose_places would. */
static pe_status *recall_model_choice(pe_server *s, const Pe__RegisterRequest *rq, reg_opts *ro) {
  char dir[4096], file[128], path[4300], machine[256];
  PE_TRY(pe_checkpoint_path(s->cfg.state_dir, rq->model, s->cfg.shutdown_checkpoint, dir,
                            sizeof dir, file, sizeof file));
  snprintf(path, sizeof path, "%s/%s", dir, file);
  struct stat sb;
  if (stat(path, &sb) != 0) return NULL;
  pe_places_trial *t = calloc(1, sizeof *t);
  if (!t) return pe_error(PE_ENOMEM, "register: out of memory");
  pe_places_machine(machine, sizeof machine);
  if (!pe_places_recall_model(s->cfg.state_dir, rq->model, machine, t)) {
    free(t);
    return NULL;
  }
  char name[64];
  PE_LOGI("register: model '%s': %s, as before its restart (%s/" PE_PLACES_MODEL_FILE ")",
          rq->model, pe_places_candidate_name(&t->cand[t->chosen], name, sizeof name), dir);
  take_choice(ro, rq, t);
  ro->model_choice = true;
  return NULL;
}

/* The request's model name and program checked, its options resolved:
 * places (the options', else an existing model's, else the daemon's),
 * sync, seed, persistence; the limits read once for the whole register. */
static pe_status *resolve_options(pe_registry *r, const Pe__RegisterRequest *rq, reg_opts *ro) {
  PE_TRY(pe_name_check("register: model name", rq->model));
  if (rq->program.len == 0) return pe_error(PE_EINVAL, "register: program is empty (0 bytes)");
  const Pe__RegisterOptions *o = rq->options;
  pe_server *s = r->s;
  ro->kind = s->place_kind;
  ro->n_places = s->n_places;
  if (o && o->places && o->places[0]) {
    PE_TRY(pe_status_wrap(pe_places_parse(o->places, &ro->kind, &ro->n_places),
                          "register: options.places"));
  } else {
    /* No places named: an existing model's (a model created meanwhile on
     * others refuses the register below, as for named places); for a new
     * model of a training program on an auto cpu daemon, the trial's. */
    pthread_mutex_lock(&r->mu);
    pe_srv_model *have = pe_reg_model_find(r, rq->model);
    if (have && !have->dropping) {
      ro->kind = have->kind;
      ro->n_places = have->n_places;
      /* Its places came from a trial: a strategy left to the daemon is the
       * trial's too (the model's optimizer state is laid out for it). */
      if (have->trial && (!o || o->strategy == PE__STRATEGY__AUTO)) {
        pe_places_trial_options(have->trial, o, &ro->chosen_opts);
        ro->chosen_rq = *rq;
        ro->chosen_rq.options = &ro->chosen_opts;
        ro->use_chosen = true;
      }
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->cfg_mu);
    bool auto_cpu =
        s->place_kind == PE_PLACE_CPU && !strcmp(s->cfg.places, "auto") && s->cfg.places_trial;
    pthread_mutex_unlock(&s->cfg_mu);
    if (!have && auto_cpu) PE_TRY(recall_model_choice(s, rq, ro));
    ro->trial = !have && auto_cpu && !ro->chosen && !(o && o->for_test);
  }
  ro->sync = s->sync;
  if (o && o->sync && o->sync[0] && !pe_sync_strategy_parse(o->sync, &ro->sync))
    return pe_error(PE_EINVAL, "register: options.sync '%.32s' unknown (event, producer)", o->sync);
  if (o && (o->batch_hint < 0 || o->batch_hint > PE_PLACES_TRIAL_MAX_BATCH))
    return pe_error(PE_EINVAL, "register: options.batch_hint %lld is out of range (0..%d)",
                    (long long)o->batch_hint, PE_PLACES_TRIAL_MAX_BATCH);
  ro->cuda_graph = PE_CUDA_GRAPH_AUTO;
  if (s->cfg.cuda_graph) pe_cuda_graph_mode_parse(s->cfg.cuda_graph, &ro->cuda_graph);
  if (o && o->cuda_graph && o->cuda_graph[0] &&
      !pe_cuda_graph_mode_parse(o->cuda_graph, &ro->cuda_graph))
    return pe_error(PE_EINVAL, "register: options.cuda_graph '%.32s' unknown (auto, on, off)",
                    o->cuda_graph);
  ro->seed = o && o->seed ? o->seed : 1;
  ro->persistent = o && o->persistent;
  ro->lim = pe_server_limits(s);
  return NULL;
}

/* 1b (registry unlocked; s->trial_mu held from the recall to the
 * remember, so trials run one at a time): places = auto's choice for a new
 * model: remembered in the state dir, else timed (server/places_trial.h)
 * and remembered; ro's places and the request compiled (ro->chosen_rq)
 * become the choice's. A trial that measures nothing leaves the daemon's
 * places, with a warning. */
static pe_status *choose_places(pe_server *s, const Pe__RegisterRequest *rq, reg_opts *ro) {
  pthread_mutex_lock(&s->cfg_mu);
  int64_t batch = s->cfg.places_trial_batch;
  int steps = s->cfg.places_trial_steps;
  double budget = s->cfg.places_trial_s;
  pthread_mutex_unlock(&s->cfg_mu);
  if (rq->options && rq->options->batch_hint > 0) batch = rq->options->batch_hint;
  pe_places_trial *t = calloc(1, sizeof *t);
  if (!t) return pe_error(PE_ENOMEM, "register: out of memory");
  char machine[256], file[64];
  pe_places_machine(machine, sizeof machine);
  pe_status *st = pe_places_key(rq, batch, machine, file, sizeof file);
  if (st) {
    free(t);
    return pe_status_wrap(st, "register");
  }
  pthread_mutex_lock(&s->trial_mu);
  if (!pe_places_recall(s->cfg.state_dir, file, machine, batch, t)) {
    const Pe__RegisterOptions *o = rq->options;
    bool choose = !o || o->strategy == PE__STRATEGY__AUTO;
    pe_graph_strategy fixed = o && o->strategy == PE__STRATEGY__REDUCE    ? PE_STRATEGY_REDUCE
                              : o && o->strategy == PE__STRATEGY__SHARDED ? PE_STRATEGY_SHARDED
                                                                          : PE_STRATEGY_ALLREDUCE;
    t->n_cand =
        pe_places_candidates(pe_cpu_cores(), choose, fixed, o && o->fuse_allreduce, t->cand);
    st = pe_places_trial_run(s, rq, &ro->lim, batch, steps, budget, t);
    if (st) {
      pthread_mutex_unlock(&s->trial_mu);
      PE_LOGW("register: model '%s': %s; using %s:%d", rq->model, pe_status_msg(st),
              pe_place_kind_name(ro->kind), ro->n_places);
      pe_status_free(st);
      free(t);
      return NULL;
    }
    st = pe_places_remember(s->cfg.state_dir, file, machine, t);
    if (st) PE_LOGW("register: places trial: not remembered: %s", pe_status_msg(st));
    pe_status_free(st);
  }
  pthread_mutex_unlock(&s->trial_mu);
  char name[64];
  PE_LOGI("register: model '%s': %s (%s, %.3f ms a step of %lld samples)", rq->model,
          pe_places_candidate_name(&t->cand[t->chosen], name, sizeof name),
          t->remembered ? "remembered" : "timed", t->cand[t->chosen].step_ms, (long long)batch);
  take_choice(ro, rq, t);
  return NULL;
}

/* The choice m (held: its trial lives) was created on, kept beside its
 * restart checkpoint, unless a drop has closed its saves (save_mu, as a
 * checkpoint write). A failure costs only the choice after a restart. */
static void keep_model_choice(pe_server *s, pe_srv_model *m) {
  char machine[256];
  pe_places_machine(machine, sizeof machine);
  pthread_mutex_lock(&m->save_mu);
  pe_status *st = m->saves_closed
                      ? NULL
                      : pe_places_remember_model(s->cfg.state_dir, m->name, machine, m->trial);
  pthread_mutex_unlock(&m->save_mu);
  if (st) PE_LOGW("register: model '%s': its places not kept: %s", m->name, pe_status_msg(st));
  pe_status_free(st);
}

/* 2 (unlocked): a new program (taking key) decoded and compiled into *g
 * and *sg; a bad program never creates a model. */
static pe_status *compile_program(pe_server *s, const Pe__RegisterRequest *rq, const reg_opts *ro,
                                  uint64_t handle, uint8_t *key, size_t key_len, pe_graph **g,
                                  pe_graph **sg, pe_srv_program **out) {
  pe_srv_program *p = calloc(1, sizeof *p);
  if (!p) {
    free(key);
    return pe_error(PE_ENOMEM, "register: out of memory");
  }
  p->handle = handle;
  p->sync = ro->sync;
  p->cuda_graph = ro->cuda_graph;
  p->for_test = rq->options && rq->options->for_test;
  p->key = key;
  p->key_len = key_len;
  pe_status *st = pe_reg_compile(s, rq, &ro->lim, ro->kind, ro->n_places, g, sg, p);
  if (st) {
    pe_graph_free(*g);
    pe_graph_free(*sg);
    pe_reg_program_destroy(p);
    return st;
  }
  *out = p;
  return NULL;
}

/* 3 (locked): limits, then the model to bind to (acquired into *m), its
 * claims checked; or the same program, published meanwhile (*winner). A
 * model that refuses p is released, and returned in *refused when it goes. */
static pe_status *bind_model_locked(pe_registry *r, uint64_t client, const Pe__RegisterRequest *rq,
                                    const reg_opts *ro, pe_srv_program *p, pe_srv_program **winner,
                                    pe_srv_model **m, pe_srv_model **refused) {
  pe_status *st = NULL;
  const pe_limits *lim = &ro->lim;
  *winner = existing_locked(r, p->handle, p->key, p->key_len, client, ro->persistent, &st);
  if (st || *winner) return st;
  if (r->n_progs >= lim->max_programs)
    return pe_error(PE_EEXHAUSTED,
                    "register: %d programs registered (all clients), limit max_programs = %d: "
                    "retry later, or ask the admin to raise [limits] max_programs",
                    r->n_progs, lim->max_programs);
  if (lim->memory_per_client > 0)
    PE_TRY(pe_reg_check_memory_locked(r, client, rq->model, pe_reg_model_find(r, rq->model), p,
                                      lim->memory_per_client));
  PE_TRY(model_get_locked(r, rq->model, ro->kind, ro->n_places, ro->seed, m));
  /* Shapes first: a program that does not fit claims no strategy; the
   * memory last: a program refused charges nothing. */
  if ((st = claim_decls_locked(*m, p, false)) || (st = claim_train_strategy_locked(*m, p)) ||
      (st = pe_status_wrap(pe_reg_charge_model(*m, p->params, p->n_params, lim->memory_total),
                           "register"))) {
    (*m)->refs--;
    *refused = pe_reg_model_maybe_unlink(r, *m);
  }
  return st;
}

/* 4 (unlocked): a model without values starts from its restart
 * checkpoint, before the graphs bind to it: a checkpoint that does not
 * fit p refuses p, and nothing of it is set (the file stays). Then the
 * graphs bind to the model (the executors own them, also on failure) and
 * client owns p. Every program restores, persistent or not: a model's
 * first register restores its restart checkpoint, so no values that did
 * not come from the file can later be made persistent and replace it
 * (checkpoint/save_load.h). */
static pe_status *restore_and_bind(pe_server *s, pe_srv_model *m, pe_srv_program *p, pe_graph *g,
                                   pe_graph *sg, uint64_t client) {
  p->model = m;
  pe_status *st = pe_checkpoint_restore(s->cfg.state_dir, s->cfg.shutdown_checkpoint, m, p->params,
                                        p->n_params);
  if (st)
    pe_graph_free(g);
  else
    st =
        pe_status_wrap(pe_par_exec_new(m->m, g, &p->exec), "register: bind to model '%s'", m->name);
  /* Captured steps for cuda places per the program's mode (off elsewhere). */
  if (!st) st = pe_par_exec_set_cuda_graph(p->exec, p->cuda_graph);
  if (!st && sg) {
    st = pe_status_wrap(pe_par_exec_new(m->m, sg, &p->startup),
                        "register: bind startup to model '%s'", m->name);
    sg = NULL;
  }
  pe_graph_free(sg); /* g is the executor's now, also on failure */
  if (!st) st = add_owner(p, client);
  return st;
}

/* 5 (locked): publish p (st: phase 4's outcome), unless the same program
 * was published meanwhile (*winner), the model is being dropped, or a
 * program or value of other shapes came first (checked again, and
 * claimed, under the lock). Releases m; an unpublished p gives its charge
 * back, and m is returned in *fm when it goes. */
static pe_status *publish_locked(pe_registry *r, uint64_t client, const reg_opts *ro,
                                 pe_srv_model *m, pe_srv_program *p, pe_status *st,
                                 pe_srv_program **winner, pe_srv_model **fm) {
  const pe_limits *lim = &ro->lim;
  m->refs--;
  if (!st) *winner = existing_locked(r, p->handle, p->key, p->key_len, client, ro->persistent, &st);
  bool fresh = !st && !*winner;
  if (fresh && m->dropping)
    st = pe_error(PE_EINVAL, "register: model '%s' was dropped meanwhile; register again", m->name);
  /* Again: another register of the client may have been published since
   * step 3, and a restored checkpoint may hold more than p declares. */
  if (fresh && !st && lim->memory_per_client > 0)
    st = pe_reg_check_memory_locked(r, client, m->name, m, p, lim->memory_per_client);
  if (fresh && !st)
    st = pe_status_wrap(pe_reg_charge_model(m, p->params, p->n_params, lim->memory_total),
                        "register");
  if (fresh && !st) st = claim_decls_locked(m, p, true);
  if (fresh && !st) {
    if (!pe_reg_grow((void **)&r->progs, &r->cap_progs, r->n_progs + 1, sizeof *r->progs)) {
      st = pe_error(PE_ENOMEM, "register: out of memory");
    } else {
      r->progs[r->n_progs++] = p;
      m->n_programs++;
      p->refs = 1;
      if (ro->persistent) m->persistent = true;
    }
  }
  if (st || *winner) {
    pe_reg_charge_to_claims(m);
    *fm = pe_reg_model_maybe_unlink(r, m);
  }
  return st;
}

/* Phases: the options, the handle, an existing program (1), the compile
 * (2), the model (3), the restore and bind (4), the publish (5); the
 * registry lock is held in 1, 3 and 5 only. */
pe_status *pe_registry_register(pe_registry *r, uint64_t client, const Pe__RegisterRequest *rq,
                                pe_srv_program **out, bool *existed) {
  *out = NULL;
  *existed = false;
  reg_opts ro = {0};
  uint8_t *key = NULL;
  size_t key_len = 0;
  pe_status *st = resolve_options(r, rq, &ro);
  if (!st) st = make_key(rq, &key, &key_len);
  if (st) {
    free(ro.chosen);
    return st;
  }
  uint64_t handle = fnv1a(key, key_len);

  /* 1 (locked): the same program again is the common case; answer it now. */
  pthread_mutex_lock(&r->mu);
  pe_srv_program *p = existing_locked(r, handle, key, key_len, client, ro.persistent, &st);
  pthread_mutex_unlock(&r->mu);
  if (p || st) {
    free(ro.chosen);
    free(key);
    *out = p;
    *existed = p != NULL;
    return st;
  }

  if (ro.trial && (st = choose_places(r->s, rq, &ro))) {
    free(key);
    return st;
  }
  pe_graph *g = NULL, *sg = NULL;
  st = compile_program(r->s, ro.use_chosen ? &ro.chosen_rq : rq, &ro, handle, key, key_len, &g, &sg,
                       &p);
  if (st) {
    free(ro.chosen);
    return st;
  }

  pe_srv_model *m = NULL, *refused = NULL;
  pe_srv_program *winner = NULL;
  pthread_mutex_lock(&r->mu);
  st = bind_model_locked(r, client, rq, &ro, p, &winner, &m, &refused);
  /* The model's record of the choice: the first one made for it (a
   * register that found the model created meanwhile binds to its places). */
  if (!st && !winner && ro.chosen && !m->trial && m->n_places == ro.n_places) {
    m->trial = ro.chosen;
    m->trial_kept = ro.model_choice;
    ro.chosen = NULL;
  }
  /* A persistent model's choice is kept for its restart. */
  bool keep = !st && !winner && ro.persistent && m->trial && !m->trial_kept;
  if (keep) m->trial_kept = true;
  pthread_mutex_unlock(&r->mu);
  if (keep) keep_model_choice(r->s, m);
  free(ro.chosen);
  if (st || winner) {
    pe_graph_free(g);
    pe_graph_free(sg);
    pe_reg_program_destroy(p);
    pe_reg_destroy_later(NULL, refused);
    *out = winner;
    *existed = winner != NULL;
    return st;
  }

  st = restore_and_bind(r->s, m, p, g, sg, client);

  pe_srv_model *fm = NULL;
  pthread_mutex_lock(&r->mu);
  st = publish_locked(r, client, &ro, m, p, st, &winner, &fm);
  pthread_mutex_unlock(&r->mu);
  bool published = !st && !winner;
  if (!published) pe_reg_program_destroy(p);
  pe_reg_destroy_later(NULL, fm);
  if (st) return st;
  *out = published ? p : winner;
  *existed = !published;
  return NULL;
}
