/* pe_model (par_executor.h): persistables per place plus their engine
 * variables. get/set are engine ops on the variable, so they are ordered
 * with the runs pushed before and after them. */
#include <stdlib.h>
#include <string.h>

#include "engine/par_internal.h"
#include "engine/place_io.h"
#ifdef PE_HAVE_CUDA
#include "cuda/nccl_comm.h"
#endif

pe_status *pe_model_check_places(pe_place_kind kind, int n_places) {
  const pe_device_ops *ops = pe_device_kind_ops(kind);
  if (!ops)
    return pe_error(PE_EINVAL, "places of kind %s: not built into this daemon",
                    pe_place_kind_name(kind));
  if (n_places < 1 || n_places > PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "%d places of kind %s (1..%d)", n_places, pe_place_kind_name(kind),
                    PE_MAX_PLACES);
  return NULL;
}

pe_status *pe_model_new(pe_runtime *rt, pe_place_kind kind, int n_places, uint64_t seed,
                        pe_model **out) {
  *out = NULL;
  PE_TRY(pe_status_wrap(pe_model_check_places(kind, n_places), "model"));
  pe_model *m = calloc(1, sizeof(*m));
  if (!m) return pe_error(PE_ENOMEM, "model: out of memory");
  m->rt = rt;
  m->kind = kind;
  m->n_places = n_places;
  m->seed = seed ? seed : 1;
  pthread_mutex_init(&m->mu, NULL);
  pthread_mutex_init(&m->nccl_mu, NULL);
  pe_strmap_init(&m->index);
  pe_status *st = NULL;
  for (int p = 0; !st && p < n_places; p++) {
    st = pe_runtime_device(rt, (pe_place){kind, p}, n_places, &m->dev[p]);
    if (!st && !(m->scope[p] = pe_scope_new(NULL)))
      st = pe_error(PE_ENOMEM, "model: out of memory");
  }
  if (!st) st = pe_engine_new_var(rt->eng, &m->prng);
  if (!st) st = pe_comm_new(n_places, &m->comm);
#ifdef PE_HAVE_CUDA
  /* Collectives over cuda memory are NCCL's: one communicator per model, over
   * the same devices (and so comm streams) as every other model's. */
  if (!st && kind == PE_PLACE_CUDA && n_places > 1)
    st = pe_nccl_comm_new(m->dev, n_places, &m->nccl);
#endif
  if (st) {
    pe_model_free(m);
    return pe_status_wrap(st, "model");
  }
  *out = m;
  return NULL;
}

void pe_model_free(pe_model *m) {
  if (!m) return;
  pe_engine *eng = m->rt->eng;
  for (int i = 0; i < m->n_ent; i++)
    for (int p = 0; p < m->n_places; p++) {
      pe_status_free(pe_engine_wait_var(eng, m->ent[i]->ev[p]));
      pe_status_free(pe_engine_delete_var(eng, m->ent[i]->ev[p]));
    }
  if (m->prng) {
    pe_status_free(pe_engine_wait_var(eng, m->prng));
    pe_status_free(pe_engine_delete_var(eng, m->prng));
  }
  /* Deletes are mutations: wait until they ran before freeing what the
   * stream work of earlier runs might still touch (fenced writes too). */
  for (int p = 0; p < m->n_places; p++)
    if (m->dev[p])
      for (int k = 0; k < PE_STREAM_KINDS; k++) pe_stream_drain(pe_device_stream(m->dev[p], k));
  for (int i = 0; i < m->n_ent; i++) {
    for (int p = 0; p < m->n_places; p++)
      if (m->ent[i]->fence[p].ev) pe_event_put(m->ent[i]->fence[p].ev);
    free(m->ent[i]);
  }
#ifdef PE_HAVE_CUDA
  pe_nccl_comm_free(m->nccl); /* the comm streams were drained above */
#endif
  pthread_mutex_destroy(&m->nccl_mu);
  free(m->ent);
  pe_strmap_destroy(&m->index);
  for (int p = 0; p < m->n_places; p++) pe_scope_free(m->scope[p]);
  pe_comm_free(m->comm);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

int pe_model_places(const pe_model *m) {
  return m->n_places;
}

pe_status *par_model_entry(pe_model *m, const char *name, par_entry **out) {
  pthread_mutex_lock(&m->mu);
  par_entry *en = pe_strmap_get(&m->index, name);
  pe_status *st = NULL;
  if (!en) {
    en = calloc(1, sizeof(*en));
    if (!en) st = pe_error(PE_ENOMEM, "model: out of memory");
    for (int p = 0; !st && p < m->n_places; p++) {
      st = pe_scope_var(m->scope[p], name, &en->v[p]);
      if (!st) en->v[p]->persistable = true;
    }
    for (int p = 0; !st && p < m->n_places; p++) st = pe_engine_new_var(m->rt->eng, &en->ev[p]);
    for (int p = 0; !st && p < m->n_places; p++)
      if (pe_device_is_async(m->dev[p])) st = pe_event_get(m->dev[p], &en->fence[p].ev);
    if (!st && m->n_ent == m->cap_ent) {
      int cap = m->cap_ent ? 2 * m->cap_ent : 16;
      par_entry **a = realloc(m->ent, (size_t)cap * sizeof(*a));
      if (!a)
        st = pe_error(PE_ENOMEM, "model: out of memory");
      else {
        m->ent = a;
        m->cap_ent = cap;
      }
    }
    if (!st) {
      en->name = en->v[0]->name;
      if (!pe_strmap_put(&m->index, name, en)) st = pe_error(PE_ENOMEM, "model: out of memory");
    }
    if (!st)
      m->ent[m->n_ent++] = en;
    else {
      for (int p = 0; en && p < m->n_places; p++) {
        if (en->ev[p]) pe_status_free(pe_engine_delete_var(m->rt->eng, en->ev[p]));
        if (en->fence[p].ev) pe_event_put(en->fence[p].ev);
      }
      free(en); /* scope vars stay (empty); the next call reuses them */
      en = NULL;
    }
  }
  pthread_mutex_unlock(&m->mu);
  *out = en;
  return st;
}

static par_entry *find_entry(pe_model *m, const char *name) {
  pthread_mutex_lock(&m->mu);
  par_entry *en = name ? pe_strmap_get(&m->index, name) : NULL;
  pthread_mutex_unlock(&m->mu);
  return en;
}

bool pe_model_has(pe_model *m, const char *name) {
  par_entry *en = find_entry(m, name);
  return en != NULL;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

pe_status *pe_model_names(pe_model *m, const char ***names, int *n) {
  pthread_mutex_lock(&m->mu);
  int k = m->n_ent;
  const char **a = malloc((size_t)(k ? k : 1) * sizeof(*a));
  if (a)
    for (int i = 0; i < k; i++) a[i] = m->ent[i]->name;
  pthread_mutex_unlock(&m->mu);
  if (!a) return pe_error(PE_ENOMEM, "model: out of memory");
  qsort(a, (size_t)k, sizeof(*a), cmp_names);
  *names = a;
  *n = k;
  return NULL;
}

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

typedef struct model_io {
  pe_model *m;
  par_entry *en;
  pe_tensor *out;
  const pe_tensor *in;
  int place;
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

/* Push fn(io) with these engine accesses and wait for it. */
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
  pe_status *st = pe_engine_op_new(m->rt->eng, &a, NULL);
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

/* Push fn(io) reading or mutating en's variable and wait for it. */
static pe_status *io_run(pe_model *m, pe_engine_fn fn, model_io *io, bool mutate) {
  if (mutate) /* set: every replica */
    return io_push(m, fn, io, NULL, 0, io->en->ev, m->n_places);
  return io_push(m, fn, io, &io->en->ev[io->place], 1, NULL, 0); /* get: the replica read */
}

static pe_status *get_fn(void *arg) {
  model_io *io = arg;
  const pe_tensor *t = &io->en->v[io->place]->t;
  io->st = par_fence_sync(&io->en->fence[io->place]); /* the newest write ran */
  if (io->st) return NULL;
  if (!t->data && t->shape.ndim == 0)
    io->st = pe_error(
        PE_EUSE_BEFORE_DEF,
        "model: persistable '%s' has no value on place %d (run the startup graph or set it%s)",
        io->en->name, io->place,
        io->place > 0 ? "; the sharded strategy keeps optimizer state on place 0 only" : "");
  else
    io->st = pe_place_read(io->m->dev[io->place], t, io->out, io->en->name);
  return NULL;
}

pe_status *pe_model_get_place(pe_model *m, const char *name, int place, pe_tensor *out) {
  if (place < 0 || place >= m->n_places)
    return pe_error(PE_EINVAL, "model: get '%s': place %d out of range (%d places)",
                    name ? name : "(null)", place, m->n_places);
  par_entry *en = find_entry(m, name);
  if (!en) return pe_error(PE_EUNKNOWN_VAR, "model: no persistable '%s'", name ? name : "(null)");
  model_io io = {.m = m, .en = en, .out = out, .place = place};
  return io_run(m, get_fn, &io, false);
}

pe_status *pe_model_get(pe_model *m, const char *name, pe_tensor *out) {
  return pe_model_get_place(m, name, 0, out);
}

static pe_status *set_fn(void *arg) {
  model_io *io = arg;
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  const pe_tensor *v = io->in;
  const pe_tensor *t0 = &io->en->v[0]->t;
  if (t0->data || t0->shape.ndim) {
    if (t0->dtype != v->dtype) {
      io->st =
          pe_error(PE_EDTYPE, "model: set '%s': value is %s %s, the variable is %s %s",
                   io->en->name, pe_dtype_name(v->dtype), pe_shape_str(&v->shape, s1, sizeof s1),
                   pe_dtype_name(t0->dtype), pe_shape_str(&t0->shape, s2, sizeof s2));
      return NULL;
    }
    if (!pe_shape_equal(&t0->shape, &v->shape)) {
      io->st = pe_error(PE_ESHAPE, "model: set '%s': value has shape %s, the variable has %s",
                        io->en->name, pe_shape_str(&v->shape, s1, sizeof s1),
                        pe_shape_str(&t0->shape, s2, sizeof s2));
      return NULL;
    }
  }
  drain_places(io->m);
  for (int p = 0; p < io->m->n_places && !io->st; p++)
    io->st = pe_place_write(io->m->dev[p], &io->en->v[p]->t, v, io->en->name);
  return NULL;
}

pe_status *pe_model_set(pe_model *m, const char *name, const pe_tensor *value) {
  if (!name || !value) return pe_error(PE_EINVAL, "model: set: no name or value");
  if (pe_shape_numel(&value->shape) < 0 || (pe_tensor_numel(value) > 0 && !value->data))
    return pe_error(PE_EINVAL, "model: set '%s': value has no data", name);
  par_entry *en;
  PE_TRY(par_model_entry(m, name, &en));
  model_io io = {.m = m, .en = en, .in = value};
  return io_run(m, set_fn, &io, true);
}

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
