/* pe_model (parallel/executor.h): persistables per place plus their engine
 * variables; lifetime and the table of entries. Reads and writes from
 * outside a run: parallel/model_io.c. */
#include <stdlib.h>
#include <string.h>

#include "engine/device_comm.h"
#include "engine/parallel/internal.h"
#include "engine/place_io.h"

pe_status *pe_model_check_places(pe_place_kind kind, int n_places) {
  const pe_device_ops *ops = pe_device_kind_ops(kind);
  if (!ops) /* Said by the daemon and by pe-bench alike: "this build", not "this daemon". */
    return pe_error(PE_EINVAL,
                    "places of kind %s: not built in (this build has no %s backend; configure with "
                    "-DPE_CUDA=ON)",
                    pe_place_kind_name(kind), pe_place_kind_name(kind));
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
  pe_rng_init(&m->rng, m->seed);
  pthread_mutex_init(&m->mu, NULL);
  pthread_mutex_init(&m->push_mu, NULL);
  pthread_mutex_init(&m->dcomm_mu, NULL);
  pe_strmap_init(&m->index);
  pe_status *st = NULL;
  for (int p = 0; !st && p < n_places; p++) {
    st = pe_runtime_device(rt, (pe_place){kind, p}, n_places, &m->dev[p]);
    if (!st && !(m->scope[p] = pe_scope_new(NULL)))
      st = pe_error(PE_ENOMEM, "model: out of memory");
  }
  if (!st) st = pe_engine_new_var(rt->eng, &m->prng);
  if (!st) st = pe_comm_new(n_places, &m->comm);
  /* Collectives over device memory are the backend's (cuda: NCCL): one
   * communicator per model, over the same devices (and so comm streams) as
   * every other model's. None for a kind whose memory is host memory. */
  if (!st && n_places > 1) st = pe_device_comm_new(m->dev, n_places, &m->dcomm);
  if (st) {
    pe_model_free(m);
    return pe_status_wrap(st, "model");
  }
  *out = m;
  return NULL;
}

void pe_model_set_node_comm(pe_model *m, const struct pe_node_comm *c) {
  m->ncomm = c;
}

void pe_model_set_node_dcomm(pe_model *m, const struct pe_node_comm *c) {
  m->ncomm_dev = c;
}

pe_device *const *pe_model_devices(const pe_model *m) {
  return m->dev;
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
  pe_device_comm_free(m->dcomm); /* the comm streams were drained above */
  pthread_mutex_destroy(&m->dcomm_mu);
  pthread_mutex_destroy(&m->push_mu);
  free(m->origins);
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
