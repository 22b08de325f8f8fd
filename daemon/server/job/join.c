/* A register's job spec (options.job): the model's job, formed when it has
 * none or its job broke (join.h). */
#include "server/job/join.h"

#include <stdio.h>

#include "core/log.h"
#include "server/job/job.h"
#include "server/registry/internal.h"
#include "server/server.h"

static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static pe_status *form_locked(pe_server *s, pe_srv_program *p, const Pe__RegisterRequest *rq) {
  const Pe__JobSpec *spec = rq->options->job;
  pe_srv_model *m = p->model;
  if (m->job && !pe_srv_job_broken(m->job)) {
    if (pe_srv_job_is(m->job, spec)) return NULL;
    return pe_error(PE_EINVAL,
                    "register: model '%s' already trains in a job on this daemon; a model "
                    "joins one job once (job '%s' rank %u asked): register under another "
                    "model name",
                    m->name, spec->name, spec->rank);
  }
  if (m->job) { /* broken: formed again */
    pe_model_set_node_comm(m->m, NULL);
    pe_model_set_node_dcomm(m->m, NULL);
    pe_srv_job_free(m->job);
    m->job = NULL;
  }
  double t = s->cfg.job_timeout_s > 0 ? s->cfg.job_timeout_s : 30.0;
  pe_srv_job_self self = {fnv1a(rq->program.data, rq->program.len),
                          pe_srv_model_has_values(m),
                          p->params,
                          p->n_params,
                          s->cfg.job_host,
                          (int)(t * 1000.0),
                          m->kind != PE_PLACE_CPU ? pe_node_comm_backend_of(m->kind) : NULL,
                          pe_model_devices(m->m),
                          m->n_places,
                          m->kind};
  pe_srv_job *j = NULL;
  PE_TRY(pe_srv_job_form(spec, &self, &j));
  pe_status *st = NULL;
  if (pe_srv_job_root_has_values(j)) {
    st = pe_srv_job_broadcast_values(j, m->m, p->params, p->n_params);
    for (int i = 0; !st && i < p->n_params; i++)
      if (!pe_strmap_put(&m->initialized, p->params[i].name, (void *)1))
        st = pe_error(PE_ENOMEM, "register: out of memory");
  }
  if (st) {
    pe_srv_job_free(j);
    return st;
  }
  m->job = j;
  pe_model_set_node_comm(m->m, pe_srv_job_comm(j));
  pe_model_set_node_dcomm(m->m, pe_srv_job_dcomm(j));
  return NULL;
}

pe_status *pe_srv_job_join(pe_server *s, pe_srv_program *p, const Pe__RegisterRequest *rq) {
  if (!rq->options || !rq->options->job) return NULL;
  PE_TRY(pe_srv_job_spec_check(rq->options->job));
  pe_srv_model *m = p->model;
  /* Device places sum their gradients across nodes over their backend's
   * communicator (cuda: NCCL); a kind without one cannot join a job. */
  if (m->kind != PE_PLACE_CPU && !pe_node_comm_backend_of(m->kind))
    return pe_error(PE_EINVAL,
                    "register: job '%s': model '%s' lives on %s:%d; this daemon has no "
                    "communicator across nodes for %s places (a job trains on cpu places, or "
                    "on cuda places in a daemon built with CUDA and NCCL)",
                    rq->options->job->name, m->name, pe_place_kind_name(m->kind), m->n_places,
                    pe_place_kind_name(m->kind));
  pthread_mutex_lock(&m->init_mu);
  pe_status *st = form_locked(s, p, rq);
  pthread_mutex_unlock(&m->init_mu);
  return st;
}

pe_status *pe_srv_job_after_init(pe_srv_program *p) {
  pe_srv_model *m = p->model;
  if (!m->job) return NULL;
  return pe_status_wrap(pe_srv_job_broadcast_values(m->job, m->m, p->params, p->n_params),
                        "init: taking rank 0's initial values");
}

pe_status *pe_srv_job_check_formed(pe_srv_program *p) {
  if (!p->in_job) return NULL;
  pe_srv_model *m = p->model;
  pthread_mutex_lock(&m->init_mu);
  bool ok = m->job && !pe_srv_job_broken(m->job);
  pthread_mutex_unlock(&m->init_mu);
  if (ok) return NULL;
  return pe_error(PE_EINVAL,
                  "run: model '%s' trains in a job across nodes that is %s: register the "
                  "program again with its job spec to form the job (and resume from a "
                  "checkpoint taken on every node at one step)",
                  m->name, m->job ? "broken (a peer was lost)" : "not formed");
}
