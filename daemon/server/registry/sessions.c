/* Client sessions of the registry (registry/registry.h): opened by a client's first
 * request, ended by its close, by its expiry (ttl_s idle, no request in
 * flight) or by the sweep that finds its process gone; ending one drops
 * the client's ownerships, and programs left without owners go. */
#include <stdlib.h>

#include "core/log.h"
#include "server/client_tag.h"
#include "server/registry/internal.h"
#include "shm_owner.h"

/* The client's session (lock held), opened when missing; NULL: no memory. */
static session *session_open_locked(pe_registry *r, uint64_t client, double now) {
  for (int i = 0; i < r->n_sessions; i++)
    if (r->sessions[i].client == client) return &r->sessions[i];
  if (!pe_reg_grow((void **)&r->sessions, &r->cap_sessions, r->n_sessions + 1, sizeof *r->sessions))
    return NULL;
  /* Debug only: the id with its tag, to read the info lines by. */
  PE_LOGD("session %s opened: client %016llx", pe_client_tag(client).s, (unsigned long long)client);
  r->sessions[r->n_sessions] = (session){.client = client, .last_seen = now};
  return &r->sessions[r->n_sessions++];
}

/* Record the client's process (lock held) once it is seen from here: a
 * pid that names no process, or one started at another time, is of
 * another pid namespace (a container sharing the socket), where the
 * sweep would take a live client for gone; such a session has the TTL
 * only. Checked when the pid changes: one /proc read per session. */
static void session_set_process_locked(session *x, long pid, uint64_t start) {
  if (pid <= 0 || (x->pid == pid && x->start == start)) return;
  if (pe_shm_owner_gone(pid, start)) {
    PE_LOGD("session %016llx: client pid %ld (start %llu) is not visible here; TTL only",
            (unsigned long long)x->client, pid, (unsigned long long)start);
    x->pid = 0;
    return;
  }
  x->pid = pid;
  x->start = start;
}

void pe_registry_request_begin(pe_registry *r, uint64_t client, long pid, uint64_t start,
                               double now) {
  pthread_mutex_lock(&r->mu);
  session *x = session_open_locked(r, client, now);
  if (x) {
    x->last_seen = now;
    x->in_flight++;
    session_set_process_locked(x, pid, start);
  }
  pthread_mutex_unlock(&r->mu);
}

void pe_registry_request_end(pe_registry *r, uint64_t client, long pid, uint64_t start,
                             double now) {
  pthread_mutex_lock(&r->mu);
  /* Opened again when a close (or drop) ended it meanwhile: a register
   * that finished after it left programs this session must expire. */
  session *x = session_open_locked(r, client, now);
  if (x) {
    x->last_seen = now;
    if (x->in_flight > 0) x->in_flight--;
    session_set_process_locked(x, pid, start);
  }
  pthread_mutex_unlock(&r->mu);
}

/* Drop the client's ownerships; collect up to max programs (and models)
 * to free (lock held). Stops once max are collected, leaving the rest of
 * the client's programs owned for the next call; *owned counts the
 * programs given up by this call. */
static int drop_client_locked(pe_registry *r, uint64_t client, pe_srv_program **fps,
                              pe_srv_model **fms, int max, int *owned) {
  int n = 0;
  *owned = 0;
  for (int i = 0; i < r->n_sessions; i++)
    if (r->sessions[i].client == client) {
      r->sessions[i] = r->sessions[--r->n_sessions];
      break;
    }
  /* Downwards: an unlink moves the last program into slot i, one already seen. */
  for (int i = r->n_progs - 1; i >= 0 && n < max; i--) {
    pe_srv_program *p = r->progs[i];
    bool owner = false;
    for (int k = 0; k < p->n_owners; k++) owner |= p->owners[k] == client;
    if (!owner) continue;
    ++*owned;
    pe_reg_drop_owner_locked(p, client);
    pe_reg_prog_maybe_unlink(r, p, &fps[n], &fms[n]);
    if (fps[n] || fms[n]) n++;
  }
  return n;
}

int pe_registry_drop_client(pe_registry *r, uint64_t client) {
  enum { MAX = 64 };
  pe_srv_program *fps[MAX];
  pe_srv_model *fms[MAX];
  int total = 0, n;
  do { /* Rounds of MAX: freeing waits for the engine, so it is done unlocked. */
    int owned;
    pthread_mutex_lock(&r->mu);
    n = drop_client_locked(r, client, fps, fms, MAX, &owned);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n; i++) pe_reg_destroy_later(fps[i], fms[i]);
    total += owned;
  } while (n == MAX);
  return total;
}

int pe_registry_expire(pe_registry *r, double now, double ttl_s, uint64_t *ids, int max) {
  enum { IDLE = 1, GONE = 2, MAX = 64 };
  int n = 0;
  char why[MAX];
  if (max > MAX) max = MAX;
  pthread_mutex_lock(&r->mu);
  /* A session with a request in flight is never idle; its process's exit is
   * acted on once the request is done (the engine holds its programs). */
  for (int i = 0; i < r->n_sessions && n < max; i++) {
    const session *x = &r->sessions[i];
    if (x->in_flight > 0) continue;
    if (ttl_s > 0 && now - x->last_seen > ttl_s)
      why[n] = IDLE;
    else if (x->pid > 0 && pe_shm_owner_gone(x->pid, x->start))
      why[n] = GONE;
    else
      continue;
    ids[n++] = x->client;
  }
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; i < n; i++) {
    if (why[i] == IDLE)
      PE_LOGI("session %s expired after %.0f s idle: dropping its programs",
              pe_client_tag(ids[i]).s, ttl_s);
    else
      PE_LOGI("session %s: its client process has exited: dropping its programs",
              pe_client_tag(ids[i]).s);
    pe_registry_drop_client(r, ids[i]);
  }
  return n;
}
