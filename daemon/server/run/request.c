/* The Run request (run/request.h): checks, the step loop or the batches,
 * the reply. */
#include "server/run/request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/names_unique.h"
#include "server/client_tag.h"
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

static pe_status *run_program(ctx *c, pe_srv_program *p, pe_run_entry *entry) {
  const Pe__RunRequest *rq = c->rq->run;
  pe_server *s = c->s;
  PE_TRY(check_not_applied(c, p));
  uint32_t steps = rq->steps ? rq->steps : 1;
  /* batches > 1: the feeds hold that many mini-batches (run/batches.h). */
  uint32_t batches = rq->batches;
  pe_limits lim = pe_server_limits(s);
  uint32_t max = lim.max_steps;
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
    pe_tensor *t = pe_arena_tensor(c->a);
    if (!t) {
      st = OOM("run");
      break;
    }
    /* Several mini-batches from shared memory: each is copied from the
     * region when its step needs it (run/batches.c), not the whole feed
     * up front. */
    if (batches > 1 && x->shm) {
      pins[i] = calloc(1, sizeof *pins[i]);
      if (!pe_arena_own(c->a, pins[i], shm_pin_dtor)) {
        pins[i] = NULL;
        st = OOM("run");
        break;
      }
    }
    st = pe_wire_tensor_in(s, c->rq->client_id, "run feed", x, t, pins[i]);
    if (st) break;
    char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
    if (t->dtype != decl->dtype) {
      st = pe_error(PE_EDTYPE, "run: feed '%s' is %s %s, the program declares %s %s", name,
                    pe_dtype_name(t->dtype), shape_str(&t->shape, a), pe_dtype_name(decl->dtype),
                    shape_str(&decl->shape, b));
      break;
    }
    /* No rows (or another dim 0, where the declaration says -1): the
     * kernels would compute nothing and the fetches would be what the
     * buffers held from the step before; refused alike on every place. */
    int empty = -1;
    for (int d = 0; d < t->shape.ndim && empty < 0; d++)
      if (t->shape.d[d] == 0) empty = d;
    if (empty >= 0) {
      st = pe_error(PE_ESHAPE, "run: feed '%s' has shape %s: %s; a run needs at least one %s", name,
                    shape_str(&t->shape, a), empty ? "a dim of 0, no elements" : "an empty batch",
                    empty ? "element" : "row");
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
  /* The step's batch: with batches, one mini-batch's rows. */
  int64_t rows = 0;
  for (int i = 0; i < nf && !st; i++)
    if (feeds[i].t->shape.ndim && feeds[i].t->shape.d[0] > rows) rows = feeds[i].t->shape.d[0];
  if (batches > 1) rows = (rows + batches - 1) / batches;
  pe_run_memory mem = {.rows = rows,
                       .client = c->rq->client_id,
                       .steps = batches > 1 ? batches : steps,
                       .timeout_ms = rq->options ? rq->options->timeout_ms : 0};
  if (!st) st = pe_run_memory_begin(s, p, &mem); /* may wait for memory: queue time */
  int nx = (int)rq->n_fetch;
  pe_tensor *fetched = NULL;
  for (int i = 0; i < nx && !st; i++)
    if (!rq->fetch[i] || !rq->fetch[i][0])
      st = pe_error(PE_EINVAL, "run: fetch name %d is empty", i);
  /* A training run checks its loss each step (run/finite.h): fetched as
   * fetch li, one past the client's when it did not ask for it (n_all). */
  const char *loss = st ? NULL : pe_run_finite_loss(p, lim.check_finite);
  const char **fetch = (const char **)rq->fetch;
  int n_all = nx, li = -1;
  for (int i = 0; loss && i < nx && li < 0; i++)
    if (!strcmp(rq->fetch[i], loss)) li = i;
  if (loss && li < 0) {
    fetch = pe_arena_alloc(c->a, sizeof *fetch * (size_t)(nx + 1));
    if (!fetch) st = OOM("run");
    for (int i = 0; i < nx && !st; i++) fetch[i] = rq->fetch[i];
    if (!st) fetch[li = n_all++] = loss;
  }
  if (!st && n_all) {
    fetched = pe_arena_alloc(c->a, sizeof *fetched * (size_t)n_all);
    /* Zeroed (empty) tensors; their buffers move to arena owners below. */
    if (!fetched) st = OOM("run");
  }
  pe_tensor **owned = NULL;
  if (!st && n_all) {
    owned = pe_arena_alloc(c->a, sizeof *owned * (size_t)n_all);
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
                      .timeline = tl,
                      .check_nan_inf = rq->options && rq->options->check_nan_inf};
    double deadline =
        rq->options && rq->options->timeout_ms ? t0 + rq->options->timeout_ms / 1e3 : 0;
    pe_run_guard guard = {.s = s, .p = p, .client = c->rq->client_id};
    if (batches > 1) {
      pe_run_batches rb = {.feeds = feeds,
                           .pins = (const pe_shm_pin *const *)pins,
                           .n_feeds = nf,
                           .batches = batches,
                           .fetch = fetch,
                           .n_fetch = n_all,
                           .loss_index = li,
                           .opts = &ro,
                           .deadline = deadline,
                           .timeout_ms = rq->options ? rq->options->timeout_ms : 0,
                           .guard = &guard,
                           .progress = &entry->done};
      st = pe_srv_run_batches(s->rt, p, &rb, fetched, &done);
    } else {
      /* done: the steps applied (a failed step applies nothing). */
      for (done = 0; done < steps; done++) {
        if (deadline && done > 0 && pe_now_s() > deadline) {
          st = pe_error(PE_EDEADLINE, "run: timeout of %u ms reached after %u of %u steps",
                        rq->options->timeout_ms, done, steps);
          break;
        }
        if (done > 0 && (st = pe_run_guard_check(&guard, done, steps))) break;
        st = pe_par_exec_run(p->exec, feeds, nf, fetch, n_all, fetched, &ro, &stats);
        if (st && (steps > 1 || ro.check_nan_inf)) st = pe_status_wrap(st, "step %u", done);
        if (st) break;
        atomic_store(&entry->done, done + 1);
        /* A non-finite loss: this step was applied, and stops the run. */
        if (li >= 0 && (st = pe_run_finite_check(p, loss, &fetched[li], done))) {
          done++;
          break;
        }
      }
    }
    atomic_fetch_add(&s->runs_total, done);
    if (st && done) st = applied_note(st, done);
  }
  pe_run_memory_end(s, p, &mem);
  double t1 = pe_now_s();
  /* Fetched buffers belong to the arena from here on. */
  for (int i = 0; fetched && i < n_all; i++) {
    pe_tensor *t = pe_arena_tensor(c->a);
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
    partial_reply(c, done, t0, t1);
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
    r->fetched[i] = pe_wire_tensor_out(c->a, rq->fetch[i], owned[i]);
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
