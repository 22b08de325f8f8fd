/* Decoding a request within its budget and as it was routed (see
 * request_decode.h). */
#include "server/request_decode.h"

#include "server/client_tag.h"
#include "server/dispatch.h"

pe_status *pe_request_decode(const uint8_t *buf, size_t len, const pe_request_peek *routed,
                             pe_decode_budget *b, Pe__Request **out) {
  *out = NULL;
  if (!routed)
    return pe_error(PE_EINVAL,
                    "malformed request: %zu bytes are not a pe.Request protobuf the daemon reads "
                    "(garbage, truncated, a group or an unknown wire type, a key over 5 bytes or "
                    "field number 0)",
                    len);
  Pe__Request *rq = pe__request__unpack(&b->alloc, len, buf);
  if (!rq) {
    pe_status *st = pe_decode_budget_error(b, "request", len);
    return st ? st
              : pe_error(PE_EINVAL,
                         "malformed request: %zu bytes are not a pe.Request protobuf (garbage or "
                         "truncated)",
                         len);
  }
  if (!pe_request_peek_matches(routed, rq)) {
    pe_status *st = pe_error(
        PE_EINVAL,
        "malformed request: its bytes route it as client %s, request %llu, kind %s, run handle "
        "0x%llx, but it decodes as client %s, request %llu, kind %s, run handle 0x%llx; not "
        "handled",
        pe_client_tag(routed->client).s, (unsigned long long)routed->request,
        pe_request_kind_name(routed->kind), (unsigned long long)routed->run_handle,
        pe_client_tag(rq->client_id).s, (unsigned long long)rq->request_id,
        pe_request_kind_name(rq->body_case),
        (unsigned long long)(rq->body_case == PE__REQUEST__BODY_RUN && rq->run ? rq->run->handle
                                                                               : 0));
    pe__request__free_unpacked(rq, &b->alloc);
    return st;
  }
  *out = rq;
  return NULL;
}
