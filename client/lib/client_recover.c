/* Recovery from a daemon that lost this client's programs: it restarted
 * (its programs and shared-memory regions are gone; a persistent model
 * comes back from its restart checkpoint when registered again), or this
 * client's session expired. The handle keeps a copy of what it registered,
 * and a request that gets NOT_FOUND registers the program (and the
 * regions) again and is sent once more, under a new request id.
 *
 * Exactly once. The register reply says which of this client's requests
 * the model's parameters include (applied_request, applied_steps, from the
 * restored checkpoint after a restart). A request at or below it already
 * reached the parameters: it is not sent again (ALREADY_APPLIED, its
 * fetches are lost). Runs answered earlier but newer than it were rolled
 * back by the restore; they are counted for pe_client_recovery_info. With
 * fail_on_rollback the lost run is then not sent (ROLLED_BACK): the caller
 * repeats the rolled-back work first, in its order.
 *
 * Ids the caller holds stay valid: a program's handle is a content hash
 * (the same after a restart) and regions are mapped from the id the caller
 * got to the daemon's current one. Owned by the handle; one thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"

#define ANSWERED_MAX 4096 /* answered runs remembered per program */

typedef struct pec_prog {
  uint64_t handle;
  pe_client_register_args args; /* points into the copies below */
  uint8_t *program;
  char *model, *places, *loss, *sync;
  char *job, *job_rendezvous, *job_token;
  char **keep;
  /* This client's answered runs of the program: a ring of ANSWERED_MAX,
   * n_ans of them from ans_start, oldest first (ids grow). */
  uint64_t *ans_request;
  uint32_t *ans_steps;
  size_t ans_start, n_ans;
  bool ans_dropped; /* the ring overflowed: older runs are forgotten */
  struct pec_prog *next;
} pec_prog;

typedef struct pec_region {
  uint64_t given, now; /* the id the caller holds; the daemon's id now */
  char *name;
  uint64_t size;
  uint8_t token[PE_SHM_TOKEN_LEN]; /* sent again: the trailer's */
  bool has_token;
  struct pec_region *next;
} pec_region;

static char *dup_or_null(const char *s) {
  return s ? strdup(s) : NULL;
}

static void prog_free(pec_prog *p) {
  free(p->program);
  free(p->model);
  free(p->places);
  free(p->loss);
  free(p->sync);
  free(p->job);
  free(p->job_rendezvous);
  free(p->job_token);
  for (size_t i = 0; p->keep && i < p->args.n_keep; i++) free(p->keep[i]);
  free(p->keep);
  free(p->ans_request);
  free(p->ans_steps);
  free(p);
}

static pec_prog *find_prog(pe_client *c, uint64_t handle, const char *model) {
  for (pec_prog *p = c->progs; p; p = p->next)
    if (model ? !strcmp(p->model, model) : p->handle == handle) return p;
  return NULL;
}

int pec_prog_remember(pe_client *c, const pe_client_register_args *a, uint64_t handle) {
  if (find_prog(c, handle, NULL)) return 0;
  pec_prog *p = calloc(1, sizeof *p);
  if (!p) return pec_fail(c, PE_C_ENOMEM, "register: remembering the program");
  p->handle = handle;
  p->args = *a;
  p->program = malloc(a->program_len);
  p->model = strdup(a->model);
  p->places = dup_or_null(a->places);
  p->loss = dup_or_null(a->loss);
  p->sync = dup_or_null(a->sync);
  p->job = dup_or_null(a->job);
  p->job_rendezvous = dup_or_null(a->job_rendezvous);
  p->job_token = dup_or_null(a->job_token);
  p->keep = a->n_keep ? calloc(a->n_keep, sizeof *p->keep) : NULL;
  if (!a->for_test) { /* the ledger: evaluation runs change nothing */
    p->ans_request = malloc(ANSWERED_MAX * sizeof *p->ans_request);
    p->ans_steps = malloc(ANSWERED_MAX * sizeof *p->ans_steps);
  }
  bool ok = p->program && p->model && (!a->places || p->places) && (!a->loss || p->loss) &&
            (!a->sync || p->sync) && (!a->n_keep || p->keep) && (!a->job || p->job) &&
            (!a->job_rendezvous || p->job_rendezvous) && (!a->job_token || p->job_token) &&
            (a->for_test || (p->ans_request && p->ans_steps));
  for (size_t i = 0; ok && i < a->n_keep; i++) ok = (p->keep[i] = strdup(a->keep[i])) != NULL;
  if (!ok) {
    p->args.n_keep = a->n_keep;
    prog_free(p);
    return pec_fail(c, PE_C_ENOMEM, "register: remembering the program");
  }
  memcpy(p->program, a->program, a->program_len);
  p->args.program = p->program;
  p->args.model = p->model;
  p->args.places = p->places;
  p->args.loss = p->loss;
  p->args.sync = p->sync;
  p->args.job = p->job;
  p->args.job_rendezvous = p->job_rendezvous;
  p->args.job_token = p->job_token;
  p->args.keep = (const char *const *)p->keep;
  p->next = c->progs;
  c->progs = p;
  return 0;
}

void pec_prog_forget(pe_client *c, uint64_t handle) {
  for (pec_prog **pp = &c->progs; *pp; pp = &(*pp)->next)
    if ((*pp)->handle == handle) {
      pec_prog *p = *pp;
      *pp = p->next;
      prog_free(p);
      return;
    }
}

void pec_prog_forget_model(pe_client *c, const char *model) {
  for (pec_prog *p; (p = find_prog(c, 0, model));) pec_prog_forget(c, p->handle);
}

void pec_prog_answered(pe_client *c, uint64_t handle, uint64_t request, uint32_t steps) {
  pec_prog *p = find_prog(c, handle, NULL);
  if (!p || !p->ans_request) return; /* unknown, or an evaluation program */
  if (p->n_ans == ANSWERED_MAX) {    /* drop the oldest */
    p->ans_start = (p->ans_start + 1) % ANSWERED_MAX;
    p->n_ans--;
    p->ans_dropped = true;
  }
  size_t at = (p->ans_start + p->n_ans++) % ANSWERED_MAX;
  p->ans_request[at] = request;
  p->ans_steps[at] = steps ? steps : 1;
}

/* The token to send again (NULL: none was sent, so none is kept). */
static void region_set_token(pec_region *r, const uint8_t *token) {
  if (!token) return;
  memcpy(r->token, token, PE_SHM_TOKEN_LEN);
  r->has_token = true;
}

int pec_region_remember(pe_client *c, const char *name, uint64_t size,
                        const uint8_t token[PE_SHM_TOKEN_LEN], uint64_t id) {
  for (pec_region *r = c->regions; r; r = r->next)
    if (r->size == size && !strcmp(r->name, name)) {
      r->now = id;
      region_set_token(r, token);
      return 0;
    }
  pec_region *r = calloc(1, sizeof *r);
  if (!r || !(r->name = strdup(name))) {
    free(r);
    return pec_fail(c, PE_C_ENOMEM, "register_shm: remembering region %s", name);
  }
  r->given = r->now = id;
  r->size = size;
  region_set_token(r, token);
  r->next = c->regions;
  c->regions = r;
  return 0;
}

void pec_region_forget(pe_client *c, uint64_t given) {
  for (pec_region **pp = &c->regions; *pp; pp = &(*pp)->next)
    if ((*pp)->given == given) {
      pec_region *r = *pp;
      *pp = r->next;
      free(r->name);
      free(r);
      return;
    }
}

uint64_t pec_region_now(const pe_client *c, uint64_t given) {
  for (const pec_region *r = c->regions; r; r = r->next)
    if (r->given == given) return r->now;
  return given;
}

void pec_recover_free(pe_client *c) {
  while (c->progs) {
    pec_prog *p = c->progs;
    c->progs = p->next;
    prog_free(p);
  }
  while (c->regions) pec_region_forget(c, c->regions->given);
}

void pe_client_recovery_info(const pe_client *c, pe_client_recovery *out) {
  if (out) *out = c ? c->recovery : (pe_client_recovery){0};
}

/* The runs of p answered after what the parameters include (request,
 * steps): counted into c->recovery and forgotten. The count is exact when
 * it stopped at a run the parameters include, or the ring never dropped
 * one. */
static void count_rolled_back(pe_client *c, pec_prog *p, uint64_t request, uint32_t steps) {
  uint64_t runs = 0, lost = 0;
  bool bounded = false;
  for (; p->n_ans > 0; p->n_ans--) {
    size_t at = (p->ans_start + p->n_ans - 1) % ANSWERED_MAX;
    if (p->ans_request[at] == request && p->ans_steps[at] > steps) {
      lost += p->ans_steps[at] - steps; /* partly in the parameters */
      p->ans_steps[at] = steps;
    }
    if ((bounded = p->ans_request[at] <= request)) break;
    runs++;
    lost += p->ans_steps[at];
  }
  c->recovery.rolled_back_runs = runs;
  c->recovery.rolled_back_steps = lost;
  c->recovery.rolled_back_exact = bounded || !p->ans_request || !p->ans_dropped;
}

int pec_recover(pe_client *c, const char *what, int code, uint64_t handle, const char *model,
                uint64_t request, bool need_values) {
  pec_prog *p = c->no_recover || code != PE_C_ENOTFOUND ? NULL : find_prog(c, handle, model);
  if (!p) return code;
  char first[PEC_ERR_LEN];
  snprintf(first, sizeof first, "%s", c->err);
  /* Regions first: the daemon answers a region it still has with its id. */
  int rc = 0;
  for (pec_region *r = c->regions; r && !c->silent; r = r->next) {
    uint64_t id;
    if (pec_register_shm(c, r->name, r->size, r->has_token ? r->token : NULL, &id) == 0)
      r->now = id;
  }
  /* A daemon that did not answer a region's register is not asked again:
   * each request would wait a whole timeout more. */
  pe_client_program out;
  if (!c->silent)
    rc = pe_client_register(c, &p->args, &out);
  else
    rc = PE_C_ETIMEDOUT;
  if (rc) {
    char again[PEC_ERR_LEN];
    snprintf(again, sizeof again, "%s", c->err);
    /* A daemon that no longer answers is what the caller must act on (a
     * trainer exits "unreachable"), not the NOT_FOUND that started this. */
    if (rc == PE_C_ETIMEDOUT || rc == PE_C_ECONNECT) code = rc;
    return pec_fail(c, code, "%s (registering program 0x%016llx of model '%s' again failed: %s)",
                    first, (unsigned long long)p->handle, p->model, again);
  }
  if (out.handle != p->handle) /* same program bytes and options: same hash */
    return pec_fail(c, PE_C_EPROTO,
                    "%s (registered again, program 0x%016llx of model '%s' got handle 0x%016llx)",
                    first, (unsigned long long)p->handle, p->model, (unsigned long long)out.handle);
  if (out.existed) return 0; /* the program is there: the NOT_FOUND was a region's, or not ours */
  c->recovery.recoveries++;
  c->recovery.handle = p->handle;
  c->recovery.applied_request = out.applied_request;
  c->recovery.applied_steps = out.applied_steps;
  count_rolled_back(c, p, out.applied_request, out.applied_steps);
  if (need_values && !out.has_values)
    return pec_fail(c, code,
                    "%s: the daemon lost program 0x%016llx (it restarted, or this client's session "
                    "expired) and model '%s' came back without parameters (%s); register and "
                    "init it again",
                    what, (unsigned long long)p->handle, p->model,
                    p->args.persistent ? "no restart checkpoint" : "the model is not persistent");
  if (request && out.applied_request >= request)
    return pec_fail(c, PE_C_EALREADY,
                    "%s: request %llu reached model '%s' before the daemon lost program 0x%016llx "
                    "(%u step(s) of it are in the restored parameters); it is not applied again "
                    "and its fetches are lost",
                    what, (unsigned long long)request, p->model, (unsigned long long)p->handle,
                    out.applied_steps);
  if (request && c->fail_on_rollback && c->recovery.rolled_back_steps)
    return pec_fail(c, PE_C_EROLLEDBACK,
                    "%s: request %llu not sent: the daemon lost program 0x%016llx and model '%s' "
                    "came back from a checkpoint without %llu answered request(s), %llu step(s), "
                    "of this client's",
                    what, (unsigned long long)request, (unsigned long long)p->handle, p->model,
                    (unsigned long long)c->recovery.rolled_back_runs,
                    (unsigned long long)c->recovery.rolled_back_steps);
  return 0;
}

/* Pings until a daemon that handles requests answers, or restart_wait_ms
 * passes: the stopping daemon answers each ping SHUTTING_DOWN at once
 * while it drains, then reads nothing; nanomsg sends the ping again on the
 * connection to a daemon that binds the address after it. The daemon's
 * reason is what the caller gets when none answers. */
int pec_wait_restart(pe_client *c) {
  if (c->restart_wait_ms < 0) return PE_C_ESHUTDOWN;
  char first[PEC_ERR_LEN];
  snprintf(first, sizeof first, "%s", c->err);
  /* The shutdown reply (a run's steps) outlives the pings, for the caller. */
  Pe__Reply *kept = c->reply;
  c->reply = NULL;
  int timeout = c->timeout_ms, wait = c->restart_wait_ms < timeout ? c->restart_wait_ms : timeout;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc, left = wait;
  do {
    c->timeout_ms = left;
    rc = pe_client_ping(c);
    if (rc != PE_C_ESHUTDOWN) break;
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL); /* still draining */
    clock_gettime(CLOCK_MONOTONIC, &now);
    left = wait - (int)((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
  } while (left > 0);
  c->timeout_ms = timeout;
  if (!rc) {
    pe__reply__free_unpacked(kept, NULL);
    return pec_fail(c, PE_C_ENOTFOUND,
                    "%s (a daemon answered again on %s: restarted, without this client's "
                    "programs)",
                    first, c->address);
  }
  if (c->reply) pe__reply__free_unpacked(c->reply, NULL);
  c->reply = kept;
  return pec_fail(c, PE_C_ESHUTDOWN, "%s; no daemon answered on %s within %d ms after it", first,
                  c->address, wait);
}
