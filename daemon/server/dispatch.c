/* Request handlers, table-driven by body case (see dispatch.h). */
#include "server/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "server/checkpoint.h"
#include "server/model_drop.h"
#include "server/programs.h"
#include "server/run_batches.h"
#include "server/run_cancel.h"
#include "server/shm.h"

/* Requests that would make the daemon loop for hours are refused up front. */
#define PE_MAX_STEPS 1000000u
#define PE_MAX_FETCH 1024
#define PE_MAX_FEEDS 1024

/* --- arena ------------------------------------------------------------------ */
bool pe_arena_own(pe_arena *a, void *p, void (*dtor)(void *)) {
  if (!p) return false;
  if (a->n == a->cap) {
    int cap = a->cap ? 2 * a->cap : 32;
    void **ptrs = realloc(a->ptrs, (size_t)cap * sizeof *ptrs);
    if (!ptrs) goto fail;
    a->ptrs = ptrs;
    void (**d)(void *) = realloc(a->dtors, (size_t)cap * sizeof *d);
    if (!d) goto fail;
    a->dtors = d;
    a->cap = cap;
  }
  a->ptrs[a->n] = p;
  a->dtors[a->n] = dtor;
  a->n++;
  return true;
fail:
  if (dtor)
    dtor(p);
  else
    free(p);
  return false;
}

void *pe_arena_alloc(pe_arena *a, size_t size) {
  void *p = calloc(1, size ? size : 1);
  return pe_arena_own(a, p, NULL) ? p : NULL;
}

char *pe_arena_strdup(pe_arena *a, const char *s) {
  char *p = strdup(s ? s : "");
  return pe_arena_own(a, p, NULL) ? p : NULL;
}

void pe_arena_free(pe_arena *a) {
  for (int i = a->n - 1; i >= 0; i--) {
    if (a->dtors[i])
      a->dtors[i](a->ptrs[i]);
    else
      free(a->ptrs[i]);
  }
  free(a->ptrs);
  free(a->dtors);
  memset(a, 0, sizeof *a);
}

/* A host tensor owned by the arena (its buffer released with it). */
static void tensor_dtor(void *p) {
  pe_tensor_release(p);
  free(p);
}

/* Arena owner of a calloc'd pin: released, then freed. */
static void shm_pin_dtor(void *p) {
  pe_shm_pin_release(p);
  free(p);
}

static pe_tensor *arena_tensor(pe_arena *a) {
  pe_tensor *t = calloc(1, sizeof *t);
  return pe_arena_own(a, t, tensor_dtor) ? t : NULL;
}

#define OOM(what) pe_error(PE_ENOMEM, "%s: out of memory building the reply", what)

/* --- tensors on the wire ------------------------------------------------------ */
static const char *shape_str(const pe_shape *s, char *buf) {
  return pe_shape_str(s, buf, PE_SHAPE_STRLEN);
}

/* Check a wire tensor and make `view` hold its bytes: a view of the message
 * for inline data, an owned copy for a shm reference (release it after use;
 * arena tensors are released with the arena). With `pin`, a shm reference
 * is pinned there instead of copied and `view` gets the dtype and shape
 * only (data NULL): the caller reads the rows through the pin. */
static pe_status *tensor_from_pb(pe_server *s, const char *op, const Pe__Tensor *x, pe_tensor *view,
                                 pe_shm_pin *pin) {
  const char *name = x->name ? x->name : "";
  if (!name[0]) return pe_error(PE_EINVAL, "%s: a tensor has an empty name", op);
  if (!pe_dtype_valid((int)x->dtype))
    return pe_error(PE_EDTYPE, "%s: tensor '%.64s': dtype %d unknown", op, name, (int)x->dtype);
  if (x->n_shape > PE_MAX_DIMS)
    return pe_error(PE_ESHAPE, "%s: tensor '%.64s': %zu dims, at most %d", op, name, x->n_shape,
                    PE_MAX_DIMS);
  pe_shape shape = {.ndim = (int)x->n_shape};
  uint64_t numel = 1;
  for (size_t i = 0; i < x->n_shape; i++) {
    int64_t d = x->shape[i];
    if (d < 0 || d > ((int64_t)1 << 40))
      return pe_error(PE_ESHAPE, "%s: tensor '%.64s': dim %zu is %lld (must be 0..2^40)", op, name,
                      i, (long long)d);
    shape.d[i] = d;
    if (d && numel > UINT64_MAX / (uint64_t)d)
      return pe_error(PE_ESHAPE, "%s: tensor '%.64s': element count overflows", op, name);
    numel *= (uint64_t)d;
  }
  size_t esz = pe_dtype_size((pe_dtype)x->dtype);
  if (numel > UINT64_MAX / esz)
    return pe_error(PE_ESHAPE, "%s: tensor '%.64s': byte count overflows", op, name);
  uint64_t want = numel * esz;
  char sb[PE_SHAPE_STRLEN];
  const void *data;
  if (x->shm) {
    if (x->data.len)
      return pe_error(PE_EINVAL, "%s: tensor '%.64s' has both inline data and a shm reference", op,
                      name);
    if (x->shm->length != want)
      return pe_error(PE_ESHAPE,
                      "%s: tensor '%.64s' %s %s needs %llu bytes, shm reference has %llu", op, name,
                      pe_dtype_name((pe_dtype)x->dtype), shape_str(&shape, sb),
                      (unsigned long long)want, (unsigned long long)x->shm->length);
    if (x->shm->offset % esz)
      return pe_error(PE_EINVAL, "%s: tensor '%.64s': shm offset %llu is not a multiple of %zu", op,
                      name, (unsigned long long)x->shm->offset, esz);
    if (pin) {
      pe_tensor_view(view, (pe_dtype)x->dtype, &shape, NULL);
      return pe_status_wrap(pe_shm_pin_acquire(s->shm, x->shm->region, x->shm->offset, want, pin),
                            "%s: tensor '%.64s'", op, name);
    }
    /* A private copy: a run never reads pages the client could truncate. */
    PE_TRY(pe_tensor_resize(view, (pe_dtype)x->dtype, &shape, name));
    return pe_status_wrap(pe_shm_read(s->shm, x->shm->region, x->shm->offset, want, view->data),
                          "%s: tensor '%.64s'", op, name);
  } else {
    if (x->data.len != want)
      return pe_error(PE_ESHAPE, "%s: tensor '%.64s' %s %s needs %llu bytes, got %zu", op, name,
                      pe_dtype_name((pe_dtype)x->dtype), shape_str(&shape, sb),
                      (unsigned long long)want, x->data.len);
    data = x->data.data;
  }
  /* The executor only reads feeds; the cast drops const for the view. */
  pe_tensor_view(view, (pe_dtype)x->dtype, &shape, (void *)data);
  return NULL;
}

/* A host tensor into a wire tensor that borrows its bytes (t must outlive
 * packing: it is arena-owned). */
static Pe__Tensor *tensor_to_pb(pe_arena *a, const char *name, const pe_tensor *t) {
  Pe__Tensor *x = pe_arena_alloc(a, sizeof *x);
  if (!x) return NULL;
  pe__tensor__init(x);
  x->name = pe_arena_strdup(a, name);
  x->dtype = (Pe__DataType)t->dtype;
  x->n_shape = (size_t)t->shape.ndim;
  x->shape = pe_arena_alloc(a, sizeof(int64_t) * (x->n_shape ? x->n_shape : 1));
  if (!x->name || !x->shape) return NULL;
  for (int i = 0; i < t->shape.ndim; i++) x->shape[i] = t->shape.d[i];
  x->data.len = pe_tensor_bytes(t);
  x->data.data = t->data;
  return x;
}

/* --- handlers ------------------------------------------------------------------ */
typedef struct ctx {
  pe_server *s;
  const Pe__Request *rq;
  Pe__Reply *rep;
  pe_arena *a;
  double received;
} ctx;

static pe_status *h_ping(ctx *c) {
  return NULL;
}

static pe_status *h_status(ctx *c) {
  Pe__StatusReply *st = pe_arena_alloc(c->a, sizeof *st);
  if (!st) return OOM("status");
  pe__status_reply__init(st);
  PE_TRY(pe_status_fill(c->s, st, c->a));
  c->rep->body_case = PE__REPLY__BODY_STATUS;
  c->rep->status = st;
  return NULL;
}

static pe_status *h_register(ctx *c) {
  const Pe__RegisterRequest *rq = c->rq->register_;
  pe_srv_program *p;
  bool existed;
  PE_TRY(pe_registry_register(c->s->reg, c->rq->client_id, rq, &p, &existed));
  pe_status *st = NULL;
  Pe__RegisterReply *r = pe_arena_alloc(c->a, sizeof *r);
  if (!r) st = OOM("register");
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
    PE_LOGI("register client=%016llx model=%s handle=0x%016llx %s (%d params, %d feeds)",
            (unsigned long long)c->rq->client_id, p->model->name, (unsigned long long)p->handle,
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

static pe_status *h_init(ctx *c) {
  const Pe__InitRequest *rq = c->rq->init;
  pe_srv_program *p;
  PE_TRY(pe_status_wrap(pe_registry_acquire(c->s->reg, rq->handle, &p), "init"));
  pe_srv_model *m = p->model;
  pe_status *st = NULL;
  bool ran = false;
  /* init_mu: two clients initialising one model run the startup once. */
  pthread_mutex_lock(&m->init_mu);
  bool missing = false;
  for (int i = 0; i < p->n_params && !missing; i++)
    missing = !pe_strmap_has(&m->initialized, p->params[i].name);
  if ((missing || rq->force) && p->startup) {
    pe_run_opts ro = {.sync = p->sync};
    st = pe_status_wrap(rq->force ? pe_par_exec_run(p->startup, NULL, 0, NULL, 0, NULL, &ro, NULL)
                                  : startup_keeping(p, &ro),
                        "init: startup of model '%s'", m->name);
    if (!st) {
      for (int i = 0; i < p->n_params; i++)
        if (!pe_strmap_put(&m->initialized, p->params[i].name, (void *)1)) st = OOM("init");
      ran = true;
    }
  }
  pthread_mutex_unlock(&m->init_mu);
  if (!st) {
    Pe__InitReply *r = pe_arena_alloc(c->a, sizeof *r);
    if (!r)
      st = OOM("init");
    else {
      pe__init_reply__init(r);
      r->initialized = ran;
      c->rep->body_case = PE__REPLY__BODY_INIT;
      c->rep->init = r;
    }
  }
  pe_registry_release(c->s->reg, p);
  return st;
}

static pe_var_info *find_info(pe_var_info *v, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(v[i].name, name)) return &v[i];
  return NULL;
}

static void feed_names(const pe_srv_program *p, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < p->n_feeds && o + 2 < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", p->feeds[i].name);
}

/* A run whose request already reached the model is not applied again
 * (architecture property 6). The reply cache answers resends while it holds
 * the reply; this catches the rest: a resend after a daemon restart from a
 * checkpoint that includes the run (its origins travel in the file), or
 * after the cached reply was evicted. A client's request ids increase, so
 * any id up to the model's newest for that client has been seen. */
static pe_status *check_not_applied(ctx *c, pe_srv_program *p) {
  uint64_t client = c->rq->client_id, request = c->rq->request_id;
  pe_run_origin o;
  if (!client || !pe_model_origin(p->model->m, client, &o) || request > o.request) return NULL;
  if (request == o.request)
    return pe_error(PE_EALREADY,
                    "run: request %llu of client %016llx already reached model '%s' (%u step(s) of "
                    "it are in its parameters); a resend is not applied again",
                    (unsigned long long)request, (unsigned long long)client, p->model->name,
                    o.steps);
  return pe_error(PE_EALREADY,
                  "run: request %llu of client %016llx is older than its request %llu, which "
                  "already reached model '%s'; a resend is not applied again",
                  (unsigned long long)request, (unsigned long long)client,
                  (unsigned long long)o.request, p->model->name);
}

static pe_status *run_program(ctx *c, pe_srv_program *p) {
  const Pe__RunRequest *rq = c->rq->run;
  pe_server *s = c->s;
  PE_TRY(check_not_applied(c, p));
  uint32_t steps = rq->steps ? rq->steps : 1;
  if (steps > PE_MAX_STEPS)
    return pe_error(PE_EINVAL, "run: steps %u exceeds %u", steps, PE_MAX_STEPS);
  /* batches > 1: the feeds hold that many mini-batches (run_batches.h). */
  uint32_t batches = rq->batches;
  if (batches > PE_MAX_STEPS)
    return pe_error(PE_EINVAL, "run: batches %u exceeds %u", batches, PE_MAX_STEPS);
  if (batches > 1 && rq->steps && rq->steps != batches)
    return pe_error(PE_EINVAL, "run: steps %u with batches %u: steps must be 0 or %u", rq->steps,
                    batches, batches);
  if (rq->n_feeds > PE_MAX_FEEDS || rq->n_fetch > PE_MAX_FETCH)
    return pe_error(PE_EINVAL, "run: %zu feeds / %zu fetches exceed %d / %d", rq->n_feeds,
                    rq->n_fetch, PE_MAX_FEEDS, PE_MAX_FETCH);
  char names[512];
  /* Feeds: every one declared, no duplicates, shapes compatible; every
   * declared feed present. */
  int nf = (int)rq->n_feeds;
  pe_feed *feeds = pe_arena_alloc(c->a, sizeof *feeds * (size_t)(nf ? nf : 1));
  pe_shm_pin **pins = pe_arena_alloc(c->a, sizeof *pins * (size_t)(nf ? nf : 1));
  if (!feeds || !pins) return OOM("run"); /* both zeroed */
  pe_status *st = NULL;
  for (int i = 0; i < nf && !st; i++) {
    const Pe__Tensor *x = rq->feeds[i];
    const char *name = x->name ? x->name : "";
    pe_var_info *decl = find_info(p->feeds, p->n_feeds, name);
    if (!decl) {
      feed_names(p, names, sizeof names);
      st = pe_error(PE_EUNKNOWN_VAR,
                    "run: feed '%.64s' is not a feed variable of program 0x%016llx (feeds: %s)",
                    name, (unsigned long long)p->handle, names);
      break;
    }
    for (int j = 0; j < i; j++)
      if (!strcmp(feeds[j].name, name)) {
        st = pe_error(PE_EINVAL, "run: feed '%.64s' given twice", name);
        break;
      }
    if (st) break;
    pe_tensor *t = arena_tensor(c->a);
    if (!t) {
      st = OOM("run");
      break;
    }
    /* Several mini-batches from shared memory: each is copied from the
     * region when its step needs it (run_batches.c), not the whole feed
     * up front. */
    if (batches > 1 && x->shm) {
      pins[i] = calloc(1, sizeof *pins[i]);
      if (!pe_arena_own(c->a, pins[i], shm_pin_dtor)) {
        pins[i] = NULL;
        st = OOM("run");
        break;
      }
    }
    st = tensor_from_pb(s, "run feed", x, t, pins[i]);
    if (st) break;
    char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
    if (t->dtype != decl->dtype) {
      st = pe_error(PE_EDTYPE, "run: feed '%s' is %s %s, the program declares %s %s", name,
                    pe_dtype_name(t->dtype), shape_str(&t->shape, a), pe_dtype_name(decl->dtype),
                    shape_str(&decl->shape, b));
      break;
    }
    /* With batches, each mini-batch must fit the declaration. */
    pe_shape per = t->shape;
    if (batches > 1 && per.ndim && per.d[0] % batches == 0) per.d[0] /= batches;
    if (t->shape.ndim != decl->shape.ndim || !pe_shape_compatible(&per, &decl->shape)) {
      st = pe_error(PE_ESHAPE, "run: feed '%s' has shape %s, the program declares %s", name,
                    shape_str(&t->shape, a), shape_str(&decl->shape, b));
      break;
    }
    feeds[i].name = decl->name;
    feeds[i].t = t;
  }
  for (int i = 0; i < p->n_feeds && !st; i++) {
    bool given = false;
    for (int j = 0; j < nf && !given; j++) given = !strcmp(feeds[j].name, p->feeds[i].name);
    if (!given) {
      char b[PE_SHAPE_STRLEN];
      st = pe_error(PE_EMISSING_FEED, "run: feed '%s' (%s %s) of program 0x%016llx is missing",
                    p->feeds[i].name, pe_dtype_name(p->feeds[i].dtype),
                    shape_str(&p->feeds[i].shape, b), (unsigned long long)p->handle);
    }
  }
  int nx = (int)rq->n_fetch;
  pe_tensor *fetched = NULL;
  for (int i = 0; i < nx && !st; i++)
    if (!rq->fetch[i] || !rq->fetch[i][0])
      st = pe_error(PE_EINVAL, "run: fetch name %d is empty", i);
  if (!st && nx) {
    fetched = pe_arena_alloc(c->a, sizeof *fetched * (size_t)nx);
    /* Zeroed (empty) tensors; their buffers move to arena owners below. */
    if (!fetched) st = OOM("run");
  }
  pe_tensor **owned = NULL;
  if (!st && nx) {
    owned = pe_arena_alloc(c->a, sizeof *owned * (size_t)nx);
    if (!owned) st = OOM("run");
  }
  pe_timeline *tl = NULL;
  bool trace = rq->options && rq->options->trace;
  if (!st && trace) st = pe_timeline_new(256, 1 << 16, &tl);
  double t0 = pe_now_s();
  uint32_t done = 0;
  pe_run_stats stats = {0};
  if (!st) {
    pe_run_opts ro = {.sync = p->sync,
                      .origin = {.client = c->rq->client_id, .request = c->rq->request_id},
                      .priority = rq->options ? rq->options->priority : 0,
                      .timeline = tl};
    double deadline =
        rq->options && rq->options->timeout_ms ? t0 + rq->options->timeout_ms / 1e3 : 0;
    pe_run_guard guard = {.s = s, .p = p, .client = c->rq->client_id};
    if (batches > 1) {
      pe_run_batches rb = {.feeds = feeds,
                           .pins = (const pe_shm_pin *const *)pins,
                           .n_feeds = nf,
                           .batches = batches,
                           .fetch = (const char *const *)rq->fetch,
                           .n_fetch = nx,
                           .opts = &ro,
                           .deadline = deadline,
                           .timeout_ms = rq->options ? rq->options->timeout_ms : 0,
                           .guard = &guard};
      st = pe_srv_run_batches(s->rt, p, &rb, fetched, &done);
    } else {
      for (done = 0; done < steps && !st; done++) {
        if (deadline && done > 0 && pe_now_s() > deadline) {
          st = pe_error(PE_EIO, "run: timeout of %u ms reached after %u of %u steps",
                        rq->options->timeout_ms, done, steps);
          break;
        }
        if (done > 0 && (st = pe_run_guard_check(&guard, done, steps))) break;
        st = pe_par_exec_run(p->exec, feeds, nf, (const char *const *)rq->fetch, nx, fetched, &ro,
                             &stats);
      }
    }
    atomic_fetch_add(&s->runs_total, done);
  }
  double t1 = pe_now_s();
  /* Fetched buffers belong to the arena from here on. */
  for (int i = 0; fetched && i < nx; i++) {
    pe_tensor *t = arena_tensor(c->a);
    if (t) {
      *t = fetched[i];
      if (owned) owned[i] = t; /* NULL only when st is already set */
    } else {
      pe_tensor_release(&fetched[i]);
      if (!st) st = OOM("run");
    }
  }
  if (st) {
    pe_timeline_free(tl);
    return st;
  }
  Pe__RunReply *r = pe_arena_alloc(c->a, sizeof *r);
  if (!r) st = OOM("run");
  if (!st) {
    pe__run_reply__init(r);
    r->fetched = pe_arena_alloc(c->a, sizeof *r->fetched * (size_t)(nx ? nx : 1));
    if (!r->fetched) st = OOM("run");
  }
  for (int i = 0; i < nx && !st; i++) {
    r->fetched[i] = tensor_to_pb(c->a, rq->fetch[i], owned[i]);
    if (!r->fetched[i]) st = OOM("run");
    r->n_fetched++;
  }
  if (!st) {
    r->run_ms = (t1 - t0) * 1e3;
    r->queue_ms = (t0 - c->received) * 1e3;
    r->steps = done;
    if (tl) {
      char *json = NULL;
      size_t len = 0;
      st = pe_timeline_json(tl, &json, &len);
      if (!st && pe_arena_own(c->a, json, NULL)) {
        r->trace_json.data = (uint8_t *)json;
        r->trace_json.len = len;
      }
    }
    c->rep->body_case = PE__REPLY__BODY_RUN;
    c->rep->run = r;
  }
  pe_timeline_free(tl);
  return st;
}

static pe_status *h_run(ctx *c) {
  pe_srv_program *p;
  PE_TRY(pe_status_wrap(pe_registry_acquire(c->s->reg, c->rq->run->handle, &p), "run"));
  atomic_fetch_add(&c->s->runs, 1);
  pe_status *st = run_program(c, p);
  atomic_fetch_sub(&c->s->runs, 1);
  pe_registry_release(c->s->reg, p);
  return st;
}

static pe_status *h_get_params(ctx *c) {
  const Pe__ParamsRequest *rq = c->rq->get_params;
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
        st = pe_error(PE_EUNKNOWN_VAR, "get_params: model '%s' has no parameter '%.64s'", m->name,
                      names[i]);
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
  for (int i = 0; !st && i < n; i++) {
    pe_tensor *t = arena_tensor(c->a);
    if (!t) {
      st = OOM("get_params");
      break;
    }
    *t = got[i]; /* moved into the arena */
    pe_tensor_init(&got[i]);
    r->values[i] = tensor_to_pb(c->a, names[i], t);
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

static pe_status *h_set_params(ctx *c) {
  const Pe__ParamsRequest *rq = c->rq->set_params;
  pe_srv_model *m;
  PE_TRY(pe_status_wrap(pe_registry_model_acquire(c->s->reg, rq->model, &m), "set_params"));
  int n = (int)rq->n_values;
  pe_status *st = NULL;
  pe_tensor *views = calloc((size_t)(n ? n : 1), sizeof *views);
  const char **names = calloc((size_t)(n ? n : 1), sizeof *names);
  if (!views || !names) st = OOM("set_params");
  /* Check every value before setting any. */
  for (int i = 0; !st && i < n; i++) {
    st = tensor_from_pb(c->s, "set_params", rq->values[i], &views[i], NULL);
    names[i] = rq->values[i]->name;
  }
  for (int i = 0; !st && i < n; i++) {
    if (!names[i][0]) st = pe_error(PE_EINVAL, "value %d has an empty name", i);
    for (int j = 0; !st && j < i; j++)
      if (!strcmp(names[i], names[j])) st = pe_error(PE_EINVAL, "'%.64s' given twice", names[i]);
  }
  if (!st) st = pe_srv_model_claim_values(m, names, views, n);
  if (!st) st = pe_model_set_many(m->m, names, views, n, NULL); /* no run sees half of it */
  if (!st) pe_model_mark_initialized(m, names, n);
  for (int i = 0; views && i < n; i++) pe_tensor_release(&views[i]);
  free(views);
  free(names);
  pe_registry_model_release(c->s->reg, m);
  return st ? pe_status_wrap(st, "set_params of model '%s'", rq->model) : NULL;
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
  PE_LOGI("session %016llx closed by its client: %d program(s) given up",
          (unsigned long long)client, programs);
  return NULL;
}

static pe_status *h_register_shm(ctx *c) {
  const Pe__ShmRequest *rq = c->rq->register_shm;
  uint64_t id;
  PE_TRY(pe_shm_register(c->s->shm, c->rq->client_id, rq->name ? rq->name : "", rq->size, &id));
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
typedef struct handler_row {
  Pe__Request__BodyCase kind;
  const char *name;
  pe_status *(*fn)(ctx *c);
  bool ends_session; /* not touched: that would open the session again */
} handler_row;

static const handler_row handlers[] = {
    {PE__REQUEST__BODY_PING, "ping", h_ping},
    {PE__REQUEST__BODY_REGISTER, "register", h_register},
    {PE__REQUEST__BODY_INIT, "init", h_init},
    {PE__REQUEST__BODY_RUN, "run", h_run},
    {PE__REQUEST__BODY_GET_PARAMS, "get_params", h_get_params},
    {PE__REQUEST__BODY_SET_PARAMS, "set_params", h_set_params},
    {PE__REQUEST__BODY_SAVE, "save", h_save},
    {PE__REQUEST__BODY_LOAD, "load", h_load},
    {PE__REQUEST__BODY_DEREGISTER, "deregister", h_deregister},
    {PE__REQUEST__BODY_STATUS, "status", h_status},
    {PE__REQUEST__BODY_REGISTER_SHM, "register_shm", h_register_shm},
    {PE__REQUEST__BODY_UNREGISTER_SHM, "unregister_shm", h_unregister_shm},
    {PE__REQUEST__BODY_CLOSE, "close", h_close, true},
    {PE__REQUEST__BODY_DROP_MODEL, "drop_model", h_drop_model},
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

void pe_dispatch(pe_server *s, const Pe__Request *rq, double received, Pe__Reply *rep,
                 pe_arena *a) {
  rep->client_id = rq->client_id;
  rep->request_id = rq->request_id;
  ctx c = {s, rq, rep, a, received};
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
    rep->body_case = PE__REPLY__BODY__NOT_SET;
    pe_status_free(st);
  } else {
    rep->code = 0;
    rep->message = (char *)"ok";
  }
}
