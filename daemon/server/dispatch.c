/* Request handlers, table-driven by body case (see dispatch.h). */
#include "server/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/names_unique.h"
#include "ops/lr_schedule.h"
#include "server/checkpoint/save_load.h"
#include "server/client_tag.h"
#include "server/job/join.h"
#include "server/registry/model_drop.h"
#include "server/registry/registry.h"
#include "server/run/request.h"
#include "server/shm.h"
#include "server/wire_tensor.h"

#define OOM PE_REPLY_OOM

/* --- handlers ------------------------------------------------------------------ */
typedef pe_request_ctx ctx;

static pe_status *h_ping(ctx *c) {
  return NULL;
}

static pe_status *h_status(ctx *c) {
  Pe__StatusReply *st = pe_arena_alloc(c->a, sizeof *st);
  if (!st) return OOM("status");
  pe__status_reply__init(st);
  PE_TRY(pe_status_fill(c->s, c->lane, c->rq->client_id, st, c->a));
  c->rep->body_case = PE__REPLY__BODY_STATUS;
  c->rep->status = st;
  return NULL;
}

static pe_status *h_register(ctx *c) {
  const Pe__RegisterRequest *rq = c->rq->register_;
  pe_srv_program *p;
  bool existed;
  PE_TRY(pe_registry_register(c->s->reg, c->rq->client_id, rq, &p, &existed));
  pe_status *st = pe_srv_job_join(c->s, p, rq);
  Pe__RegisterReply *r = st ? NULL : pe_arena_alloc(c->a, sizeof *r);
  if (!st && !r) st = OOM("register");
  if (!st) {
    pe__register_reply__init(r);
    r->handle = p->handle;
    r->existed = existed;
    r->strategy = p->strategy == PE_STRATEGY_REDUCE    ? PE__STRATEGY__REDUCE
                  : p->strategy == PE_STRATEGY_SHARDED ? PE__STRATEGY__SHARDED
                                                       : PE__STRATEGY__ALLREDUCE;
    char places[32];
    snprintf(places, sizeof places, "%s:%d", pe_place_kind_name(p->model->kind),
             p->model->n_places);
    r->places = pe_arena_strdup(c->a, places);
    /* Set before p was published, never changed (registry.h). */
    if (p->model->trial && !(r->places_trial = pe_places_trial_pb(p->model->trial, c->a)))
      st = OOM("register");
    r->params = pe_arena_alloc(c->a, sizeof *r->params * (size_t)(p->n_params ? p->n_params : 1));
    if (!r->params || !r->places) st = OOM("register");
  }
  for (int i = 0; !st && i < p->n_params; i++) {
    Pe__ParamInfo *pi = pe_arena_alloc(c->a, sizeof *pi);
    int64_t *dims = pe_arena_alloc(c->a, sizeof(int64_t) * PE_MAX_DIMS);
    char *nm = pe_arena_strdup(c->a, p->params[i].name);
    if (!pi || !dims || !nm) {
      st = OOM("register");
      break;
    }
    pe__param_info__init(pi);
    pi->name = nm;
    pi->dtype = (Pe__DataType)p->params[i].dtype;
    pi->n_shape = (size_t)p->params[i].shape.ndim;
    for (int d = 0; d < p->params[i].shape.ndim; d++) dims[d] = p->params[i].shape.d[d];
    pi->shape = dims;
    r->params[r->n_params++] = pi;
  }
  pe_run_origin o;
  if (!st && c->rq->client_id && pe_model_origin(p->model->m, c->rq->client_id, &o)) {
    r->applied_request = o.request;
    r->applied_steps = o.steps;
  }
  if (!st) r->has_values = pe_srv_model_has_values(p->model);
  if (!st) {
    c->rep->body_case = PE__REPLY__BODY_REGISTER;
    c->rep->register_ = r;
    PE_LOGI("register client=%s model=%s handle=0x%016llx %s (%d params, %d feeds)",
            pe_client_tag(c->rq->client_id).s, p->model->name, (unsigned long long)p->handle,
            existed ? "existing" : "new", p->n_params, p->n_feeds);
  }
  pe_registry_release(c->s->reg, p);
  return st;
}

/* The startup of p on a model that already has some of p's persistables
 * (another program of the model trained them; p adds an optimizer's state,
 * a schedule's counter): the nodes whose every output is a persistable the
 * model has (initialisers and their broadcasts) are skipped, so the values
 * stay and only the missing ones are initialised. learning_rate is set
 * anyway: it is the optimizer's setting, and p's is the one asked for. The
 * kept values are never read or written, so runs of other clients on them
 * (ordered by the engine like any run) lose nothing. */
static pe_status *startup_keeping(pe_srv_program *p, const pe_run_opts *ro) {
  pe_srv_model *m = p->model;
  const pe_graph *g = pe_par_exec_graph(p->startup);
  bool *skip = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *skip);
  if (!skip) return OOM("init");
  int kept = 0;
  pe_status *st = NULL;
  for (int i = 0; i < g->n_nodes && !st; i++) {
    const pe_graph_node *n = &g->nodes[i];
    int has = 0, a_kept = -1, lacks = -1;
    for (int k = 0; k < n->n_out_lv; k++) {
      const pe_graph_lvar *v = &g->lvars[n->out_lv[k]];
      bool keep = v->persistable && strcmp(v->name, PE_LR_NAME) != 0 &&
                  pe_strmap_has(&m->initialized, v->name);
      has += keep;
      if (keep && a_kept < 0) a_kept = k;
      if (!keep && lacks < 0) lacks = k;
    }
    if (has && lacks >= 0)
      st = pe_error(PE_EINVAL,
                    "init: startup node %s writes '%s', which model '%s' has, and '%s', which it "
                    "lacks: one cannot be initialised without the other (init with force "
                    "re-initialises every value)",
                    n->name, g->lvars[n->out_lv[a_kept]].name, m->name,
                    g->lvars[n->out_lv[lacks]].name);
    skip[i] = has > 0 && has == n->n_out_lv;
    kept += skip[i];
  }
  pe_run_opts o = *ro;
  o.skip = skip;
  if (!st) st = pe_par_exec_run(p->startup, NULL, 0, NULL, 0, NULL, &o, NULL);
  free(skip);
  if (!st && kept)
    PE_LOGI("init: model %s: %d of %d startup nodes skipped (values the model has)", m->name, kept,
            g->n_nodes);
  return st;
}

/* Is name one of p's persistables? */
static bool program_declares(const pe_srv_program *p, const char *name) {
  for (int i = 0; i < p->n_params; i++)
    if (!strcmp(p->params[i].name, name)) return true;
  return false;
}

/* The persistables of p an Init gives values: all with force, else those
 * model m lacks (InitReply.added; arena strings, NULL when out of memory). */
static char **init_added(ctx *c, const pe_srv_program *p, pe_srv_model *m, bool force, size_t *n) {
  char **names = pe_arena_alloc(c->a, (size_t)(p->n_params ? p->n_params : 1) * sizeof *names);
  *n = 0;
  for (int i = 0; names && i < p->n_params; i++)
    if (force || !pe_strmap_has(&m->initialized, p->params[i].name))
      names[(*n)++] = pe_arena_strdup(c->a, p->params[i].name);
  for (size_t i = 0; names && i < *n; i++)
    if (!names[i]) names = NULL;
  if (!names) *n = 0;
  return names;
}

static pe_status *h_init(ctx *c) {
  const Pe__InitRequest *rq = c->rq->init;
  pe_srv_program *p;
  PE_TRY(pe_status_wrap(pe_registry_acquire(c->s->reg, rq->handle, &p), "init"));
  pe_srv_model *m = p->model;
  pe_status *st = NULL;
  bool ran = false;
  /* A forced init resets every value: not under other clients' training
   * (as drop_model), unless the request overrides it. */
  if (rq->force && p->startup) {
    st = pe_registry_model_in_use(c->s->reg, m, c->rq->client_id, "init",
                                  "a forced init would reset the values they train: init without "
                                  "force (only missing values are initialised), or with "
                                  "force_in_use to reset them anyway "
                                  "(pe_client_init_force_in_use)");
    if (st && rq->force_in_use) {
      PE_LOGW("client %s forced init over other clients' training: %s",
              pe_client_tag(c->rq->client_id).s, pe_status_msg(st));
      pe_status_free(st);
      st = NULL;
    }
    if (st) {
      pe_registry_release(c->s->reg, p);
      return st;
    }
  }
  /* init_mu: two clients initialising one model run the startup once. */
  pthread_mutex_lock(&m->init_mu);
  bool missing = false;
  for (int i = 0; i < p->n_params && !missing; i++)
    missing = !pe_strmap_has(&m->initialized, p->params[i].name);
  /* A model with every value still takes this program's learning_rate
   * (the optimizer's setting, as when values are missing): a fine-tuning
   * run at another rate must not train at the old one. Not under a
   * schedule: its op computes the rate from its own base and the step
   * counter before each step, and learning_rate keeps the last step's. */
  bool lr_only = !missing && !rq->force && p->startup && program_declares(p, PE_LR_NAME) &&
                 !program_declares(p, PE_LR_COUNTER_NAME);
  size_t n_added = 0;
  char **added = NULL;
  if ((missing || rq->force || lr_only) && p->startup) {
    if (!lr_only) added = init_added(c, p, m, rq->force, &n_added);
    pe_run_opts ro = {.sync = p->sync};
    st = pe_status_wrap(rq->force ? pe_par_exec_run(p->startup, NULL, 0, NULL, 0, NULL, &ro, NULL)
                                  : startup_keeping(p, &ro),
                        "init: startup of model '%s'", m->name);
    if (!st && !lr_only) {
      for (int i = 0; i < p->n_params; i++)
        if (!pe_strmap_put(&m->initialized, p->params[i].name, (void *)1)) st = OOM("init");
      ran = true;
    }
    if (!st && ran) st = pe_srv_job_after_init(p);
  }
  pthread_mutex_unlock(&m->init_mu);
  if (!st) {
    Pe__InitReply *r = pe_arena_alloc(c->a, sizeof *r);
    if (!r)
      st = OOM("init");
    else {
      pe__init_reply__init(r);
      r->initialized = ran;
      if (ran) {
        r->added = added;
        r->n_added = n_added;
      }
      c->rep->body_case = PE__REPLY__BODY_INIT;
      c->rep->init = r;
    }
  }
  pe_registry_release(c->s->reg, p);
  return st;
}

static pe_status *h_run(ctx *c) {
  return pe_run_request(c);
}

static pe_status *h_get_params(ctx *c) {
  const Pe__ParamsRequest *rq = c->rq->get_params;
  /* Each name once: a repeat would copy its value once more. */
  PE_TRY(pe_status_wrap(pe_names_unique(rq->names, rq->n_names, pe_name_at_str, "name"),
                        "get_params"));
  pe_srv_model *m;
  PE_TRY(pe_status_wrap(pe_registry_model_acquire(c->s->reg, rq->model, &m), "get_params"));
  const char **names = NULL;
  int n = 0;
  pe_status *st = NULL;
  bool all = rq->n_names == 0;
  if (all) {
    st = pe_model_names(m->m, &names, &n);
  } else {
    n = (int)rq->n_names;
    names = malloc(sizeof *names * (size_t)n);
    if (!names) st = OOM("get_params");
    for (int i = 0; !st && i < n; i++) {
      names[i] = rq->names[i];
      if (!pe_model_has(m->m, names[i]))
        st = pe_error(PE_EUNKNOWN_VAR, "model '%s' has no parameter '%.64s'", m->name, names[i]);
    }
  }
  Pe__ParamsReply *r = st ? NULL : pe_arena_alloc(c->a, sizeof *r);
  if (!st && !r) st = OOM("get_params");
  if (!st) {
    pe__params_reply__init(r);
    r->values = pe_arena_alloc(c->a, sizeof *r->values * (size_t)(n ? n : 1));
    if (!r->values) st = OOM("get_params");
  }
  /* One snapshot (pe_model_get_many): every value from the same step
   * boundary, also while other clients train the model. */
  pe_tensor *got = st ? NULL : calloc((size_t)(n ? n : 1), sizeof *got);
  if (!st && !got) st = OOM("get_params");
  if (!st) st = pe_model_get_many(m->m, names, n, got, NULL, NULL);
  /* A value the model lacks: say whose, and what a client can do. */
  if (st && pe_status_code(st) == PE_EUSE_BEFORE_DEF)
    st = pe_status_wrap(st, "model '%s' %s", m->name,
                        pe_srv_model_has_values(m)
                            ? "lacks a value (init it again to add the missing ones)"
                            : "has no values (not initialised, trained, loaded or restored since "
                              "the daemon started: init it, e.g. pe-client register --init, or "
                              "load a checkpoint)");
  for (int i = 0; !st && i < n; i++) {
    pe_tensor *t = pe_arena_tensor(c->a);
    if (!t) {
      st = OOM("get_params");
      break;
    }
    *t = got[i]; /* moved into the arena */
    pe_tensor_init(&got[i]);
    r->values[i] = pe_wire_tensor_out(c->a, names[i], t);
    if (!r->values[i]) st = OOM("get_params");
    r->n_values++;
  }
  for (int i = 0; got && i < n; i++) pe_tensor_release(&got[i]);
  free(got);
  if (!st) {
    c->rep->body_case = PE__REPLY__BODY_PARAMS;
    c->rep->params = r;
  }
  free(names);
  pe_registry_model_release(c->s->reg, m);
  return st ? pe_status_wrap(st, "get_params") : NULL;
}

/* st prefixed with the request's name once: the wire checks already name
 * it, and the model's own errors name the model, so a second prefix would
 * only repeat it. */
static pe_status *wrap_once(pe_status *st, const char *what) {
  size_t n = strlen(what);
  if (!st || (!strncmp(st->msg, what, n) && st->msg[n] == ':')) return st;
  return pe_status_wrap(st, "%s", what);
}

/* SetParams and Load overwrite values that other clients may be training:
 * allowed (they name what they set: a warm start, an operator's restore of
 * a known-good checkpoint), unlike a forced Init, but logged. */
static void warn_in_use(ctx *c, const pe_srv_model *m, const char *op) {
  pe_status *u = pe_registry_model_in_use(c->s->reg, m, c->rq->client_id, op,
                                          "their runs go on from the values set");
  if (u) PE_LOGW("client %s: %s", pe_client_tag(c->rq->client_id).s, pe_status_msg(u));
  pe_status_free(u);
}

static pe_status *h_set_params(ctx *c) {
  const Pe__ParamsRequest *rq = c->rq->set_params;
  PE_TRY(pe_status_wrap(
      pe_names_unique(rq->values, rq->n_values, pe_wire_tensor_name_at, "value name"),
      "set_params"));
  pe_srv_model *m;
  PE_TRY(pe_status_wrap(pe_registry_model_acquire(c->s->reg, rq->model, &m), "set_params"));
  int n = (int)rq->n_values;
  pe_status *st = NULL;
  pe_tensor *views = calloc((size_t)(n ? n : 1), sizeof *views);
  const char **names = calloc((size_t)(n ? n : 1), sizeof *names);
  if (!views || !names) st = OOM("set_params");
  /* Check every value before setting any. */
  for (int i = 0; !st && i < n; i++) {
    st = pe_wire_tensor_in(c->s, c->rq->client_id, "set_params", rq->values[i], &views[i], NULL);
    names[i] = rq->values[i]->name;
  }
  for (int i = 0; !st && i < n; i++)
    if (!names[i][0]) st = pe_error(PE_EINVAL, "value %d has an empty name", i);
  /* A name no program of the model declares: a typo, not a new variable. */
  if (!st) st = pe_shape_claims_known(&m->shapes, m->name, names, n, false);
  if (!st) st = pe_srv_model_claim_values(m, names, views, n);
  if (!st) st = pe_model_set_many(m->m, names, views, n, NULL); /* no run sees half of it */
  if (!st) pe_model_mark_initialized(m, names, n);
  if (!st) warn_in_use(c, m, "set_params");
  for (int i = 0; views && i < n; i++) pe_tensor_release(&views[i]);
  free(views);
  free(names);
  pe_registry_model_release(c->s->reg, m);
  return wrap_once(st, "set_params");
}

static pe_status *checkpoint_reply(ctx *c, char *path, uint64_t bytes) {
  Pe__CheckpointReply *r = pe_arena_alloc(c->a, sizeof *r);
  if (!r || !pe_arena_own(c->a, path, NULL)) return OOM("checkpoint");
  pe__checkpoint_reply__init(r);
  r->path = path;
  r->bytes = bytes;
  c->rep->body_case = PE__REPLY__BODY_CHECKPOINT;
  c->rep->checkpoint = r;
  return NULL;
}

static pe_status *h_checkpoint(ctx *c, bool save) {
  const Pe__CheckpointRequest *rq = save ? c->rq->save : c->rq->load;
  const char *op = save ? "save" : "load";
  /* Validate the name before touching the model: '../x' is refused even
   * for a model that does not exist. */
  PE_TRY(pe_status_wrap(pe_name_check("checkpoint name", rq->name), "%s", op));
  pe_srv_model *m;
  PE_TRY(pe_status_wrap(pe_registry_model_acquire(c->s->reg, rq->model, &m), "%s", op));
  char *path = NULL;
  uint64_t bytes = 0;
  pe_status *st = save ? pe_checkpoint_save(c->s->cfg.state_dir, m, rq->name, &path, &bytes)
                       : pe_checkpoint_load(c->s->cfg.state_dir, m, rq->name, &path, &bytes);
  if (!st && !save) warn_in_use(c, m, "load");
  pe_registry_model_release(c->s->reg, m);
  if (!st) st = checkpoint_reply(c, path, bytes);
  return st;
}

static pe_status *h_save(ctx *c) {
  return h_checkpoint(c, true);
}
static pe_status *h_load(ctx *c) {
  return h_checkpoint(c, false);
}

static pe_status *h_deregister(ctx *c) {
  return pe_registry_deregister(c->s->reg, c->rq->client_id, c->rq->deregister->handle,
                                c->rq->deregister->force);
}

static pe_status *h_drop_model(ctx *c) {
  pe_drop_result d;
  pe_status *st = pe_model_drop(c->s, c->rq->client_id, c->rq->drop_model->model, &d);
  Pe__DropModelReply *r = st ? NULL : pe_arena_alloc(c->a, sizeof *r);
  if (!st && !r) st = OOM("drop_model");
  if (!st) {
    pe__drop_model_reply__init(r);
    r->freed = d.freed;
    r->programs = d.programs;
    r->removed = pe_arena_strdup(c->a, d.removed ? d.removed : "");
    if (!r->removed) st = OOM("drop_model");
  }
  free(d.removed);
  if (!st) {
    c->rep->body_case = PE__REPLY__BODY_DROP_MODEL;
    c->rep->drop_model = r;
  }
  return st;
}

/* The client ends its session (pe_client_close). Its cached replies stay
 * until the cache evicts them, so that a late copy of one of its requests
 * (request threads take copies out of order) is still answered from there,
 * never applied again. */
static pe_status *h_close(ctx *c) {
  uint64_t client = c->rq->client_id;
  int programs = pe_registry_drop_client(c->s->reg, client);
  pe_shm_drop_client(c->s->shm, client);
  PE_LOGI("session %s closed by its client: %d program(s) given up", pe_client_tag(client).s,
          programs);
  return NULL;
}

static pe_status *h_register_shm(ctx *c) {
  const Pe__ShmRequest *rq = c->rq->register_shm;
  uint64_t id;
  PE_TRY(pe_shm_register(c->s->shm, c->rq->client_id, rq->name ? rq->name : "", rq->size,
                         rq->token.data, rq->token.len, &id));
  Pe__ShmReply *r = pe_arena_alloc(c->a, sizeof *r);
  if (!r) {
    pe_status_free(pe_shm_unregister(c->s->shm, c->rq->client_id, id));
    return OOM("register_shm");
  }
  pe__shm_reply__init(r);
  r->region = id;
  c->rep->body_case = PE__REPLY__BODY_SHM;
  c->rep->shm = r;
  return NULL;
}

static pe_status *h_unregister_shm(ctx *c) {
  return pe_shm_unregister(c->s->shm, c->rq->client_id, c->rq->unregister_shm->region);
}

/* --- table ------------------------------------------------------------------- */
/* lane (lanes.h): RUN for Run, which holds its thread for all its steps;
 * CONTROL only for handlers that run no program, wait on no model's steps
 * (a run in flight is cancelled, not waited for) and read or write no
 * checkpoint file; a model they free has no run left on it. */
#define WORK PE_LANE_WORK
#define CONTROL PE_LANE_CONTROL
#define RUN PE_LANE_RUN
typedef struct handler_row {
  Pe__Request__BodyCase kind;
  const char *name;
  pe_status *(*fn)(ctx *c);
  pe_lane lane;
  bool ends_session; /* not touched: that would open the session again */
} handler_row;

static const handler_row handlers[] = {
    {PE__REQUEST__BODY_PING, "ping", h_ping, CONTROL},
    {PE__REQUEST__BODY_REGISTER, "register", h_register, WORK},
    {PE__REQUEST__BODY_INIT, "init", h_init, WORK},
    {PE__REQUEST__BODY_RUN, "run", h_run, RUN},
    {PE__REQUEST__BODY_GET_PARAMS, "get_params", h_get_params, WORK},
    {PE__REQUEST__BODY_SET_PARAMS, "set_params", h_set_params, WORK},
    {PE__REQUEST__BODY_SAVE, "save", h_save, WORK},
    {PE__REQUEST__BODY_LOAD, "load", h_load, WORK},
    {PE__REQUEST__BODY_DEREGISTER, "deregister", h_deregister, CONTROL},
    {PE__REQUEST__BODY_STATUS, "status", h_status, CONTROL},
    {PE__REQUEST__BODY_REGISTER_SHM, "register_shm", h_register_shm, CONTROL},
    {PE__REQUEST__BODY_UNREGISTER_SHM, "unregister_shm", h_unregister_shm, CONTROL},
    {PE__REQUEST__BODY_CLOSE, "close", h_close, CONTROL, true},
    {PE__REQUEST__BODY_DROP_MODEL, "drop_model", h_drop_model, CONTROL},
};

static const handler_row *find_handler(Pe__Request__BodyCase k) {
  for (size_t i = 0; i < sizeof handlers / sizeof handlers[0]; i++)
    if (handlers[i].kind == k) return &handlers[i];
  return NULL;
}

const char *pe_request_kind_name(Pe__Request__BodyCase k) {
  const handler_row *h = find_handler(k);
  return h ? h->name : "none";
}

pe_lane pe_request_lane(Pe__Request__BodyCase k) {
  const handler_row *h = find_handler(k);
  return h ? h->lane : PE_LANE_WORK;
}

void pe_dispatch(pe_server *s, const Pe__Request *rq, double received, pe_lane lane, Pe__Reply *rep,
                 pe_arena *a) {
  rep->client_id = rq->client_id;
  rep->request_id = rq->request_id;
  ctx c = {s, rq, rep, a, received, lane};
  const handler_row *h = find_handler(rq->body_case);
  pe_status *st;
  if (!h) {
    st = pe_error(PE_EINVAL, "request %llu: no request body (kind %d unknown or unset)",
                  (unsigned long long)rq->request_id, (int)rq->body_case);
  } else {
    /* The session is busy while the request runs: a run longer than the
     * TTL is not idleness, and the TTL counts from its end. */
    long pid = (long)rq->client_pid;
    if (!h->ends_session)
      pe_registry_request_begin(s->reg, rq->client_id, pid, rq->client_start, pe_now_s());
    /* Begun: the client's next request may start (lanes.h); a run says so
     * itself, once it holds its program (run/request.c). */
    if (h->lane != PE_LANE_RUN) pe_lanes_started();
    st = h->fn(&c);
    if (!h->ends_session)
      pe_registry_request_end(s->reg, rq->client_id, pid, rq->client_start, pe_now_s());
  }
  if (st) {
    rep->code = (int32_t)pe_status_code(st);
    rep->message = pe_arena_strdup(a, pe_status_msg(st));
    if (!rep->message) rep->message = (char *)"out of memory";
    /* Messages quote client-supplied names: keep them one printable ASCII
     * line (a protobuf string must be UTF-8; a log line must stay one). */
    for (char *m = rep->message; *m; m++)
      if ((unsigned char)*m < 0x20 || (unsigned char)*m >= 0x7f) *m = '?';
    /* A failed run keeps the RunReply it set: the steps it applied. */
    if (rep->body_case != PE__REPLY__BODY_RUN) rep->body_case = PE__REPLY__BODY__NOT_SET;
    pe_status_free(st);
  } else {
    rep->code = 0;
    rep->message = (char *)"ok";
  }
}
