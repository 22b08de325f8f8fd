/* Collectives over host memory; the algorithm and the rules are in
 * collective.h.
 *
 * Locking. One mutex per group (c->mu) guards the list of active slots,
 * the free list and every slot's rendezvous fields (arrived, gen, the
 * description and bufs). The data phases run without it: the barriers
 * (mutex + condvar) order each rank's writes before its peers' reads.
 * A slot lives from the first part of an operation that arrives to the
 * last part that leaves the final barrier; that last part recycles it. */
#include "collective.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/place.h"

/* Chunks are multiples of 16 floats (64 bytes) so that two ranks never
 * write the same cache line. */
#define CHUNK_ALIGN 16
/* Reduce this many elements at a time in a stack buffer. */
#define BLOCK 1024

typedef struct slot {
  struct slot *next; /* active list or free list */
  uint64_t op_id;
  /* Description, set by the first part and checked against the others. */
  pe_coll_kind kind;
  pe_reduce_op red;
  int root;
  size_t count;
  bool bad;      /* some part disagreed: every part fails */
  char why[160]; /* the first disagreement */
  /* Barrier: arrivals since the last release, and releases so far. */
  int arrived;
  uint64_t gen;
  pthread_cond_t cv;
  float *bufs[]; /* rank -> buffer; NULL until that rank arrived */
} slot;

struct pe_comm {
  int n;
  pthread_mutex_t mu;
  slot *active;
  slot *free_slots;
};

pe_status *pe_comm_new(int n, pe_comm **out) {
  *out = NULL;
  if (n < 1 || n > PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "collective group of %d ranks: must be 1..%d", n, PE_MAX_PLACES);
  pe_comm *c = calloc(1, sizeof(*c));
  if (!c) return pe_error(PE_ENOMEM, "collective group: out of memory");
  c->n = n;
  pthread_mutex_init(&c->mu, NULL);
  *out = c;
  return NULL;
}

static void free_slots(slot *s) {
  while (s) {
    slot *n = s->next;
    pthread_cond_destroy(&s->cv);
    free(s);
    s = n;
  }
}

void pe_comm_free(pe_comm *c) {
  if (!c) return;
  free_slots(c->active); /* empty unless a part is still in flight (misuse) */
  free_slots(c->free_slots);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

int pe_comm_size(const pe_comm *c) {
  return c->n;
}

const char *pe_reduce_op_name(pe_reduce_op op) {
  return op == PE_REDUCE_MEAN ? "mean" : "sum";
}

static const char *kind_name(pe_coll_kind k) {
  return k == PE_COLL_BROADCAST ? "broadcast" : "all-reduce";
}

/* Under c->mu: the wait of one barrier round. Returns when all n parts
 * have called it for the current generation. */
static void barrier_locked(pe_comm *c, slot *s) {
  uint64_t g = s->gen;
  if (++s->arrived == c->n) {
    s->arrived = 0;
    s->gen++;
    pthread_cond_broadcast(&s->cv);
    return;
  }
  while (s->gen == g) pthread_cond_wait(&s->cv, &c->mu);
}

/* Under c->mu: find or open the slot of op_id and register this part.
 * Registration is the first barrier round's arrival. */
static slot *join_locked(pe_comm *c, const pe_coll_part *p, pe_status **st) {
  slot *s = c->active;
  while (s && s->op_id != p->op_id) s = s->next;
  if (!s) {
    s = c->free_slots;
    if (s) {
      c->free_slots = s->next;
    } else {
      s = malloc(sizeof(*s) + (size_t)c->n * sizeof(float *));
      if (!s) {
        *st = pe_error(PE_ENOMEM, "%s %llu: out of memory", kind_name(p->kind),
                       (unsigned long long)p->op_id);
        return NULL;
      }
      pthread_cond_init(&s->cv, NULL);
      s->gen = 0;
    }
    s->op_id = p->op_id;
    s->kind = p->kind;
    s->red = p->red;
    s->root = p->root;
    s->count = p->count;
    s->bad = false;
    s->why[0] = 0;
    s->arrived = 0;
    memset(s->bufs, 0, (size_t)c->n * sizeof(float *));
    s->next = c->active;
    c->active = s;
  } else if (s->bufs[p->rank]) {
    /* Not a disagreement of this operation: another operation reused an
     * id that is still in flight. Fail this part alone. */
    *st = pe_error(PE_EINVAL, "%s %llu: rank %d joined twice (op id reused while in flight)",
                   kind_name(p->kind), (unsigned long long)p->op_id, p->rank);
    return NULL;
  } else if (!s->bad && (s->kind != p->kind || s->count != p->count ||
                         (p->kind == PE_COLL_ALLREDUCE && s->red != p->red) ||
                         (p->kind == PE_COLL_BROADCAST && s->root != p->root))) {
    s->bad = true;
    snprintf(s->why, sizeof s->why,
             "rank %d passed %s of %zu floats (root %d, %s), others %s of %zu (root %d, %s)",
             p->rank, kind_name(p->kind), p->count, p->root, pe_reduce_op_name(p->red),
             kind_name(s->kind), s->count, s->root, pe_reduce_op_name(s->red));
  }
  /* A NULL buffer is legal when count == 0; mark arrival with a sentinel. */
  s->bufs[p->rank] = p->buf ? p->buf : (float *)s;
  return s;
}

/* Under c->mu: the final barrier; its last arrival recycles the slot. */
static void leave_locked(pe_comm *c, slot *s) {
  uint64_t g = s->gen;
  if (++s->arrived < c->n) {
    while (s->gen == g) pthread_cond_wait(&s->cv, &c->mu);
    return; /* s may already be reused: do not touch it */
  }
  s->arrived = 0;
  s->gen++;
  pthread_cond_broadcast(&s->cv);
  slot **pp = &c->active;
  while (*pp != s) pp = &(*pp)->next;
  *pp = s->next;
  s->next = c->free_slots;
  c->free_slots = s;
}

static void chunk_of(size_t count, int n, int q, size_t *lo, size_t *hi) {
  size_t per = (count + (size_t)n - 1) / (size_t)n;
  per = (per + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  size_t a = (size_t)q * per;
  *lo = a < count ? a : count;
  *hi = a + per < count ? a + per : count;
}

/* Rank p's reduce-scatter share: chunk p of every buffer into chunk p of
 * bufs[p]. Summed in rank order into a stack block (bufs[p] is an input
 * too, so it is only overwritten once a block is complete). */
static void reduce_chunk(float *const *bufs, int n, int p, size_t lo, size_t hi, pe_reduce_op red) {
  float acc[BLOCK];
  float fn = (float)n;
  for (size_t b = lo; b < hi; b += BLOCK) {
    size_t m = hi - b < BLOCK ? hi - b : BLOCK;
    memcpy(acc, bufs[0] + b, m * sizeof(float));
    for (int r = 1; r < n; r++) {
      const float *src = bufs[r] + b;
      for (size_t i = 0; i < m; i++) acc[i] += src[i];
    }
    if (red == PE_REDUCE_MEAN)
      for (size_t i = 0; i < m; i++) acc[i] /= fn;
    memcpy(bufs[p] + b, acc, m * sizeof(float));
  }
}

pe_status *pe_coll_part_run(void *arg) {
  const pe_coll_part *p = arg;
  pe_comm *c = p->comm;
  if (p->rank < 0 || p->rank >= c->n)
    return pe_error(PE_EINVAL, "%s %llu: rank %d out of range [0, %d)", kind_name(p->kind),
                    (unsigned long long)p->op_id, p->rank, c->n);
  /* Other argument errors are reported after the rendezvous, from state
   * every part sees, so that all parts fail together and none waits for
   * a peer that left. */
  if (c->n == 1 && p->kind == PE_COLL_ALLREDUCE) return NULL; /* sum/mean of one */

  pthread_mutex_lock(&c->mu);
  pe_status *st = NULL;
  slot *s = join_locked(c, p, &st);
  if (!s) {
    pthread_mutex_unlock(&c->mu);
    return st;
  }
  barrier_locked(c, s); /* round 1: all buffers registered */
  if (s->bad)
    st = pe_error(PE_EINVAL, "%s %llu: parts disagree: %s", kind_name(p->kind),
                  (unsigned long long)p->op_id, s->why);
  else if (p->kind == PE_COLL_BROADCAST && (p->root < 0 || p->root >= c->n))
    st = pe_error(PE_EINVAL, "broadcast %llu: root %d out of range [0, %d)",
                  (unsigned long long)p->op_id, p->root, c->n);
  /* Snapshot the buffers while holding the lock (round 1 published them). */
  float *bufs[PE_MAX_PLACES];
  memcpy(bufs, s->bufs, (size_t)c->n * sizeof(float *));
  pthread_mutex_unlock(&c->mu);

  int n = c->n, me = p->rank;
  /* Any rank with count > 0 and a NULL buffer registered the slot itself
   * as a sentinel: every rank sees it and fails the same way. */
  bool null_buf = false;
  for (int r = 0; r < n && p->count; r++) null_buf |= bufs[r] == (float *)s;
  if (!st && null_buf)
    st = pe_error(PE_EINVAL, "%s %llu: a rank passed a NULL buffer for %zu floats",
                  kind_name(p->kind), (unsigned long long)p->op_id, p->count);

  if (!st && p->kind == PE_COLL_ALLREDUCE) {
    size_t lo, hi;
    chunk_of(p->count, n, me, &lo, &hi);
    if (lo < hi) reduce_chunk(bufs, n, me, lo, hi, p->red);
    pthread_mutex_lock(&c->mu);
    barrier_locked(c, s); /* round 2: every chunk reduced */
    pthread_mutex_unlock(&c->mu);
    for (int q = 0; q < n; q++) {
      if (q == me) continue;
      chunk_of(p->count, n, q, &lo, &hi);
      if (lo < hi) memcpy(bufs[me] + lo, bufs[q] + lo, (hi - lo) * sizeof(float));
    }
  } else if (!st && p->kind == PE_COLL_BROADCAST && me != p->root && p->count) {
    memcpy(bufs[me], bufs[p->root], p->count * sizeof(float));
  }
  /* A failing part skips round 2; so do all its peers (the failure is
   * decided from state every part saw at round 1), so rounds match. */
  pthread_mutex_lock(&c->mu);
  leave_locked(c, s);
  pthread_mutex_unlock(&c->mu);
  return st;
}

pe_status *pe_allreduce_part(pe_comm *c, uint64_t op_id, int rank, float *buf, size_t count,
                             pe_reduce_op op) {
  pe_coll_part p = {.comm = c,
                    .op_id = op_id,
                    .rank = rank,
                    .kind = PE_COLL_ALLREDUCE,
                    .red = op,
                    .buf = buf,
                    .count = count};
  return pe_coll_part_run(&p);
}

pe_status *pe_broadcast_part(pe_comm *c, uint64_t op_id, int rank, int root, float *buf,
                             size_t count) {
  pe_coll_part p = {.comm = c,
                    .op_id = op_id,
                    .rank = rank,
                    .kind = PE_COLL_BROADCAST,
                    .root = root,
                    .buf = buf,
                    .count = count};
  return pe_coll_part_run(&p);
}
