/* The typed requests: each builds its Request on the stack (pointing into
 * the caller's data, nothing copied), goes through pec_call, and converts
 * the reply's body into the plain structs of pe_client.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* An array of n names (kind: one of them) for request what: NULL with
 * n > 0, or with a NULL entry, is refused naming which. */
static int check_names(pe_client *c, const char *what, const char *kind, const char *const *names,
                       size_t n) {
  if (n && !names)
    return pec_fail(c, PE_C_EARG, "%s: %zu %s name%s but no array", what, n, kind,
                    n == 1 ? "" : "s");
  for (size_t i = 0; i < n; i++)
    if (!names[i]) return pec_fail(c, PE_C_EARG, "%s: %s %zu of %zu is NULL", what, kind, i + 1, n);
  return 0;
}

/* An out-pointer the call needs (its result). */
static int need_out(pe_client *c, const char *what, const void *out, const char *arg) {
  return out ? 0 : pec_fail(c, PE_C_EARG, "%s: %s is NULL", what, arg);
}

int pe_client_ping(pe_client *c) {
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_PING;
  req.ping = 1;
  return pec_call(c, "ping", &req, PE__REPLY__BODY__NOT_SET);
}

static pe_client_strategy strategy_of(Pe__Strategy s) {
  return s == PE__STRATEGY__REDUCE    ? PE_C_REDUCE
         : s == PE__STRATEGY__SHARDED ? PE_C_SHARDED
                                      : PE_C_ALLREDUCE;
}

/* The reply's PlacesTrial (may be NULL) into *out, its candidates into cs
 * (room for t->n_candidates, in the request's results). */
static void places_trial(const Pe__PlacesTrial *t, pe_client_places_candidate *cs,
                         pe_client_places_trial *out) {
  memset(out, 0, sizeof *out);
  if (!t) return;
  for (size_t i = 0; i < t->n_candidates; i++) {
    const Pe__PlacesCandidate *x = t->candidates[i];
    cs[i] = (pe_client_places_candidate){x->places ? x->places : "", strategy_of(x->strategy),
                                         x->fused, x->step_ms, x->error ? x->error : ""};
  }
  *out = (pe_client_places_trial){.present = true,
                                  .places = t->places ? t->places : "",
                                  .strategy = strategy_of(t->strategy),
                                  .fused = t->fused,
                                  .remembered = t->remembered,
                                  .batch = t->batch,
                                  .trial_s = t->trial_s,
                                  .n_candidates = t->n_candidates,
                                  .candidates = cs};
}

int pe_client_register(pe_client *c, const pe_client_register_args *a, pe_client_program *out) {
  static const char what[] = "register";
  PEC_NEED_HANDLE(c);
  int rc = need_out(c, what, out, "out (pe_client_program *)");
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  if (!a || !a->program || !a->program_len)
    return pec_fail(c, PE_C_EARG, "%s: no program bytes", what);
  if (!a->model || !*a->model) return pec_fail(c, PE_C_EARG, "%s: no model name", what);
  if ((rc = check_names(c, what, "keep", a->keep, a->n_keep))) return rc;
  if ((unsigned)a->strategy > PE_C_SHARDED)
    return pec_fail(c, PE_C_EARG, "%s: strategy %d unknown", what, (int)a->strategy);
  if ((unsigned)a->cuda_graph > PE_C_CUDA_GRAPH_OFF)
    return pec_fail(c, PE_C_EARG, "%s: cuda_graph %d unknown", what, (int)a->cuda_graph);
  Pe__RegisterOptions o = PE__REGISTER_OPTIONS__INIT;
  o.places = (char *)(a->places ? a->places : "");
  o.strategy = a->strategy == PE_C_ALLREDUCE ? PE__STRATEGY__ALLREDUCE
               : a->strategy == PE_C_REDUCE  ? PE__STRATEGY__REDUCE
               : a->strategy == PE_C_SHARDED ? PE__STRATEGY__SHARDED
                                             : PE__STRATEGY__AUTO;
  o.loss = (char *)(a->loss ? a->loss : "");
  o.seed = a->seed;
  o.fuse_allreduce = a->fuse_allreduce;
  o.fuse_bucket_bytes = a->fuse_bucket_bytes;
  o.for_test = a->for_test;
  o.persistent = a->persistent;
  o.sync = (char *)(a->sync ? a->sync : "");
  o.n_keep = a->n_keep;
  o.keep = (char **)a->keep;
  o.no_op_fusion = a->no_op_fusion;
  o.batch_hint = a->batch_hint > 0 ? a->batch_hint : 0;
  static const char *const cuda_graph[] = {"", "auto", "on", "off"};
  o.cuda_graph = (char *)cuda_graph[a->cuda_graph];
  Pe__JobSpec job = PE__JOB_SPEC__INIT;
  if (a->job) {
    if (a->job_world < 0 || a->job_rank < 0)
      return pec_fail(c, PE_C_EINVAL, "register: job '%s': world %d and rank %d must be >= 0",
                      a->job, a->job_world, a->job_rank);
    job.name = (char *)a->job;
    job.world = (uint32_t)a->job_world;
    job.rank = (uint32_t)a->job_rank;
    job.rendezvous = (char *)(a->job_rendezvous ? a->job_rendezvous : "");
    job.token = (char *)(a->job_token ? a->job_token : "");
    o.job = &job;
  }
  Pe__RegisterRequest r = PE__REGISTER_REQUEST__INIT;
  r.program.data = (uint8_t *)a->program;
  r.program.len = a->program_len;
  r.model = (char *)a->model;
  r.options = &o;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_REGISTER;
  req.register_ = &r;
  rc = pec_call(c, what, &req, PE__REPLY__BODY_REGISTER);
  if (rc) return rc;
  const Pe__RegisterReply *rr = c->reply->register_;
  if ((rc = pec_prog_remember(c, a, rr->handle))) return rc;
  /* One block (the results of a request): the params, then the trial's
   * candidates. */
  size_t n_cand = rr->places_trial ? rr->places_trial->n_candidates : 0;
  pe_client_param *ps =
      pec_results_alloc(c, rr->n_params * sizeof *ps + n_cand * sizeof(pe_client_places_candidate));
  if (!ps) return pec_fail(c, PE_C_ENOMEM, "%s: %zu params", what, rr->n_params);
  for (size_t i = 0; i < rr->n_params; i++) {
    const Pe__ParamInfo *pi = rr->params[i];
    if (pi->n_shape > PE_CLIENT_MAX_DIMS)
      return pec_fail(c, PE_C_EPROTO, "%s: param '%s' has %zu dims (max %d)", what, pi->name,
                      pi->n_shape, PE_CLIENT_MAX_DIMS);
    ps[i].name = pi->name;
    ps[i].dtype = (pe_b_dtype)pi->dtype;
    ps[i].ndim = (int)pi->n_shape;
    for (size_t d = 0; d < pi->n_shape; d++) ps[i].shape[d] = pi->shape[d];
  }
  out->handle = rr->handle;
  out->existed = rr->existed;
  out->has_values = rr->has_values;
  out->strategy = strategy_of(rr->strategy);
  snprintf(out->places, sizeof out->places, "%s", rr->places ? rr->places : "");
  out->applied_request = rr->applied_request;
  out->applied_steps = rr->applied_steps;
  out->n_params = rr->n_params;
  out->params = ps;
  places_trial(rr->places_trial, (pe_client_places_candidate *)(ps + rr->n_params),
               &out->places_trial);
  return 0;
}

/* The program a request names: a handle, or (handle 0) a model name. */
typedef struct target {
  uint64_t handle;
  const char *model;
  bool need_values; /* only worth sending again when the model has values */
  bool run;
} target;

/* pec_call; when the daemon lost the target's program, once more after the
 * recovery (client_recover.c) under a new request id. feeds (n of them, pbs
 * their proto form) get the regions' current ids for the second send. */
static int call_recovering(pe_client *c, const char *what, Pe__Request *req,
                           Pe__Reply__BodyCase want, target t, const pe_client_tensor *feeds,
                           Pe__Tensor *const *pbs, size_t n) {
  int rc = pec_call(c, what, req, want);
  if (rc == PE_C_ESHUTDOWN) rc = pec_wait_restart(c);
  if (rc != PE_C_ENOTFOUND) return rc;
  rc = pec_recover(c, what, rc, t.handle, t.model, t.run ? req->request_id : 0, t.need_values);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++)
    if (feeds[i].shm_region) pbs[i]->shm->region = pec_region_now(c, feeds[i].shm_region);
  return pec_call(c, what, req, want);
}

static int init_request(pe_client *c, uint64_t handle, bool force, bool in_use, bool *initialized) {
  Pe__InitRequest r = PE__INIT_REQUEST__INIT;
  r.handle = handle;
  r.force = force;
  r.force_in_use = in_use;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_INIT;
  req.init = &r;
  int rc = call_recovering(c, "init", &req, PE__REPLY__BODY__NOT_SET, (target){handle, NULL, false},
                           NULL, NULL, 0);
  if (!rc && initialized)
    *initialized = c->reply->body_case == PE__REPLY__BODY_INIT && c->reply->init->initialized;
  return rc;
}

int pe_client_init(pe_client *c, uint64_t handle, bool force, bool *initialized) {
  PEC_NEED_HANDLE(c);
  return init_request(c, handle, force, false, initialized);
}

int pe_client_init_force_in_use(pe_client *c, uint64_t handle, bool *initialized) {
  PEC_NEED_HANDLE(c);
  return init_request(c, handle, true, true, initialized);
}

size_t pe_client_init_added(const pe_client *c, const char *const **names) {
  *names = NULL;
  if (!c || !c->reply || c->reply->body_case != PE__REPLY__BODY_INIT || !c->reply->init) return 0;
  *names = (const char *const *)c->reply->init->added;
  return c->reply->init->n_added;
}

/* Feeds as proto tensors in one allocation: n Pe__Tensor, their shapes and
 * shm refs, and the pointer array. Freed by the caller. */
typedef struct pb_feeds {
  Pe__Tensor **ptrs;
  void *block;
} pb_feeds;

static int feeds_to_pb(pe_client *c, const char *what, const char *kind, const pe_client_tensor *ts,
                       size_t n, pb_feeds *out) {
  if (n && !ts)
    return pec_fail(c, PE_C_EARG, "%s: %zu %s%s but no array", what, n, kind, n == 1 ? "" : "s");
  size_t one = sizeof(Pe__Tensor *) + sizeof(Pe__Tensor) + sizeof(Pe__ShmRef) +
               PE_CLIENT_MAX_DIMS * sizeof(int64_t);
  out->block = calloc(n ? n : 1, one);
  if (!out->block) return pec_fail(c, PE_C_ENOMEM, "%s: %zu tensors", what, n);
  char *p = out->block;
  out->ptrs = (Pe__Tensor **)p;
  Pe__Tensor *pbs = (Pe__Tensor *)(p + n * sizeof(Pe__Tensor *));
  Pe__ShmRef *shms = (Pe__ShmRef *)(pbs + n);
  int64_t *shapes = (int64_t *)(shms + n);
  for (size_t i = 0; i < n; i++) {
    int rc = pec_tensor_to_pb(c, what, &ts[i], &pbs[i], shapes + i * PE_CLIENT_MAX_DIMS, &shms[i]);
    if (rc) return rc;
    out->ptrs[i] = &pbs[i];
  }
  return 0;
}

int pe_client_run(pe_client *c, uint64_t handle, const pe_client_tensor *feeds, size_t n_feeds,
                  const char *const *fetch, size_t n_fetch, const pe_client_run_opts *opts,
                  pe_client_run_result *out) {
  static const char what[] = "run";
  PEC_NEED_HANDLE(c);
  pe_client_run_result dummy;
  if (!out) out = &dummy;
  memset(out, 0, sizeof *out);
  int rc = check_names(c, what, "fetch", fetch, n_fetch);
  if (rc) return rc;
  pb_feeds pf = {0};
  rc = feeds_to_pb(c, what, "feed", feeds, n_feeds, &pf);
  if (rc) {
    free(pf.block);
    return rc;
  }
  Pe__RunOptions ro = PE__RUN_OPTIONS__INIT;
  if (opts) {
    ro.trace = opts->trace;
    ro.timeout_ms = opts->timeout_ms;
    ro.priority = opts->priority;
    ro.check_nan_inf = opts->check_nan_inf;
  }
  Pe__RunRequest r = PE__RUN_REQUEST__INIT;
  r.handle = handle;
  r.n_feeds = n_feeds;
  r.feeds = pf.ptrs;
  r.n_fetch = n_fetch;
  r.fetch = (char **)fetch;
  r.steps = opts ? opts->steps : 0;
  r.batches = opts ? opts->batches : 0;
  r.options = &ro;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_RUN;
  req.run = &r;
  rc = call_recovering(c, what, &req, PE__REPLY__BODY_RUN, (target){handle, NULL, true, true},
                       feeds, pf.ptrs, n_feeds);
  free(pf.block);
  /* A run that failed after applying some steps says how many. */
  if (rc && rc < PE_C_CLIENT_BASE && c->reply && c->reply->body_case == PE__REPLY__BODY_RUN)
    out->steps = c->reply->run->steps;
  if (rc) return rc;
  const Pe__RunReply *rr = c->reply->run;
  pec_prog_answered(c, handle, req.request_id, rr->steps);
  rc = pec_tensors_from_pb(c, what, rr->fetched, rr->n_fetched, &out->fetched);
  if (rc) return rc;
  out->n_fetched = rr->n_fetched;
  out->run_ms = rr->run_ms;
  out->queue_ms = rr->queue_ms;
  out->steps = rr->steps;
  if (rr->trace_json.len) {
    c->trace = malloc(rr->trace_json.len + 1);
    if (!c->trace) return pec_fail(c, PE_C_ENOMEM, "%s: %zu-byte trace", what, rr->trace_json.len);
    memcpy(c->trace, rr->trace_json.data, rr->trace_json.len);
    c->trace[rr->trace_json.len] = 0;
    out->trace_json = c->trace;
    out->trace_len = rr->trace_json.len;
  }
  return 0;
}

int pe_client_get_params(pe_client *c, const char *model, const char *const *names, size_t n_names,
                         const pe_client_tensor **values, size_t *n_values) {
  static const char what[] = "get_params";
  PEC_NEED_HANDLE(c);
  int rc = need_out(c, what, values, "values");
  if (!rc) rc = need_out(c, what, n_values, "n_values");
  if (rc) return rc;
  *values = NULL;
  *n_values = 0;
  if (!model || !*model) return pec_fail(c, PE_C_EARG, "%s: no model name", what);
  if (names && (rc = check_names(c, what, "parameter", names, n_names))) return rc;
  Pe__ParamsRequest r = PE__PARAMS_REQUEST__INIT;
  r.model = (char *)model;
  r.n_names = names ? n_names : 0;
  r.names = (char **)names;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_GET_PARAMS;
  req.get_params = &r;
  rc = call_recovering(c, what, &req, PE__REPLY__BODY_PARAMS, (target){0, model, true}, NULL, NULL,
                       0);
  if (rc) return rc;
  const Pe__ParamsReply *pr = c->reply->params;
  rc = pec_tensors_from_pb(c, what, pr->values, pr->n_values, values);
  if (!rc) *n_values = pr->n_values;
  return rc;
}

int pe_client_set_params(pe_client *c, const char *model, const pe_client_tensor *values,
                         size_t n_values) {
  static const char what[] = "set_params";
  PEC_NEED_HANDLE(c);
  if (!model || !*model) return pec_fail(c, PE_C_EARG, "%s: no model name", what);
  pb_feeds pf = {0};
  int rc = feeds_to_pb(c, what, "value", values, n_values, &pf);
  if (rc) {
    free(pf.block);
    return rc;
  }
  Pe__ParamsRequest r = PE__PARAMS_REQUEST__INIT;
  r.model = (char *)model;
  r.n_values = n_values;
  r.values = pf.ptrs;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_SET_PARAMS;
  req.set_params = &r;
  rc = call_recovering(c, what, &req, PE__REPLY__BODY__NOT_SET, (target){0, model, false}, values,
                       pf.ptrs, n_values);
  free(pf.block);
  return rc;
}

static int checkpoint(pe_client *c, bool save, const char *model, const char *name,
                      const char **path, uint64_t *bytes) {
  const char *what = save ? "save" : "load";
  PEC_NEED_HANDLE(c);
  if (path) *path = NULL;
  if (bytes) *bytes = 0;
  if (!model || !*model) return pec_fail(c, PE_C_EARG, "%s: no model name", what);
  if (!name || !*name) return pec_fail(c, PE_C_EARG, "%s: no checkpoint name", what);
  Pe__CheckpointRequest r = PE__CHECKPOINT_REQUEST__INIT;
  r.model = (char *)model;
  r.name = (char *)name;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = save ? PE__REQUEST__BODY_SAVE : PE__REQUEST__BODY_LOAD;
  if (save)
    req.save = &r;
  else
    req.load = &r;
  int rc = call_recovering(c, what, &req, PE__REPLY__BODY__NOT_SET, (target){0, model, save}, NULL,
                           NULL, 0);
  if (rc) return rc;
  if (c->reply->body_case == PE__REPLY__BODY_CHECKPOINT) {
    if (path) *path = c->reply->checkpoint->path;
    if (bytes) *bytes = c->reply->checkpoint->bytes;
  }
  return 0;
}

int pe_client_save(pe_client *c, const char *model, const char *name, const char **path,
                   uint64_t *bytes) {
  return checkpoint(c, true, model, name, path, bytes);
}

int pe_client_load(pe_client *c, const char *model, const char *name, const char **path,
                   uint64_t *bytes) {
  return checkpoint(c, false, model, name, path, bytes);
}

static int deregister(pe_client *c, uint64_t handle, bool force) {
  PEC_NEED_HANDLE(c);
  Pe__DeregisterRequest r = PE__DEREGISTER_REQUEST__INIT;
  r.handle = handle;
  r.force = force;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_DEREGISTER;
  req.deregister = &r;
  int rc = pec_call(c, "deregister", &req, PE__REPLY__BODY__NOT_SET);
  if (!rc || rc == PE_C_ENOTFOUND) pec_prog_forget(c, handle);
  return rc;
}

int pe_client_deregister(pe_client *c, uint64_t handle) {
  return deregister(c, handle, false);
}

int pe_client_deregister_force(pe_client *c, uint64_t handle) {
  return deregister(c, handle, true);
}

int pe_client_drop_model(pe_client *c, const char *model, pe_client_drop_result *out) {
  static const char what[] = "drop_model";
  PEC_NEED_HANDLE(c);
  if (out) *out = (pe_client_drop_result){.removed = ""};
  if (!model || !*model) return pec_fail(c, PE_C_EARG, "%s: no model name", what);
  Pe__DropModelRequest r = PE__DROP_MODEL_REQUEST__INIT;
  r.model = (char *)model;
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_DROP_MODEL;
  req.drop_model = &r;
  int rc = pec_call(c, what, &req, PE__REPLY__BODY_DROP_MODEL);
  if (rc) return rc;
  /* The daemon deregistered them: nothing of the model is to be recovered. */
  pec_prog_forget_model(c, model);
  const Pe__DropModelReply *d = c->reply->drop_model;
  if (out) *out = (pe_client_drop_result){d->freed, d->removed, d->programs};
  return 0;
}

/* A clean-up request after one the daemon did not answer: not sent (see
 * pe_client.silent). */
static int skip_when_silent(pe_client *c, const char *what) {
  return pec_fail(c, PE_C_ETIMEDOUT,
                  "%s: not sent: the daemon did not answer the previous request; it ends this "
                  "session itself (this process exiting, or its TTL)",
                  what);
}

int pe_client_close(pe_client *c) {
  PEC_NEED_HANDLE(c);
  if (c->silent) return skip_when_silent(c, "close");
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_CLOSE;
  req.close = 1;
  int rc = pec_call(c, "close", &req, PE__REPLY__BODY__NOT_SET);
  /* The daemon has dropped them: nothing is left to recover. */
  if (!rc) pec_recover_free(c);
  return rc;
}

int pe_client_get_status(pe_client *c, pe_client_status *out) {
  static const char what[] = "status";
  PEC_NEED_HANDLE(c);
  int rc = need_out(c, what, out, "out (pe_client_status *)");
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = PE__REQUEST__BODY_STATUS;
  req.status = 1;
  rc = pec_call(c, what, &req, PE__REPLY__BODY_STATUS);
  if (rc) return rc;
  const Pe__StatusReply *s = c->reply->status;
  /* One block: places, models, runs, lanes, then the models' places
   * trials' candidates (each 8-byte aligned). */
  size_t n_cand = 0;
  for (size_t i = 0; i < s->n_models; i++)
    if (s->models[i]->places_trial) n_cand += s->models[i]->places_trial->n_candidates;
  char *block = pec_results_alloc(c, s->n_places * sizeof(pe_client_place_status) +
                                         s->n_models * sizeof(pe_client_model_status) +
                                         s->n_runs * sizeof(pe_client_run_status) +
                                         s->n_lanes * sizeof(pe_client_lane_status) +
                                         n_cand * sizeof(pe_client_places_candidate));
  if (!block) return pec_fail(c, PE_C_ENOMEM, "%s: reply arrays", what);
  pe_client_place_status *ps = (pe_client_place_status *)block;
  pe_client_model_status *ms = (pe_client_model_status *)(ps + s->n_places);
  pe_client_run_status *rs = (pe_client_run_status *)(ms + s->n_models);
  pe_client_lane_status *ls = (pe_client_lane_status *)(rs + s->n_runs);
  pe_client_places_candidate *cs = (pe_client_places_candidate *)(ls + s->n_lanes);
  for (size_t i = 0; i < s->n_lanes; i++)
    ls[i] = (pe_client_lane_status){s->lanes[i]->name, s->lanes[i]->threads, s->lanes[i]->busy,
                                    s->lanes[i]->queued};
  for (size_t i = 0; i < s->n_runs; i++)
    rs[i] = (pe_client_run_status){
        s->runs[i]->client_id,  s->runs[i]->client,      s->runs[i]->model, s->runs[i]->handle,
        s->runs[i]->steps_done, s->runs[i]->steps_total, s->runs[i]->age_s};
  for (size_t i = 0; i < s->n_places; i++)
    ps[i] = (pe_client_place_status){s->places[i]->place, s->places[i]->bytes_in_use,
                                     s->places[i]->bytes_cached};
  for (size_t i = 0; i < s->n_models; i++) {
    const Pe__ModelStatus *x = s->models[i];
    ms[i] = (pe_client_model_status){
        .name = x->name,
        .programs = x->programs,
        .param_bytes = x->param_bytes,
        .persistent = x->persistent,
        .checkpoints_saved = x->checkpoints_saved,
        .checkpoint_failures = x->checkpoint_failures,
        .last_checkpoint = x->last_checkpoint,
        .last_checkpoint_age_s = x->last_checkpoint_age_s,
        .last_checkpoint_error = x->last_checkpoint_error,
        .changes_since_checkpoint = x->changes_since_checkpoint,
        .restart_checkpoint = x->restart_checkpoint,
        .restart_checkpoint_age_s = x->restart_checkpoint_age_s,
        .changes_since_restart_checkpoint = x->changes_since_restart_checkpoint,
        .restart_checkpoint_read = x->restart_checkpoint_read};
    places_trial(x->places_trial, cs, &ms[i].places_trial);
    cs += ms[i].places_trial.n_candidates;
  }
  *out = (pe_client_status){
      .version = s->version,
      .uptime_s = s->uptime_s,
      .n_places = s->n_places,
      .n_models = s->n_models,
      .places = ps,
      .models = ms,
      .programs = s->programs,
      .queue_depth = s->queue_depth,
      .clients = s->clients,
      .worker_threads = s->worker_threads,
      .requests_total = s->requests_total,
      .requests_failed = s->requests_failed,
      .runs_total = s->runs_total,
      .runs_in_flight = s->runs_in_flight,
      .n_runs = s->n_runs,
      .runs = rs,
      .n_lanes = s->n_lanes,
      .lanes = ls,
      .reply_cache_entries = s->reply_cache_entries,
      .reply_cache_bytes = s->reply_cache_bytes,
      .resends_answered = s->resends_answered,
      .resends_waited = s->resends_waited,
      .resends_stale = s->resends_stale,
      .reply_cache_evictions = s->reply_cache_evictions,
      .checkpoint_interval_s = s->checkpoint_interval_s,
      .rss_bytes = s->rss_bytes,
      .host_bytes_in_use = s->host_bytes_in_use,
      .host_bytes_cached = s->host_bytes_cached,
      .run_bytes_reserved = s->run_bytes_reserved,
      .runs_waiting_for_memory = s->runs_waiting_for_memory,
      .memory_total_bytes = s->memory_total_bytes,
      .memory_resident_bytes = s->memory_resident_bytes,
      .cuda_graph = s->cuda_graph,
      .cuda_graph_reason = s->cuda_graph_reason ? s->cuda_graph_reason : "",
  };
  return 0;
}

static int shm_request(pe_client *c, bool reg, const char *name, uint64_t size, uint64_t region,
                       const uint8_t *token, uint64_t *out_region) {
  const char *what = reg ? "register_shm" : "unregister_shm";
  Pe__ShmRequest r = PE__SHM_REQUEST__INIT;
  r.name = (char *)(name ? name : "");
  r.size = size;
  r.region = region;
  if (token) {
    r.token.data = (uint8_t *)token;
    r.token.len = PE_SHM_TOKEN_LEN;
  }
  Pe__Request req = PE__REQUEST__INIT;
  req.body_case = reg ? PE__REQUEST__BODY_REGISTER_SHM : PE__REQUEST__BODY_UNREGISTER_SHM;
  if (reg)
    req.register_shm = &r;
  else
    req.unregister_shm = &r;
  int rc = pec_call(c, what, &req, reg ? PE__REPLY__BODY_SHM : PE__REPLY__BODY__NOT_SET);
  if (!rc && out_region) *out_region = c->reply->shm->region;
  return rc;
}

/* Registering a name already remembered (the daemon answers the same id,
 * or a new one after it lost the region) updates the remembered id. */
int pec_register_shm(pe_client *c, const char *name, uint64_t size,
                     const uint8_t token[PE_SHM_TOKEN_LEN], uint64_t *region) {
  int rc = shm_request(c, true, name, size, 0, token, region);
  if (rc) return rc;
  return pec_region_remember(c, name, size, token, *region);
}

/* The token from the object's trailer: the caller made the object, so it
 * can read it. */
int pe_client_register_shm(pe_client *c, const char *name, uint64_t size, uint64_t *region) {
  PEC_NEED_HANDLE(c);
  int rc = need_out(c, "register_shm", region, "region");
  if (rc) return rc;
  if (!name || name[0] != '/')
    return pec_fail(c, PE_C_EARG, "register_shm: name '%s' must start with '/'",
                    name ? name : "(null)");
  uint8_t token[PE_SHM_TOKEN_LEN];
  bool have;
  rc = pec_shm_read_token(c, name, size, token, &have);
  if (rc) return rc;
  return pec_register_shm(c, name, size, have ? token : NULL, region);
}

int pe_client_unregister_shm(pe_client *c, uint64_t region) {
  PEC_NEED_HANDLE(c);
  if (c->silent) return skip_when_silent(c, "unregister_shm");
  int rc = shm_request(c, false, NULL, 0, pec_region_now(c, region), NULL, NULL);
  if (!rc || rc == PE_C_ENOTFOUND) pec_region_forget(c, region);
  return rc;
}
