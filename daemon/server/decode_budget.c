/* protobuf-c allocations counted against a message's and the daemon's
 * limits (see decode_budget.h). */
#include "server/decode_budget.h"

#include <stdlib.h>

/* Each block carries its size for free (protobuf-c passes the pointer
 * only), in a header that keeps the caller's block max-aligned. */
typedef union header {
  int64_t size;
  max_align_t align;
} header;

static void *budget_alloc(void *data, size_t size) {
  pe_decode_budget *b = data;
  if (size > (size_t)INT64_MAX - sizeof(header)) return NULL;
  int64_t n = (int64_t)(size + sizeof(header));
  if (b->limit > 0 && n > b->limit - b->used) {
    b->over_limit = true;
    return NULL;
  }
  if (b->pool) {
    int64_t was = atomic_fetch_add(&b->pool->used, n);
    if (b->pool_limit > 0 && was + n > b->pool_limit) {
      atomic_fetch_sub(&b->pool->used, n);
      b->over_pool = true;
      return NULL;
    }
  }
  header *h = malloc((size_t)n);
  if (!h) {
    if (b->pool) atomic_fetch_sub(&b->pool->used, n);
    return NULL;
  }
  h->size = n;
  b->used += n;
  return h + 1;
}

static void budget_free(void *data, void *p) {
  if (!p) return;
  pe_decode_budget *b = data;
  header *h = (header *)p - 1;
  b->used -= h->size;
  if (b->pool) atomic_fetch_sub(&b->pool->used, h->size);
  free(h);
}

void pe_decode_budget_init(pe_decode_budget *b, pe_decode_pool *pool, int64_t pool_limit,
                           int64_t limit) {
  *b = (pe_decode_budget){.alloc = {budget_alloc, budget_free, b},
                          .pool = pool,
                          .pool_limit = pool_limit,
                          .limit = limit};
}

pe_status *pe_decode_budget_error(const pe_decode_budget *b, const char *what, size_t len) {
  if (b->over_limit)
    return pe_error(PE_ENOMEM,
                    "%s (%zu bytes): decoding it takes more than [limits] memory_per_request = "
                    "%lld bytes (protobuf-c allocates a structure per entry: send fewer, larger "
                    "entries)",
                    what, len, (long long)b->limit);
  if (b->over_pool)
    return pe_error(PE_EEXHAUSTED,
                    "%s (%zu bytes): the requests being decoded and handled hold [limits] "
                    "memory_requests_total = %lld bytes; send it again once others finish",
                    what, len, (long long)b->pool_limit);
  return NULL;
}
