/* Reply packing with its two fallbacks (contract in reply_pack.h). */
#include "server/reply_pack.h"

#include <stdio.h>

#include "core/status.h"

/* Turn rep into an error reply (ids kept, body dropped) with rb's message;
 * its packed size. */
static size_t to_error(Pe__Reply *rep, pe_reply_buf *rb, int code) {
  rep->code = code;
  rep->message = rb->message;
  rep->body_case = PE__REPLY__BODY__NOT_SET;
  return pe__reply__get_packed_size(rep);
}

const uint8_t *pe_reply_pack(Pe__Reply *rep, int64_t max_message, pe_reply_alloc_fn alloc,
                             pe_reply_buf *rb, size_t *len, bool *owned) {
  rep->max_message = max_message > 0 ? (uint64_t)max_message : 0;
  size_t n = pe__reply__get_packed_size(rep);
  if ((int64_t)n > max_message) {
    snprintf(rb->message, sizeof rb->message,
             "reply of %zu bytes exceeds max_message %lld (fetch less per request; the request "
             "itself was carried out)",
             n, (long long)max_message);
    n = to_error(rep, rb, PE_EINVAL);
  }
  uint8_t *buf = alloc(n ? n : 1);
  if (buf) {
    pe__reply__pack(rep, buf);
    *len = n;
    *owned = true;
    return buf;
  }
  /* The request was applied (a run's update, a checkpoint): say so, so that
   * the client does not take this for a request that failed. */
  snprintf(rb->message, sizeof rb->message,
           "out of memory for the reply (%zu bytes): the request was carried out, but its "
           "results cannot be sent",
           n);
  to_error(rep, rb, PE_ENOMEM);
  *len = pe__reply__pack(rep, rb->notice);
  *owned = false;
  return rb->notice;
}
