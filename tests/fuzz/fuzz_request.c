/* Requests off the socket: protobuf-c's unpack of a Request, and the main
 * thread's peek at the same bytes (server/request_peek.h), which queues a
 * request in its lane before any request thread unpacks it. Whatever unpack
 * accepts, the peek accepts too and reads the same client id, body kind and
 * Run handle from it: a request the peek misreads would wait in another
 * client's lane or be ordered after the wrong run. Bytes unpack refuses may
 * be refused or read by the peek (its thread answers the decode error). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "server/request_peek.h"
#include "service.pb-c.h"

/* The property failed: say how, and stop (libFuzzer keeps the input). */
static void disagree(const char *what, uint64_t unpacked, uint64_t peeked) {
  fprintf(stderr,
          "fuzz_request: unpack and peek disagree on %s: unpack %" PRIu64 ", peek %" PRIu64 "\n",
          what, unpacked, peeked);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pe_request_peek pk;
  bool peeked = pe_request_peek_read(data, size, &pk);
  Pe__Request *rq = pe__request__unpack(NULL, size, data);
  if (!rq) return 0;
  if (!peeked) disagree("whether the bytes are a request (1: accepted)", 1, 0);
  if (rq->client_id != pk.client) disagree("the client id", rq->client_id, pk.client);
  if (rq->body_case != pk.kind) disagree("the body kind", rq->body_case, pk.kind);
  uint64_t handle = rq->body_case == PE__REQUEST__BODY_RUN && rq->run ? rq->run->handle : 0;
  if (handle != pk.run_handle) disagree("the Run handle", handle, pk.run_handle);
  pe__request__free_unpacked(rq, NULL);
  return 0;
}
