/* Connections that end before delivering a request (conn_watch.h). */
#include "server/conn_watch.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Open addressing over PE_CONN_WATCH_IDS * 2 slots; 0 marks a free slot,
 * so ids are stored + 1 (an id is 31 bits: nanomsg's pipe keys). */
#define SLOTS (PE_CONN_WATCH_IDS * 2)

struct pe_conn_watch {
  uint32_t *slots;
  int used;
  bool has_last;
  uint32_t last;      /* the id of the last message: most follow one another */
  uint64_t delivered; /* D: connections that delivered a message */
  uint64_t reported;  /* the highest A - C - D reported so far */
};

pe_conn_watch *pe_conn_watch_new(void) {
  pe_conn_watch *w = calloc(1, sizeof *w);
  if (w && !(w->slots = calloc(SLOTS, sizeof *w->slots))) {
    free(w);
    w = NULL;
  }
  return w;
}

void pe_conn_watch_free(pe_conn_watch *w) {
  if (!w) return;
  free(w->slots);
  free(w);
}

/* The connection id of a raw REP message: the first 4 bytes (big endian)
 * of its SP header; false when there is none. */
static bool pipe_id(const struct nn_msghdr *hdr, uint32_t *id) {
  for (struct nn_cmsghdr *c = NN_CMSG_FIRSTHDR(hdr); c; c = NN_CMSG_NXTHDR(hdr, c)) {
    if (c->cmsg_level != PROTO_SP || c->cmsg_type != SP_HDR) continue;
    const unsigned char *p = NN_CMSG_DATA(c);
    size_t len = c->cmsg_len - NN_CMSG_SPACE(0), sp;
    if (len < sizeof sp + 4) return false;
    memcpy(&sp, p, sizeof sp);
    if (sp < 4 || sp > len - sizeof sp) return false;
    p += sizeof sp;
    *id = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    return true;
  }
  return false;
}

void pe_conn_watch_message(pe_conn_watch *w, const struct nn_msghdr *hdr) {
  uint32_t id;
  if (!w || !pipe_id(hdr, &id) || (w->has_last && id == w->last)) return;
  w->has_last = true;
  w->last = id;
  uint32_t key = (id & 0x7fffffffu) + 1;
  size_t i = (size_t)(key * 2654435761u) % SLOTS;
  while (w->slots[i] && w->slots[i] != key) i = (i + 1) % SLOTS;
  if (w->slots[i]) return;            /* seen */
  if (w->used == PE_CONN_WATCH_IDS) { /* full: start again (see the header) */
    memset(w->slots, 0, SLOTS * sizeof *w->slots);
    w->used = 0;
    i = (size_t)(key * 2654435761u) % SLOTS;
  }
  w->slots[i] = key;
  w->used++;
  w->delivered++;
}

uint64_t pe_conn_watch_poll(pe_conn_watch *w, int sock) {
  if (!w) return 0;
  /* Accepted first: one accepted between the two reads counts as open. */
  uint64_t accepted = nn_get_statistic(sock, NN_STAT_ACCEPTED_CONNECTIONS);
  uint64_t open = nn_get_statistic(sock, NN_STAT_CURRENT_CONNECTIONS);
  if (accepted == (uint64_t)-1 || open == (uint64_t)-1 || accepted < open + w->delivered) return 0;
  uint64_t silent = accepted - open - w->delivered;
  if (silent <= w->reported) return 0;
  uint64_t fresh = silent - w->reported;
  w->reported = silent;
  return fresh;
}
