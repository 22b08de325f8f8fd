/* The Run request (run/request.h): checks, the step loop or the batches,
 * the reply. */
#include "server/run/request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/clock.h"
#include "core/names_unique.h"
#include "server/client_tag.h"
#include "server/job/join.h"
#include "server/registry/registry.h"
#include "server/run/batches.h"
#include "server/run/cancel.h"
#include "server/run/finite.h"
#include "server/run/memory.h"
#include "server/shm.h"
#include "server/wire_tensor.h"

/* Requests that would make the daemon loop for hours are refused up front
 * (steps: config [limits] max_steps_per_request, pe_server_limits). */
#define PE_MAX_FETCH 1024
#define PE_MAX_FEEDS 1024

#define OOM PE_REPLY_OOM

/* Arena owner of a calloc'd pin: released, then freed. */
static void shm_pin_dtor(void *p) {
  pe_shm_pin_release(p);
  free(p);
}

static const char *shape_str(const pe_shape *s, char *buf) {
  return pe_shape_str(s, buf, PE_SHAPE_STRLEN);
}

typedef pe_request_ctx ctx;

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
 * (a resend is never applied twice). The reply cache answers resends while it holds
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
                    "run: request %llu of client %s already reached model '%s' (%u step(s) of "
                    "it are in its parameters); a resend is not applied again",
                    (unsigned long long)request, pe_client_tag(client).s, p->model->name, o.steps);
  return pe_error(PE_EALREADY,
                  "run: request %llu of client %s is older than its request %llu, which "
                  "already reached model '%s'; a resend is not applied again",
                  (unsigned long long)request, pe_client_tag(client).s,
                  (unsigned long long)o.request, p->model->name);
}

/* A run that failed after `done` steps were applied (a timeout, a cancel,
 * step k of several failing) says how many: its error reply keeps a
 * RunReply with the steps and times, and no fetches (pe_dispatch keeps a
 * failed run's body). Best effort: without memory the message says it. */
static void partial_reply(ctx *c, uint32_t done, double t0, double t1) {
  if (!done) return;
  Pe__RunReply *r = pe_arena_alloc(c->a, sizeof *r);
  if (!r) return;
  pe__run_reply__init(r);
  r->steps = done;
  r->run_ms = (t1 - t0) * 1e3;
  r->queue_ms = (t0 - c->received) * 1e3;
  c->rep->body_case = PE__REPLY__BODY_RUN;
  c->rep->run = r;
}

/* The error of a run that stopped after `done` steps (a timeout, a cancel,
 * step k failing) says that those stay applied, as they would have as
 * separate requests. Consumes st. */
static pe_status *applied_note(pe_status *st, uint32_t done) {
  char steps[48];
  if (done == 1)
    snprintf(steps, sizeof steps, "step 0 stays");
  else
    snprintf(steps, sizeof steps, "steps 0..%u stay", done - 1);
  pe_status *out = pe_error(pe_status_code(st), "%s; %s applied", pe_status_msg(st), steps);
  pe_status_free(st);
  return out;
}

/* What the phases of one run share (run_program). */
typedef struct run_state {
  ctx *c;
  pe_srv_program *p;
  pe_run_entry *entry;
  uint32_t steps, batches; /* batches > 1: the feeds hold that many mini-batches (run/batches.h) */
  pe_limits lim;
  int nf, nx;           /* the request's feeds and fetches */
  pe_feed *feeds;       /* nf, in the request's order */
  pe_shm_pin **pins;    /* nf; non-NULL: a feed whose batches are read from shared memory */
  const int64_t **rows; /* nf; non-NULL: that pinned feed's row indices (ShmRef.rows) */
  pe_run_memory mem;    /* the run's temporaries (run/memory.h) */
  const char *loss;     /* the loss checked each step (run/finite.h); NULL: none */
  const char **fetch;   /* the request's fetches, and the loss (li) when it did not ask for it */
  int n_all, li;        /* fetch's length; the loss's index in it (-1: none) */
  pe_tensor *fetched;   /* n_all values, moved to owned (arena tensors) after the run */
  pe_tensor **owned;
  pe_timeline *tl; /* options.trace */
  double t0, t1;   /* the run's start and end (pe_now_s) */
  uint32_t done;   /* the steps applied */
} run_state;

/* Checks of the request alone: steps, batches, counts and names against
 * their caps, before anything is read. */
static pe_status *check_request(run_state *r) {
  const Pe__RunRequest *rq = r->c->rq->run;
  uint32_t steps = r->steps = rq->steps ? rq->steps : 1;
  uint32_t batches = r->batches = rq->batches;
  r->lim = pe_server_limits(r->c->s);
  uint32_t max = r->lim.max_steps;
  if (steps > max || batches > max)
    return pe_error(PE_EINVAL,
                    "run: %s %u exceeds the cap of %u steps per request (config [limits] "
                    "max_steps_per_request); send fewer per request",
                    steps > max ? "steps" : "batches", steps > max ? steps : batches, max);
  if (batches > 1 && rq->steps && rq->steps != batches)
    return pe_error(PE_EINVAL, "run: steps %u with batches %u: steps must be 0 or %u", rq->steps,
                    batches, batches);
  if (rq->n_feeds > PE_MAX_FEEDS || rq->n_fetch > PE_MAX_FETCH)
    return pe_error(PE_EINVAL, "run: %zu feeds / %zu fetches exceed %d / %d", rq->n_feeds,
                    rq->n_fetch, PE_MAX_FEEDS, PE_MAX_FETCH);
  /* Each name once: a repeated fetch would copy its value (every batch's)
   * once more, a repeated feed would be ambiguous. */
  PE_TRY(pe_status_wrap(pe_names_unique(rq->feeds, rq->n_feeds, pe_wire_tensor_name_at, "feed"),
                        "run"));
  PE_TRY(pe_status_wrap(pe_names_unique(rq->fetch, rq->n_fetch, pe_name_at_str, "fetch"), "run"));
  r->nf = (int)rq->n_feeds;
  r->nx = (int)rq->n_fetch;
  return NULL;
}

/* A feed's value t fits its declaration decl: the dtype, at least one
 * element, the shape (with batches, each mini-batch's). */
static pe_status *check_feed_fits(const char *name, const pe_tensor *t, const pe_var_info *decl,
                                  uint32_t batches) {
  char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
  if (t->dtype != decl->dtype)
    return pe_error(PE_EDTYPE, "run: feed '%s' is %s %s, the program declares %s %s", name,
                    pe_dtype_name(t->dtype), shape_str(&t->shape, a), pe_dtype_name(decl->dtype),
                    shape_str(&decl->shape, b));
  /* No rows (or another dim 0, where the declaration says -1): the
   * kernels would compute nothing and the fetches would be what the
   * buffers held from the step before; refused alike on every place. */
  int empty = -1;
  for (int d = 0; d < t->shape.ndim && empty < 0; d++)
    if (t->shape.d[d] == 0) empty = d;
  if (empty >= 0)
    return pe_error(PE_ESHAPE, "run: feed '%s' has shape %s: %s; a run needs at least one %s", name,
                    shape_str(&t->shape, a), empty ? "a dim of 0, no elements" : "an empty batch",
                    empty ? "element" : "row");
  /* With batches, each mini-batch must fit the declaration. */
  pe_shape per = t->shape;
  if (batches > 1 && per.ndim && per.d[0] % batches == 0) per.d[0] /= batches;
  if (t->shape.ndim != decl->shape.ndim || !pe_shape_compatible(&per, &decl->shape))
    return pe_error(PE_ESHAPE, "run: feed '%s' has shape %s, the program declares %s", name,
                    shape_str(&t->shape, a), shape_str(&decl->shape, b));
  return NULL;
}

/* Feed i of the request: declared by the program, read (from the message
 * or shared memory) into an arena tensor, fitting its declaration. */
static pe_status *take_feed(run_state *r, int i) {
  ctx *c = r->c;
  const Pe__Tensor *x = c->rq->run->feeds[i];
  const char *name = x->name ? x->name : "";
  pe_var_info *decl = find_info(r->p->feeds, r->p->n_feeds, name);
  if (!decl) {
    char names[512];
    feed_names(r->p, names, sizeof names);
    return pe_error(PE_EUNKNOWN_VAR,
                    "run: feed '%.64s' is not a feed variable of program 0x%016llx (feeds: %s)",
                    name, (unsigned long long)r->p->handle, names);
  }
  pe_tensor *t = pe_arena_tensor(c->a);
  if (!t) return OOM("run");
  /* Several mini-batches from shared memory: each is copied from the
   * region when its step needs it (run/batches.c), not the whole feed
   * up front. */
  if (r->batches > 1 && x->shm) {
    r->pins[i] = calloc(1, sizeof *r->pins[i]);
    if (!pe_arena_own(c->a, r->pins[i], shm_pin_dtor)) {
      r->pins[i] = NULL;
      return OOM("run");
    }
  }
  PE_TRY(pe_wire_tensor_in(c->s, c->rq->client_id, "run feed", x, t, r->pins[i]));
  if (r->pins[i] && x->shm->n_rows) r->rows[i] = x->shm->rows;
  PE_TRY(check_feed_fits(name, t, decl, r->batches));
  r->feeds[i].name = decl->name;
  r->feeds[i].t = t;
  return NULL;
}

/* Feeds: every one declared, no duplicates, shapes compatible; every
 * declared feed present. */
static pe_status *take_feeds(run_state *r) {
  int nf = r->nf;
  r->feeds = pe_arena_alloc(r->c->a, sizeof *r->feeds * (size_t)(nf ? nf : 1));
  r->pins = pe_arena_alloc(r->c->a, sizeof *r->pins * (size_t)(nf ? nf : 1));
  r->rows = pe_arena_alloc(r->c->a, sizeof *r->rows * (size_t)(nf ? nf : 1));
  if (!r->feeds || !r->pins || !r->rows) return OOM("run"); /* zeroed */
  for (int i = 0; i < nf; i++) PE_TRY(take_feed(r, i));
  const pe_srv_program *p = r->p;
  for (int i = 0; i < p->n_feeds; i++) {
    bool given = false;
    for (int j = 0; j < nf && !given; j++) given = !strcmp(r->feeds[j].name, p->feeds[i].name);
    if (!given) {
      char b[PE_SHAPE_STRLEN];
      return pe_error(PE_EMISSING_FEED, "run: feed '%s' (%s %s) of program 0x%016llx is missing",
                      p->feeds[i].name, pe_dtype_name(p->feeds[i].dtype),
                      shape_str(&p->feeds[i].shape, b), (unsigned long long)p->handle);
    }
  }
  return NULL;
}

/* The step's temporaries, reserved from the memory budgets for its batch
 * (run/memory.h); may wait for memory: queue time. */
static pe_status *reserve_memory(run_state *r) {
  const Pe__RunRequest *rq = r->c->rq->run;
  /* The step's batch: with batches, one mini-batch's rows. */
  int64_t rows = 0;
  for (int i = 0; i < r->nf; i++)
    if (r->feeds[i].t->shape.ndim && r->feeds[i].t->shape.d[0] > rows)
      rows = r->feeds[i].t->shape.d[0];
  if (r->batches > 1) rows = (rows + r->batches - 1) / r->batches;
  r->mem = (pe_run_memory){.rows = rows,
                           .client = r->c->rq->client_id,
                           .steps = r->batches > 1 ? r->batches : r->steps,
                           .timeout_ms = rq->options ? rq->options->timeout_ms : 0};
  return pe_run_memory_begin(r->c->s, r->p, &r->mem);
}

/* The names to fetch (the request's, and the loss of a training run that
 * checks it: run/finite.h) and the tensors that receive them. */
static pe_status *prepare_fetches(run_state *r) {
  ctx *c = r->c;
  const Pe__RunRequest *rq = c->rq->run;
  int nx = r->nx;
  for (int i = 0; i < nx; i++)
    if (!rq->fetch[i] || !rq->fetch[i][0])
      return pe_error(PE_EINVAL, "run: fetch name %d is empty", i);
  /* A training run checks its loss each step (run/finite.h): fetched as
   * fetch li, one past the client's when it did not ask for it (n_all). */
  const char *loss = r->loss = pe_run_finite_loss(r->p, r->lim.check_finite);
  r->fetch = (const char **)rq->fetch;
  r->n_all = nx;
  for (int i = 0; loss && i < nx && r->li < 0; i++)
    if (!strcmp(rq->fetch[i], loss)) r->li = i;
  if (loss && r->li < 0) {
    r->fetch = pe_arena_alloc(c->a, sizeof *r->fetch * (size_t)(nx + 1));
    if (!r->fetch) return OOM("run");
    for (int i = 0; i < nx; i++) r->fetch[i] = rq->fetch[i];
    r->fetch[r->li = r->n_all++] = loss;
  }
  if (!r->n_all) return NULL;
  r->fetched = pe_arena_alloc(c->a, sizeof *r->fetched * (size_t)r->n_all);
  /* Zeroed (empty) tensors; their buffers move to arena owners below. */
  if (!r->fetched) return OOM("run");
  r->owned = pe_arena_alloc(c->a, sizeof *r->owned * (size_t)r->n_all);
  if (!r->owned) return OOM("run");
  return NULL;
}

/* The steps one at a time, each after the deadline and cancel checks
 * (run/cancel.h), each loss checked (run/finite.h); r->done counts those
 * applied (a failed step applies nothing). */
static pe_status *run_steps(run_state *r, const pe_run_opts *ro, double deadline,
                            pe_run_guard *guard) {
  const Pe__RunRequest *rq = r->c->rq->run;
  uint32_t steps = r->steps;
  pe_run_stats stats = {0};
  pe_status *st = NULL;
  for (r->done = 0; r->done < steps; r->done++) {
    uint32_t done = r->done;
    if (deadline && done > 0 && pe_now_s() > deadline)
      return pe_error(PE_EDEADLINE, "run: timeout of %u ms reached after %u of %u steps",
                      rq->options->timeout_ms, done, steps);
    if (done > 0 && (st = pe_run_guard_check(guard, done, steps))) return st;
    st = pe_par_exec_run(r->p->exec, r->feeds, r->nf, r->fetch, r->n_all, r->fetched, ro, &stats);
    if (st && (steps > 1 || ro->check_nan_inf)) st = pe_status_wrap(st, "step %u", done);
    if (st) return st;
    atomic_store(&r->entry->done, done + 1);
    /* A non-finite loss: this step was applied, and stops the run. */
    if (r->li >= 0 && (st = pe_run_finite_check(r->p, r->loss, &r->fetched[r->li], done))) {
      r->done++;
      return st;
    }
  }
  return NULL;
}

/* The run itself: its steps, or its batches (run/batches.h), with the
 * request's options; counted in runs_total, an error saying what stays
 * applied. */
static pe_status *execute(run_state *r) {
  ctx *c = r->c;
  const Pe__RunRequest *rq = c->rq->run;
  pe_server *s = c->s;
  pe_run_opts ro = {.sync = r->p->sync,
                    .origin = {.client = c->rq->client_id, .request = c->rq->request_id},
                    .priority = rq->options ? rq->options->priority : 0,
                    .timeline = r->tl,
                    .check_nan_inf = rq->options && rq->options->check_nan_inf};
  double deadline =
      rq->options && rq->options->timeout_ms ? r->t0 + rq->options->timeout_ms / 1e3 : 0;
  pe_run_guard guard = {.s = s, .p = r->p, .client = c->rq->client_id};
  pe_status *st;
  if (r->batches > 1) {
    pe_run_batches rb = {.feeds = r->feeds,
                         .pins = (const pe_shm_pin *const *)r->pins,
                         .rows = r->rows,
                         .n_feeds = r->nf,
                         .batches = r->batches,
                         .fetch = r->fetch,
                         .n_fetch = r->n_all,
                         .loss_index = r->li,
                         .opts = &ro,
                         .deadline = deadline,
                         .timeout_ms = rq->options ? rq->options->timeout_ms : 0,
                         .guard = &guard,
                         .progress = &r->entry->done};
    st = pe_srv_run_batches(s->rt, r->p, &rb, r->fetched, &r->done);
  } else {
    st = run_steps(r, &ro, deadline, &guard);
  }
  atomic_fetch_add(&s->runs_total, r->done);
  if (st && r->done) st = applied_note(st, r->done);
  return st;
}

/* Fetched buffers belong to the arena from here on (also after a failed
 * run); returns st, or the out of memory that left one without owner. */
static pe_status *own_fetched(run_state *r, pe_status *st) {
  for (int i = 0; r->fetched && i < r->n_all; i++) {
    pe_tensor *t = pe_arena_tensor(r->c->a);
    if (t) {
      *t = r->fetched[i];
      if (r->owned) r->owned[i] = t; /* NULL only when st is already set */
    } else {
      pe_tensor_release(&r->fetched[i]);
      if (!st) st = OOM("run");
    }
  }
  return st;
}

/* The RunReply of a run that succeeded: the request's fetches (not an
 * added loss), the times, the steps and the trace. */
static pe_status *fill_reply(run_state *r) {
  ctx *c = r->c;
  const Pe__RunRequest *rq = c->rq->run;
  int nx = r->nx;
  Pe__RunReply *rep = pe_arena_alloc(c->a, sizeof *rep);
  if (!rep) return OOM("run");
  pe__run_reply__init(rep);
  rep->fetched = pe_arena_alloc(c->a, sizeof *rep->fetched * (size_t)(nx ? nx : 1));
  if (!rep->fetched) return OOM("run");
  for (int i = 0; i < nx; i++) {
    rep->fetched[i] = pe_wire_tensor_out(c->a, rq->fetch[i], r->owned[i]);
    if (!rep->fetched[i]) return OOM("run");
    rep->n_fetched++;
  }
  rep->run_ms = (r->t1 - r->t0) * 1e3;
  rep->queue_ms = (r->t0 - c->received) * 1e3;
  rep->steps = r->done;
  pe_status *st = NULL;
  if (r->tl) {
    char *json = NULL;
    size_t len = 0;
    st = pe_timeline_json(r->tl, &json, &len);
    if (!st && pe_arena_own(c->a, json, NULL)) {
      rep->trace_json.data = (uint8_t *)json;
      rep->trace_json.len = len;
    }
  }
  c->rep->body_case = PE__REPLY__BODY_RUN;
  c->rep->run = rep;
  return st;
}

/* Phases: the checks, the feeds, the memory, the fetches, the run, the
 * reply; a failed run still owns its fetched buffers and says how many
 * steps it applied (partial_reply). */
static pe_status *run_program(ctx *c, pe_srv_program *p, pe_run_entry *entry) {
  PE_TRY(check_not_applied(c, p));
  PE_TRY(pe_srv_job_check_formed(p));
  run_state r = {.c = c, .p = p, .entry = entry, .li = -1};
  PE_TRY(check_request(&r));
  pe_status *st = take_feeds(&r);
  if (!st) st = reserve_memory(&r);
  if (!st) st = prepare_fetches(&r);
  const Pe__RunRequest *rq = c->rq->run;
  if (!st && rq->options && rq->options->trace) st = pe_timeline_new(256, 1 << 16, &r.tl);
  r.t0 = pe_now_s();
  if (!st) st = execute(&r);
  pe_run_memory_end(c->s, p, &r.mem);
  r.t1 = pe_now_s();
  st = own_fetched(&r, st);
  if (!st)
    st = fill_reply(&r);
  else
    partial_reply(c, r.done, r.t0, r.t1);
  pe_timeline_free(r.tl);
  return st;
}

pe_status *pe_run_request(pe_request_ctx *c) {
  const Pe__RunRequest *rq = c->rq->run;
  pe_srv_program *p;
  PE_TRY(pe_status_wrap(pe_registry_acquire(c->s->reg, rq->handle, &p), "run"));
  /* Listed for Status while the program is held (run/table.h). */
  pe_run_entry e = {.client = c->rq->client_id,
                    .handle = p->handle,
                    .model = p->model->name,
                    .total = rq->batches > 1 ? rq->batches
                             : rq->steps     ? rq->steps
                                             : 1,
                    .start = pe_now_s()};
  pe_run_table_add(&c->s->runs, &e);
  /* Started: a close or deregister that its client sent after it now
   * cancels it, rather than leave it no program (lanes.h). */
  pe_lanes_started();
  pe_status *st = run_program(c, p, &e);
  pe_run_table_remove(&c->s->runs, &e);
  pe_registry_release(c->s->reg, p);
  return st;
}
