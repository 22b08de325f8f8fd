/* Reads and writes of a model's persistables from outside a run
 * (pe_model_get*, pe_model_set*, pe_model_bytes; parallel/executor.h). Each call
 * is one engine op over the variables it touches, pushed under the model's
 * push_mu like a run's ops, so it is ordered with the runs pushed before and
 * after it, and a call over several variables sees them all at one step
 * boundary. The caller's thread waits for the op (never a pool worker's:
 * the op needs one). */
#include <stdlib.h>
#include <string.h>

#include "core/names_unique.h"
#include "engine/parallel/internal.h"
#include "engine/place_io.h"

/* Drain the places' compute and comm streams: stream work of earlier runs
 * that read the variable may still be queued (readers release their engine
 * variables when launched; only writers wait for their stream work). */
static void drain_places(pe_model *m) {
  for (int p = 0; p < m->n_places; p++)
    if (pe_device_is_async(m->dev[p])) {
      pe_stream_drain(pe_device_stream(m->dev[p], PE_STREAM_COMPUTE));
      pe_stream_drain(pe_device_stream(m->dev[p], PE_STREAM_COMM));
    }
}

/* Device collective errors, not hangs (a model with a device communicator).
 * A run without fetches returns with its collectives in flight
 * (parallel/async.c); the fence syncs and stream drains below would wait for
 * a failed or stuck one with no limit, and after a failed one read values it
 * never produced. */
static pe_status *dcomm_settled(pe_model *m) {
  if (m->dcomm) return pe_status_wrap(par_model_dcomm_finish(m), "model");
  return NULL;
}

typedef struct model_io {
  pe_model *m;
  par_entry **en; /* [n] */
  int n;
  const int *at;                /* get: [n] the replica read of each */
  pe_tensor *out;               /* get: [n] */
  bool *has_value;              /* get: [n] or NULL (no value is an error) */
  const pe_tensor *in;          /* set: [n] */
  pe_model_mark *mark;          /* get: filled at the push (may be NULL) */
  uint64_t rng_offset;          /* get with a mark: the generator's, in the op */
  const pe_model_mark *restore; /* set: origins to install at the push */
  pe_status *st;
  /* Completion: pe_engine_wait_var is itself a read, so it does not wait
   * for an earlier read (our get); the op signals its own end. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
} model_io;

static void io_done(void *arg, const pe_status *st) {
  (void)st;
  model_io *io = arg;
  pthread_mutex_lock(&io->mu);
  io->done = true;
  pthread_cond_signal(&io->cv);
  pthread_mutex_unlock(&io->mu);
}

/* --- run origins -------------------------------------------------------------------- */

/* Copy from's origins (the newest PE_MODEL_ORIGINS) into *dst, grown as
 * needed (*cap: its capacity). */
static pe_status *origins_copy(const pe_model_mark *from, pe_run_origin **dst, int *n, int *cap) {
  int k = from->n_origins < PE_MODEL_ORIGINS ? from->n_origins : PE_MODEL_ORIGINS;
  const pe_run_origin *src = from->origins + (from->n_origins - k);
  if (k > *cap) {
    pe_run_origin *a = realloc(*dst, sizeof *a * (size_t)k);
    if (!a) return pe_error(PE_ENOMEM, "model: out of memory for %d run origins", k);
    *dst = a;
    *cap = k;
  }
  if (k) memcpy(*dst, src, sizeof **dst * (size_t)k);
  *n = k;
  return NULL;
}

/* The model's change count and origins now; the caller holds push_mu. */
static pe_status *mark_take(pe_model *m, pe_model_mark *mark) {
  *mark = (pe_model_mark){.version = atomic_load(&m->changes)};
  pe_model_mark from = {.origins = m->origins, .n_origins = m->n_origins};
  int cap = 0;
  return origins_copy(&from, &mark->origins, &mark->n_origins, &cap);
}

/* Record a run of origin o; the caller holds push_mu. Out of memory: not
 * recorded (a resend could then apply again). */
static void note_origin(pe_model *m, const pe_run_origin *o) {
  int n = m->n_origins, i = n - 1;
  if (i < 0 || m->origins[i].client != o->client) {
    /* Not the newest: move the client's record (or a new one) to the end,
     * evicting the oldest when full. */
    while (--i >= 0 && m->origins[i].client != o->client) {
    }
    pe_run_origin cur = {.client = o->client};
    if (i >= 0) {
      cur = m->origins[i];
      memmove(&m->origins[i], &m->origins[i + 1], sizeof cur * (size_t)(n - 1 - i));
      n--;
    } else if (n == PE_MODEL_ORIGINS) {
      memmove(&m->origins[0], &m->origins[1], sizeof cur * (size_t)(n - 1));
      n--;
    } else if (n == m->cap_origins) {
      int cap = m->cap_origins ? 2 * m->cap_origins : 16;
      pe_run_origin *a = realloc(m->origins, sizeof *a * (size_t)cap);
      if (!a) return;
      m->origins = a;
      m->cap_origins = cap;
    }
    m->origins[n++] = cur;
    m->n_origins = n;
    i = n - 1;
  }
  pe_run_origin *r = &m->origins[i];
  if (r->request == o->request) {
    r->steps++;
  } else if (o->request > r->request) {
    r->request = o->request;
    r->steps = 1;
  }
}

void par_model_push_begin(pe_model *m, bool writes, const pe_run_origin *o) {
  pthread_mutex_lock(&m->push_mu);
  if (!writes) return;
  atomic_fetch_add(&m->changes, 1);
  if (o->client) note_origin(m, o);
}

void par_model_push_end(pe_model *m) {
  pthread_mutex_unlock(&m->push_mu);
}

bool pe_model_origin(pe_model *m, uint64_t client, pe_run_origin *out) {
  bool found = false;
  pthread_mutex_lock(&m->push_mu);
  for (int i = m->n_origins - 1; i >= 0 && !found; i--)
    if (m->origins[i].client == client) {
      *out = m->origins[i];
      found = true;
    }
  pthread_mutex_unlock(&m->push_mu);
  return found;
}

/* --- engine ops ------------------------------------------------------------------------ */

/* Push fn(io) with these engine accesses (under push_mu; a push with
 * mutations is a change) and wait for it. */
static pe_status *io_push(pe_model *m, pe_engine_fn fn, model_io *io, pe_engine_var *const *reads,
                          int n_reads, pe_engine_var *const *mutates, int n_mutates) {
  pthread_mutex_init(&io->mu, NULL);
  pthread_cond_init(&io->cv, NULL);
  io->done = false;
  pe_engine_op_args a = {.fn = fn,
                         .arg = io,
                         .on_done = io_done,
                         .reads = reads,
                         .n_reads = n_reads,
                         .mutates = mutates,
                         .n_mutates = n_mutates};
  pthread_mutex_lock(&m->push_mu);
  pe_status *st = pe_engine_op_new(m->rt->eng, &a, NULL);
  if (!st && n_mutates) atomic_fetch_add(&m->changes, 1);
  if (!st && io->restore)
    st = origins_copy(io->restore, &m->origins, &m->n_origins, &m->cap_origins);
  if (!st && io->mark) st = mark_take(m, io->mark);
  pthread_mutex_unlock(&m->push_mu);
  if (!st) {
    pthread_mutex_lock(&io->mu);
    while (!io->done) pthread_cond_wait(&io->cv, &io->mu);
    pthread_mutex_unlock(&io->mu);
    st = io->st;
  }
  pthread_cond_destroy(&io->cv);
  pthread_mutex_destroy(&io->mu);
  return st;
}

/* The entries of names (n >= 1), or PE_EUNKNOWN_VAR naming the first
 * unknown one; *out is malloc'd. create: make missing entries (set). */
static pe_status *find_entries(pe_model *m, const char *what, const char *const *names, int n,
                               bool create, par_entry ***out) {
  par_entry **en = malloc(sizeof *en * (size_t)n);
  if (!en) return pe_error(PE_ENOMEM, "model: %s: out of memory", what);
  pe_status *st = NULL;
  if (!create) pthread_mutex_lock(&m->mu); /* one lookup pass */
  for (int i = 0; i < n && !st; i++) {
    if (!names[i])
      st = pe_error(PE_EINVAL, "model: %s: name %d is NULL", what, i);
    else if (create)
      st = par_model_entry(m, names[i], &en[i]); /* takes m->mu itself */
    else if (!(en[i] = pe_strmap_get(&m->index, names[i])))
      st = pe_error(PE_EUNKNOWN_VAR, "model: %s: no persistable '%s'", what, names[i]);
  }
  if (!create) pthread_mutex_unlock(&m->mu);
  if (st) {
    free(en);
    return st;
  }
  *out = en;
  return NULL;
}

/* --- get ----------------------------------------------------------------------------- */

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return (x > y) - (x < y);
}

static pe_status *get_fn(void *arg) {
  model_io *io = arg;
  io->st = dcomm_settled(io->m);
  for (int i = 0; i < io->n && !io->st; i++) {
    par_entry *en = io->en[i];
    int place = io->at[i];
    const pe_tensor *t = &en->v[place]->t;
    io->st = par_fence_sync(&en->fence[place]); /* the newest write ran */
    if (io->st) break;
    if (!t->data && t->shape.ndim == 0) {
      if (io->has_value) {
        io->has_value[i] = false;
        continue;
      }
      io->st = pe_error(
          PE_EUSE_BEFORE_DEF,
          "model: persistable '%s' has no value on place %d (run the startup graph or set it%s)",
          en->name, place,
          place > 0 ? "; the sharded strategy keeps optimizer state on place 0 only" : "");
      break;
    }
    io->st = pe_place_read(io->m->dev[place], t, &io->out[i], en->name);
    if (io->has_value) io->has_value[i] = !io->st;
  }
  /* Not into *io->mark: the pushing thread fills that after the push,
   * maybe while this runs. */
  if (io->mark) io->rng_offset = io->m->rng.offset;
  return NULL;
}

/* Read names[0..n) of `place` (-1: each one's home, par_entry) as one
 * engine op. */
static pe_status *get_entries(pe_model *m, const char *const *names, int n, int place,
                              pe_tensor *out, bool *has_value, pe_model_mark *mark) {
  if (n <= 0) { /* nothing to read: the mark alone */
    pe_status *st = NULL;
    if (mark) {
      pthread_mutex_lock(&m->push_mu);
      st = mark_take(m, mark);
      pthread_mutex_unlock(&m->push_mu);
    }
    return st;
  }
  par_entry **en = NULL;
  PE_TRY(find_entries(m, "get", names, n, false, &en));
  pe_engine_var **vars = malloc(sizeof *vars * (size_t)(n + 1));
  int *at = malloc(sizeof *at * (size_t)n);
  if (!vars || !at) {
    free(vars);
    free(at);
    free(en);
    return pe_error(PE_ENOMEM, "model: get: out of memory");
  }
  for (int i = 0; i < n; i++)
    at[i] = place >= 0 ? place : atomic_load_explicit(&en[i]->home, memory_order_relaxed);
  /* One read per variable: a name given twice reads once (sorted, so
   * that many names cost n log n). */
  for (int i = 0; i < n; i++) vars[i] = en[i]->ev[at[i]];
  qsort(vars, (size_t)n, sizeof *vars, cmp_ptr);
  int nv = 0;
  for (int i = 0; i < n; i++)
    if (!nv || vars[nv - 1] != vars[i]) vars[nv++] = vars[i];
  if (mark) vars[nv++] = m->prng; /* after the random ops before us */
  if (has_value) memset(has_value, 0, sizeof *has_value * (size_t)n);
  model_io io = {
      .m = m, .en = en, .n = n, .at = at, .out = out, .has_value = has_value, .mark = mark};
  pe_status *st = io_push(m, get_fn, &io, vars, nv, NULL, 0);
  if (!st && mark) {
    mark->has_rng = true;
    mark->rng_offset = io.rng_offset;
  }
  if (st) {
    for (int i = 0; i < n; i++) pe_tensor_release(&out[i]);
    pe_model_mark_release(mark);
  }
  free(vars);
  free(at);
  free(en);
  return st;
}

pe_status *pe_model_get_place(pe_model *m, const char *name, int place, pe_tensor *out) {
  if (place < 0 || place >= m->n_places)
    return pe_error(PE_EINVAL, "model: get '%s': place %d out of range (%d places)",
                    name ? name : "(null)", place, m->n_places);
  if (!name) return pe_error(PE_EUNKNOWN_VAR, "model: no persistable '(null)'");
  return get_entries(m, &name, 1, place, out, NULL, NULL);
}

pe_status *pe_model_get(pe_model *m, const char *name, pe_tensor *out) {
  if (!name) return pe_error(PE_EUNKNOWN_VAR, "model: no persistable '(null)'");
  return get_entries(m, &name, 1, -1, out, NULL, NULL);
}

pe_status *pe_model_get_many(pe_model *m, const char *const *names, int n, pe_tensor *out,
                             bool *has_value, pe_model_mark *mark) {
  if (n < 0 || (n && (!names || !out)))
    return pe_error(PE_EINVAL, "model: get of %d persistables: bad arguments", n);
  return get_entries(m, names, n, -1, out, has_value, mark);
}

/* --- set ----------------------------------------------------------------------------- */

/* Whether in may replace en's value: PE_EDTYPE / PE_ESHAPE naming both. */
static pe_status *check_value(const par_entry *en, const pe_tensor *v) {
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  const pe_tensor *t0 = &en->v[0]->t;
  if (!t0->data && !t0->shape.ndim) return NULL; /* no value yet: any */
  if (t0->dtype != v->dtype)
    return pe_error(PE_EDTYPE, "model: set '%s': value is %s %s, the variable is %s %s", en->name,
                    pe_dtype_name(v->dtype), pe_shape_str(&v->shape, s1, sizeof s1),
                    pe_dtype_name(t0->dtype), pe_shape_str(&t0->shape, s2, sizeof s2));
  if (!pe_shape_equal(&t0->shape, &v->shape))
    return pe_error(PE_ESHAPE, "model: set '%s': value has shape %s, the variable has %s", en->name,
                    pe_shape_str(&v->shape, s1, sizeof s1),
                    pe_shape_str(&t0->shape, s2, sizeof s2));
  return NULL;
}

static pe_status *set_fn(void *arg) {
  model_io *io = arg;
  /* Every value is checked before any is written: all or nothing. */
  for (int i = 0; i < io->n && !io->st; i++) io->st = check_value(io->en[i], &io->in[i]);
  if (!io->st) io->st = dcomm_settled(io->m);
  if (io->st) return NULL;
  drain_places(io->m);
  for (int i = 0; i < io->n && !io->st; i++)
    for (int p = 0; p < io->m->n_places && !io->st; p++)
      io->st = pe_place_write(io->m->dev[p], &io->en[i]->v[p]->t, &io->in[i], io->en[i]->name);
  if (!io->st && io->restore && io->restore->has_rng) io->m->rng.offset = io->restore->rng_offset;
  return NULL;
}

pe_status *pe_model_set_many(pe_model *m, const char *const *names, const pe_tensor *values, int n,
                             const pe_model_mark *restore) {
  if (n < 0 || (n && (!names || !values)))
    return pe_error(PE_EINVAL, "model: set of %d persistables: bad arguments", n);
  if (n == 0) return NULL;
  for (int i = 0; i < n; i++) {
    const char *nm = names[i] ? names[i] : "(null)";
    const pe_tensor *v = &values[i];
    if (pe_shape_numel(&v->shape) < 0 || (pe_tensor_numel(v) > 0 && !v->data))
      return pe_error(PE_EINVAL, "model: set '%s': value has no data", nm);
  }
  PE_TRY(pe_status_wrap(pe_names_unique(names, (size_t)n, pe_name_at_str, "name"), "model: set"));
  par_entry **en = NULL;
  PE_TRY(find_entries(m, "set", names, n, true, &en));
  size_t nv = (size_t)n * (size_t)m->n_places;
  pe_engine_var **vars = malloc(sizeof *vars * (nv + 1));
  pe_status *st = vars ? NULL : pe_error(PE_ENOMEM, "model: set: out of memory");
  if (!st) {
    for (int i = 0; i < n; i++)
      for (int p = 0; p < m->n_places; p++)
        vars[(size_t)i * (size_t)m->n_places + p] = en[i]->ev[p];
    if (restore && restore->has_rng) vars[nv++] = m->prng; /* set_fn moves the generator */
    /* restore's origins are installed at the push, before set_fn checks
     * the values: a set that then fails keeps them (callers check the
     * values first: pe_srv_model_check_value). */
    model_io io = {.m = m, .en = en, .n = n, .in = values, .restore = restore};
    st = io_push(m, set_fn, &io, NULL, 0, vars, (int)nv);
  }
  free(vars);
  free(en);
  return st;
}

pe_status *pe_model_set(pe_model *m, const char *name, const pe_tensor *value) {
  if (!name || !value) return pe_error(PE_EINVAL, "model: set: no name or value");
  return pe_model_set_many(m, &name, value, 1, NULL);
}

uint64_t pe_model_changes(pe_model *m) {
  return atomic_load(&m->changes);
}

/* --- bytes --------------------------------------------------------------------------- */

/* Sums place 0's persistables; runs as an engine read of all of them, so
 * it never races with a kernel that resizes one (startup, set). */
typedef struct bytes_io {
  model_io io;
  par_entry **ent;
  int n;
  int64_t bytes;
} bytes_io;

static pe_status *bytes_fn(void *arg) {
  bytes_io *b = arg;
  for (int i = 0; i < b->n; i++) {
    const pe_tensor *t = &b->ent[i]->v[0]->t;
    if (t->data) b->bytes += (int64_t)pe_tensor_bytes(t);
  }
  return NULL;
}

int64_t pe_model_bytes(pe_model *m) {
  bytes_io b = {.io = {.m = m}};
  pthread_mutex_lock(&m->mu);
  b.n = m->n_ent;
  b.ent = malloc(sizeof *b.ent * (size_t)(b.n ? b.n : 1));
  pe_engine_var **vars = malloc(sizeof *vars * (size_t)(b.n ? b.n : 1));
  if (b.ent && vars)
    for (int i = 0; i < b.n; i++) {
      b.ent[i] = m->ent[i];
      vars[i] = m->ent[i]->ev[0];
    }
  pthread_mutex_unlock(&m->mu);
  int64_t bytes = 0; /* out of memory: reported as 0 */
  if (b.ent && vars) {
    pe_status *st = io_push(m, bytes_fn, &b.io, vars, b.n, NULL, 0);
    if (st)
      pe_status_free(st);
    else
      bytes = b.bytes;
  }
  free(vars);
  free(b.ent);
  return bytes;
}
