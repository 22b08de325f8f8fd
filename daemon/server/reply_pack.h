/* Packing a reply so that every request gets one (a request is applied
 * once and answered, resends included). Every reply
 * carries max_message, so that clients refuse larger requests themselves.
 *
 * A reply that cannot go out as built is replaced by an error reply that
 * keeps the ids and drops the body:
 *   - packed, it is over max_message (the client's socket would refuse it):
 *     INVALID_ARGUMENT, "fetch less per request";
 *   - its buffer cannot be allocated: OUT_OF_MEMORY, saying that the
 *     request was carried out. This notice is packed into the caller's
 *     fixed buffer, so it needs no allocation: the reply cache then stores
 *     and answers it like any reply, and the request's resends get it too
 *     instead of waiting on an entry that never finishes.
 * Threads: any; no shared state. */
#ifndef PE_SERVER_REPLY_PACK_H
#define PE_SERVER_REPLY_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "service.pb-c.h"

/* The caller's storage for a replacement: its message, and the packed
 * notice (ids, code and a message of at most 255 bytes pack into far less
 * than its room). */
typedef struct pe_reply_buf {
  char message[256];
  uint8_t notice[512];
} pe_reply_buf;

typedef void *(*pe_reply_alloc_fn)(size_t bytes);

/* Pack rep. When it is replaced as above, rep's code, message and body say
 * so afterwards (the message in rb, for the caller's log). The bytes come
 * from alloc (*owned = true: the caller frees them with free()) or are
 * rb->notice (*owned = false). Never NULL. */
const uint8_t *pe_reply_pack(Pe__Reply *rep, int64_t max_message, pe_reply_alloc_fn alloc,
                             pe_reply_buf *rb, size_t *len, bool *owned);

#endif
