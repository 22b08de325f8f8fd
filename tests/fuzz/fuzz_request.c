/* Requests off the socket, through the daemon's own two steps: the main
 * thread's peek (server/request_peek.h), which queues a request in its lane
 * before any request thread unpacks it, and the request thread's decode
 * (server/request_decode.h), protobuf-c's unpack within a decode budget.
 * Properties:
 *  - a request the daemon decodes has the client id, request id, body kind
 *    and Run handle it was routed on: no request waits in another client's
 *    lane or is ordered after the wrong run;
 *  - the decode budget holds: what a decode allocates stays within its
 *    limit, and all of it is given back when the request is freed;
 *  - where the peek and protobuf-c both read the bytes, they agree
 *    (pe_request_peek_agrees): otherwise the peek has drifted from
 *    protobuf-c and the daemon refuses requests it should take. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "server/request_decode.h"
#include "server/request_peek.h"

/* A budget small enough that the fuzzer meets it, large enough for the
 * seeds (real requests of a few KiB). */
#define FUZZ_DECODE_LIMIT (256 * 1024)

static void fail(const char *what) {
  fprintf(stderr, "fuzz_request: %s\n", what);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pe_request_peek pk;
  bool routed = pe_request_peek_read(data, size, &pk);
  pe_decode_pool pool = {0};
  pe_decode_budget b;
  pe_decode_budget_init(&b, &pool, 2 * FUZZ_DECODE_LIMIT, FUZZ_DECODE_LIMIT);
  Pe__Request *rq = NULL;
  pe_status *st = pe_request_decode(data, size, routed ? &pk : NULL, &b, &rq);
  if (st) {
    if (rq) fail("a refused decode returned a request");
    pe_status_free(st);
  } else {
    if (!routed) fail("bytes the peek refused were decoded");
    if (!pe_request_peek_matches(&pk, rq)) fail("a decoded request differs from its routing");
    if (b.used > FUZZ_DECODE_LIMIT) fail("a decode went past its budget");
    pe__request__free_unpacked(rq, &b.alloc);
  }
  if (b.used != 0 || atomic_load(&pool.used) != 0) fail("a decode kept bytes of its budget");
  if (!pe_request_peek_agrees(data, size)) {
    fprintf(stderr, "fuzz_request: peek client %" PRIu64 " kind %d handle %" PRIu64 "\n", pk.client,
            (int)pk.kind, pk.run_handle);
    fail("the peek and protobuf-c read the bytes differently");
  }
  return 0;
}
