/* A communicator across processes and machines over Gloo (CPU tensors).
 *
 * The ranks of one job meet at rank 0's rendezvous address (a small TCP
 * store rank 0 serves, daemon/net/tcp_store.h), are admitted there by the
 * job's name, token and world size, then connect a full mesh of Gloo TCP
 * pairs. Collectives run over that mesh.
 *
 * Failures never abort: every call returns a pe_status naming the job, this
 * rank and, where Gloo's error names a peer's address, that peer's rank.
 * A failed collective leaves the communicator broken; later calls return
 * the first failure. A dead peer is seen when its sockets close, a silent
 * one when the timeout runs out.
 *
 * SIGPIPE: Gloo's writes to a dead peer raise it; pe_gloo_comm_new sets it
 * to ignored when it is at its default (the daemon ignores it already).
 *
 * Threading: one thread at a time per communicator. */
#ifndef PE_NET_GLOO_COMM_H
#define PE_NET_GLOO_COMM_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PE_GLOO_DEFAULT_TIMEOUT_MS 30000

/* A value rank 0 hands every rank at rendezvous, under a key of the job's
 * store (e.g. an NCCL communicator's id): it reaches only ranks the job's
 * token admitted, and a value of another length is refused. */
typedef struct pe_gloo_shared {
  const char *key;   /* 1..64 characters of [A-Za-z0-9_.-] */
  const void *value; /* rank 0's: the len bytes it publishes; other ranks: unused */
  void *out;         /* every rank's copy of rank 0's value (rank 0's too) */
  size_t len;        /* 1..64 KiB; every rank expects this length */
} pe_gloo_shared;

typedef struct pe_gloo_opts {
  const char *job;   /* job name: the store's key prefix; non-empty */
  const char *token; /* the job's shared secret, checked at rendezvous; non-empty */
  const char
      *rendezvous;   /* rank 0's "HOST:PORT" ("[V6ADDR]:PORT" for IPv6); rank 0 listens there */
  const char *host;  /* address Gloo's pairs listen on; NULL: this machine's hostname */
  const char *iface; /* or the network interface to take it from (e.g. "eth0"); NULL: host */
  int rank;          /* 0 .. world_size-1 */
  int world_size;    /* >= 1 */
  int timeout_ms;    /* rendezvous and each collective; 0: PE_GLOO_DEFAULT_TIMEOUT_MS */
  const pe_gloo_shared *shared; /* NULL: none; else every rank of the job passes one */
} pe_gloo_opts;

typedef struct pe_gloo_comm pe_gloo_comm;

/* Joins the job: blocks until every rank has joined (or the timeout).
 * On success *out owns the communicator. */
pe_status *pe_gloo_comm_new(const pe_gloo_opts *o, pe_gloo_comm **out);

/* Sums buf[0..n) over the ranks, in place; every rank gets the same bits. */
pe_status *pe_gloo_allreduce_f32(pe_gloo_comm *c, float *buf, size_t n);

/* Sums each bufs[i][0..ns[i]) over the ranks, in place, as one collective
 * (the buffers are packed into one for the trip: a model's gradients in
 * one all-reduce). */
pe_status *pe_gloo_allreduce_f32_many(pe_gloo_comm *c, float *const *bufs, const size_t *ns,
                                      size_t nbufs);

/* Copies root's buf[0..bytes) to every other rank. */
pe_status *pe_gloo_broadcast(pe_gloo_comm *c, void *buf, size_t bytes, int root);

int pe_gloo_comm_rank(const pe_gloo_comm *c);
int pe_gloo_comm_size(const pe_gloo_comm *c);

void pe_gloo_comm_free(pe_gloo_comm *c);

#ifdef __cplusplus
}
#endif

#endif
