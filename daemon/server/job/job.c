/* Forming a job across nodes and its communicator table (job.h). */
#include "server/job/job.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "net/gloo_comm.h"

/* The backend's id in the job's store. */
#define PE_SRV_JOB_BACKEND_ID_KEY "node-comm-id"

struct pe_srv_job {
  char *name, *rendezvous;
  int rank, world;
  bool root_has_values;
  pe_node_comm table;
  /* The backend's communicator across nodes (device places), or none:
   * dev_open says whether dev holds an open one; dev_table wraps it so
   * that its failure breaks the job. */
  const pe_node_comm_backend *backend;
  pe_node_comm dev;
  bool dev_open;
  pe_node_comm dev_table;
  pthread_mutex_t mu; /* guards comm and failure against fail() */
  pe_gloo_comm *comm; /* NULL once broken */
  char failure[512];  /* why it broke; "" while healthy */
};

pe_status *pe_srv_job_spec_check(const Pe__JobSpec *s) {
  if (!s->name || !s->name[0])
    return pe_error(PE_EINVAL, "register: options.job has no name (the job's name on every node)");
  if (s->world < 2 || s->world > 4096)
    return pe_error(PE_EINVAL, "register: job '%s': world %u is outside 2..4096 nodes", s->name,
                    s->world);
  if (s->rank >= s->world)
    return pe_error(PE_EINVAL, "register: job '%s': rank %u is outside 0..%u", s->name, s->rank,
                    s->world - 1);
  if (!s->rendezvous || !s->rendezvous[0])
    return pe_error(PE_EINVAL, "register: job '%s': no rendezvous (rank 0's HOST:PORT)", s->name);
  if (!s->token || !s->token[0])
    return pe_error(PE_EINVAL, "register: job '%s': no token (the job's shared secret)", s->name);
  return NULL;
}

/* --- signatures ----------------------------------------------------------- */

/* "program HASH KIND\nvalues 0|1\nNAME DTYPE SHAPE\n..." (KIND: the places'
 * kind, which decides the communicator across nodes) */
static char *signature(const pe_srv_job_self *self, size_t *len) {
  size_t cap = 64, n = 0;
  for (int i = 0; i < self->n_vars; i++) cap += strlen(self->vars[i].name) + 32 + PE_SHAPE_STRLEN;
  char *s = malloc(cap);
  if (!s) return NULL;
  n +=
      (size_t)snprintf(s + n, cap - n, "program %016" PRIx64 " %s\nvalues %d\n", self->program_hash,
                       pe_place_kind_name(self->kind), self->has_values ? 1 : 0);
  for (int i = 0; i < self->n_vars; i++) {
    char sh[PE_SHAPE_STRLEN];
    n += (size_t)snprintf(s + n, cap - n, "%s %s %s\n", self->vars[i].name,
                          pe_dtype_name(self->vars[i].dtype),
                          pe_shape_str(&self->vars[i].shape, sh, sizeof sh));
  }
  *len = n;
  return s;
}

/* The line of s that starts with "NAME ", or NULL. */
static const char *find_var(const char *s, const char *name, size_t nl) {
  for (const char *l = s; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
    if (!strncmp(l, name, nl) && l[nl] == ' ') return l;
  return NULL;
}

/* The first variable line of a that b lacks or has otherwise; NULL when
 * every line of a is in b. */
static const char *first_diff(const char *a, const char *b) {
  const char *l = strchr(strchr(a, '\n') + 1, '\n') + 1; /* past program and values */
  for (; *l; l = strchr(l, '\n') + 1) {
    size_t ll = (size_t)(strchr(l, '\n') - l);
    size_t nl = (size_t)(strchr(l, ' ') - l);
    const char *o = find_var(strchr(strchr(b, '\n') + 1, '\n') + 1, l, nl);
    if (!o || strncmp(o, l, ll + 1)) return l;
  }
  return NULL;
}

/* rank r's signature against rank 0's: the error names the node and the
 * variable. */
static pe_status *compare(const char *job, const char *s0, const char *sr, int r) {
  const char *k0 = s0 + 25, *kr = sr + 25; /* past "program HASH " */
  size_t l0 = strcspn(k0, "\n"), lr = strcspn(kr, "\n");
  if (l0 != lr || strncmp(k0, kr, l0))
    return pe_error(PE_EINVAL,
                    "job '%s': node rank %d trains on %.*s places and rank 0 on %.*s places; every "
                    "node of a job trains on one kind of place",
                    job, r, (int)lr, kr, (int)l0, k0);
  const char *d = first_diff(s0, sr);
  bool on0 = d != NULL;
  if (!d) d = first_diff(sr, s0);
  if (d) {
    size_t nl = (size_t)(strchr(d, ' ') - d);
    const char *o = find_var(strchr(strchr(on0 ? sr : s0, '\n') + 1, '\n') + 1, d, nl);
    const char *l0 = on0 ? d : o, *lr = on0 ? o : d;
    int w0 = l0 ? (int)(strchr(l0, '\n') - l0 - (int)nl - 1) : 0;
    int wr = lr ? (int)(strchr(lr, '\n') - lr - (int)nl - 1) : 0;
    return pe_error(PE_EINVAL,
                    "job '%s': node rank %d does not match rank 0: variable '%.*s' is %.*s on "
                    "rank %d and %.*s on rank 0; every node registers the same program",
                    job, r, (int)nl, d, wr > 0 ? wr : 6, lr ? lr + nl + 1 : "absent", r,
                    w0 > 0 ? w0 : 6, l0 ? l0 + nl + 1 : "absent");
  }
  bool v0 = strstr(s0, "\nvalues 1\n") != NULL, vr = strstr(sr, "\nvalues 1\n") != NULL;
  /* Rank 0's values go to every node; without them every node inits and
   * takes rank 0's init, so no node may skip the init holding values. */
  if (vr && !v0)
    return pe_error(PE_EINVAL,
                    "job '%s': node rank %d has values for its parameters and rank 0 has none: "
                    "the job starts from rank 0's (restore the checkpoint on rank 0 too, or drop "
                    "the model on rank %d)",
                    job, r, r);
  if (strncmp(s0, sr, 25))
    return pe_error(PE_EINVAL,
                    "job '%s': node rank %d does not match rank 0: its program differs (%.24s, "
                    "rank 0 has %.24s) though its variables agree; every node registers the "
                    "same program",
                    job, r, sr, s0);
  return NULL;
}

/* Every rank's signature to every rank (one broadcast per rank), checked
 * against rank 0's, so that every node reports the same mismatch. */
static pe_status *exchange(pe_srv_job *j, pe_gloo_comm *c, const char *mine, size_t mine_len) {
  char *s0 = NULL;
  pe_status *st = NULL;
  for (int r = 0; r < j->world && !st; r++) {
    uint64_t len = r == j->rank ? mine_len : 0;
    st = pe_gloo_broadcast(c, &len, sizeof len, r);
    if (st) break;
    if (len > (64u << 20)) {
      st = pe_error(PE_EINVAL, "job '%s': rank %d's signature is %" PRIu64 " bytes (> 64 MiB)",
                    j->name, r, len);
      break;
    }
    char *s = malloc(len + 1);
    if (!s) {
      st = pe_error(PE_ENOMEM, "job '%s': out of memory", j->name);
      break;
    }
    if (r == j->rank) memcpy(s, mine, len);
    st = pe_gloo_broadcast(c, s, len, r);
    s[len] = 0;
    if (!st && r == 0) {
      s0 = s;
      j->root_has_values = strstr(s0, "\nvalues 1\n") != NULL;
      continue;
    }
    if (!st) st = compare(j->name, s0, s, r);
    free(s);
  }
  free(s0);
  return st;
}

/* --- the communicator table ------------------------------------------------ */

/* Closing the connections tells the peers: their exchange fails at once,
 * naming this rank. */
static void job_fail(void *ctx, const char *why) {
  pe_srv_job *j = ctx;
  pthread_mutex_lock(&j->mu);
  pe_gloo_comm *c = j->comm;
  j->comm = NULL;
  if (!j->failure[0]) snprintf(j->failure, sizeof j->failure, "%s", why);
  pthread_mutex_unlock(&j->mu);
  PE_LOGW("job '%s' rank %d: %s; leaving the job", j->name, j->rank, why);
  /* The backend's fail is safe from any thread and more than once: its
   * peers stop waiting for this node's device collectives too. */
  if (j->dev_open) j->dev.fail(j->dev.ctx, why);
  pe_gloo_comm_free(c);
}

/* The communicator, or the error of a broken job. */
static pe_status *live_comm(pe_srv_job *j, pe_gloo_comm **out) {
  pthread_mutex_lock(&j->mu);
  *out = j->comm;
  pe_status *st =
      *out ? NULL
           : pe_error(PE_EIO, "job '%s' rank %d is broken (%s): register again to form it anew",
                      j->name, j->rank, j->failure);
  pthread_mutex_unlock(&j->mu);
  return st;
}

static pe_status *job_all_reduce(void *ctx, float *const *bufs, const size_t *counts, int nbuf) {
  pe_srv_job *j = ctx;
  pe_gloo_comm *c;
  PE_TRY(live_comm(j, &c));
  pe_status *st = pe_gloo_allreduce_f32_many(c, bufs, counts, (size_t)nbuf);
  if (st) job_fail(j, pe_status_msg(st)); /* the other peers learn it too */
  return st;
}

/* The backend's all-reduce; its failure breaks the job (Gloo's peers
 * learn it when the connections close). */
static pe_status *job_dev_all_reduce(void *ctx, float *const *bufs, const size_t *counts,
                                     int nbuf) {
  pe_srv_job *j = ctx;
  pe_gloo_comm *c;
  PE_TRY(live_comm(j, &c));
  pe_status *st = j->dev.all_reduce(j->dev.ctx, bufs, counts, nbuf);
  if (st) job_fail(j, pe_status_msg(st));
  return st;
}

/* Every node joins the backend's communicator with the id rank 0 made. */
static pe_status *open_backend(pe_srv_job *j, const pe_srv_job_self *self, const void *id) {
  const pe_node_comm_backend *b = self->backend;
  pe_status *st = b->open(self->devs, self->n_places, j->rank, j->world, id, b->id_bytes,
                          self->timeout_ms, &j->dev);
  if (st)
    return pe_status_wrap(st,
                          "register: job '%s': node rank %d of %d joining the communicator across "
                          "nodes on its %d places",
                          j->name, j->rank, j->world, self->n_places);
  j->dev_open = true;
  j->dev_table = (pe_node_comm){j, j->rank, j->world, job_dev_all_reduce, job_fail};
  return NULL;
}

/* --- lifetime --------------------------------------------------------------- */

pe_status *pe_srv_job_form(const Pe__JobSpec *spec, const pe_srv_job_self *self, pe_srv_job **out) {
  *out = NULL;
  PE_TRY(pe_srv_job_spec_check(spec));
  pe_srv_job *j = calloc(1, sizeof *j);
  if (!j) return pe_error(PE_ENOMEM, "job '%s': out of memory", spec->name);
  j->name = strdup(spec->name);
  j->rendezvous = strdup(spec->rendezvous);
  j->rank = (int)spec->rank;
  j->world = (int)spec->world;
  pthread_mutex_init(&j->mu, NULL);
  j->table = (pe_node_comm){j, j->rank, j->world, job_all_reduce, job_fail};
  if (!j->name || !j->rendezvous) {
    pe_srv_job_free(j);
    return pe_error(PE_ENOMEM, "job '%s': out of memory", spec->name);
  }
  /* The backend's id: rank 0's travels through the store to every rank. */
  void *id = NULL, *id_mine = NULL;
  pe_gloo_shared shared = {0};
  j->backend = self->backend;
  if (j->backend) {
    id = calloc(1, j->backend->id_bytes);
    id_mine = calloc(1, j->backend->id_bytes);
    pe_status *st = id && id_mine ? NULL : pe_error(PE_ENOMEM, "job '%s': out of memory", j->name);
    if (!st && j->rank == 0) st = j->backend->make_id(j->world, id_mine);
    if (st) {
      free(id);
      free(id_mine);
      pe_srv_job_free(j);
      return pe_status_wrap(st, "register: job '%s': the communicator across nodes' id",
                            spec->name);
    }
    shared = (pe_gloo_shared){PE_SRV_JOB_BACKEND_ID_KEY, id_mine, id, j->backend->id_bytes};
  }
  pe_gloo_opts o = {.job = spec->name,
                    .token = spec->token,
                    .rendezvous = spec->rendezvous,
                    .host = self->host && self->host[0] ? self->host : NULL,
                    .rank = j->rank,
                    .world_size = j->world,
                    .timeout_ms = self->timeout_ms,
                    .shared = j->backend ? &shared : NULL};
  PE_LOGI("job '%s': rank %d of %d joining at %s", j->name, j->rank, j->world, j->rendezvous);
  pe_status *st = pe_gloo_comm_new(&o, &j->comm);
  free(id_mine);
  if (st) {
    free(id);
    pe_srv_job_free(j);
    bool gone = strstr(pe_status_msg(st), "unreachable") != NULL;
    return pe_status_wrap(st, "register: forming the job%s",
                          gone ? " (rank 0's daemon serves no rendezvous for the job: it is "
                                 "down, its job broke, or the others gave up waiting)"
                               : "");
  }
  size_t len = 0;
  char *mine = signature(self, &len);
  st = mine ? exchange(j, j->comm, mine, len) : pe_error(PE_ENOMEM, "job: out of memory");
  free(mine);
  if (st) {
    free(id);
    pe_srv_job_free(j);
    return pe_status_wrap(st, "register: rendezvous");
  }
  if (j->backend) st = open_backend(j, self, id);
  free(id);
  if (st) {
    pe_srv_job_free(j);
    return st;
  }
  PE_LOGI("job '%s': formed, rank %d of %d", j->name, j->rank, j->world);
  *out = j;
  return NULL;
}

bool pe_srv_job_is(const pe_srv_job *j, const Pe__JobSpec *s) {
  return j && !strcmp(j->name, s->name) && !strcmp(j->rendezvous, s->rendezvous) &&
         j->rank == (int)s->rank && j->world == (int)s->world;
}

bool pe_srv_job_broken(const pe_srv_job *j) {
  pthread_mutex_lock((pthread_mutex_t *)&j->mu);
  bool b = j->comm == NULL;
  pthread_mutex_unlock((pthread_mutex_t *)&j->mu);
  return b;
}

bool pe_srv_job_root_has_values(const pe_srv_job *j) {
  return j->root_has_values;
}

const pe_node_comm *pe_srv_job_comm(pe_srv_job *j) {
  return &j->table;
}

const pe_node_comm *pe_srv_job_dcomm(pe_srv_job *j) {
  return j->dev_open ? &j->dev_table : NULL;
}

/* Rank 0's values of vars[0..n) and its generator's offset to every node:
 * rank 0 reads them as one snapshot (pe_model_get_many), the others set
 * them as one (pe_model_set_many), keeping their own run origins. */
static pe_status *broadcast_state(pe_srv_job *j, pe_gloo_comm *c, pe_model *m,
                                  const pe_var_info *vars, int n, pe_tensor *t,
                                  const char **names) {
  for (int i = 0; i < n; i++) names[i] = vars[i].name;
  pe_model_mark mark = {0};
  /* Rank 0: the snapshot; the others: their own origins (n == 0: no read). */
  PE_TRY(pe_model_get_many(m, names, j->rank == 0 ? n : 0, t, NULL, &mark));
  pe_status *st = NULL;
  for (int i = 0; i < n && !st; i++) {
    /* The other ranks may have no value yet: a buffer of the declared shape. */
    if (j->rank != 0) st = pe_tensor_resize(&t[i], vars[i].dtype, &vars[i].shape, vars[i].name);
    if (!st) st = pe_gloo_broadcast(c, t[i].data, pe_tensor_bytes(&t[i]), 0);
    if (st) st = pe_status_wrap(st, "job '%s': rank 0's value of '%s'", j->name, vars[i].name);
  }
  /* The generator's offset: dropout masks after the formation are those
   * rank 0 would draw (every node runs the same graphs with the same seed). */
  uint64_t rng = mark.rng_offset;
  if (!st) st = pe_gloo_broadcast(c, &rng, sizeof rng, 0);
  if (!st && j->rank != 0) {
    mark.has_rng = true;
    mark.rng_offset = rng;
    st = pe_model_set_many(m, names, t, n, &mark);
  }
  pe_model_mark_release(&mark);
  return st;
}

pe_status *pe_srv_job_broadcast_values(pe_srv_job *j, pe_model *m, const pe_var_info *vars, int n) {
  pe_gloo_comm *c;
  PE_TRY(live_comm(j, &c));
  pe_tensor *t = calloc((size_t)(n ? n : 1), sizeof *t);
  const char **names = calloc((size_t)(n ? n : 1), sizeof *names);
  pe_status *st = t && names ? NULL : pe_error(PE_ENOMEM, "job '%s': out of memory", j->name);
  for (int i = 0; t && i < n; i++) pe_tensor_init(&t[i]);
  if (!st) st = broadcast_state(j, c, m, vars, n, t, names);
  for (int i = 0; t && i < n; i++) pe_tensor_release(&t[i]);
  free(t);
  free(names);
  if (st) job_fail(j, pe_status_msg(st));
  return st;
}

void pe_srv_job_free(pe_srv_job *j) {
  if (!j) return;
  if (j->dev_open) j->backend->close(&j->dev);
  pe_gloo_comm_free(j->comm);
  pthread_mutex_destroy(&j->mu);
  free(j->name);
  free(j->rendezvous);
  free(j);
}
