/* Bounding what protobuf-c's decode of a request may allocate.
 *
 * protobuf-c allocates a structure per sub-message and a pointer per
 * repeated entry: a request of empty feeds grows the daemon by 64-70 bytes
 * per byte received, before any handler sees a count. Each unpack of a
 * request (and of a Register's ProgramDesc) therefore goes through a
 * budget's ProtobufCAllocator, which fails the allocation that would take
 * the message over its own limit ([limits] memory_per_request) or all the
 * messages being decoded or handled together over the daemon's
 * ([limits] memory_requests_total). protobuf-c then frees what it had
 * allocated and the unpack returns NULL; pe_decode_budget_error says which
 * limit it met.
 *
 * A message keeps its share of the pool until it is freed through the same
 * allocator (free_unpacked with &budget->alloc), so N request threads
 * holding decoded requests never hold more than the pool.
 * Threads: a budget belongs to the thread that decodes with it; the pool
 * is shared, its count atomic. */
#ifndef PE_SERVER_DECODE_BUDGET_H
#define PE_SERVER_DECODE_BUDGET_H

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* The daemon's decoded requests together. */
typedef struct pe_decode_pool {
  atomic_int_fast64_t used; /* bytes held by decoded messages */
} pe_decode_pool;

typedef struct pe_decode_budget {
  ProtobufCAllocator alloc; /* give it to unpack and free_unpacked */
  pe_decode_pool *pool;
  int64_t pool_limit;         /* 0: unlimited */
  int64_t used, limit;        /* this budget's bytes, its limit (0: unlimited) */
  bool over_limit, over_pool; /* an allocation was refused, and why */
} pe_decode_budget;

/* A budget of `limit` bytes (0: unlimited) drawing on pool (NULL: none)
 * up to pool_limit (0: unlimited). */
void pe_decode_budget_init(pe_decode_budget *b, pe_decode_pool *pool, int64_t pool_limit,
                           int64_t limit);

/* After an unpack through b returned NULL: the limit it met (PE_ENOMEM
 * "<what> (<len> bytes): decoding it takes more than [limits]
 * memory_per_request = N bytes ...", or PE_EEXHAUSTED naming
 * memory_requests_total: retry later), or NULL when none was met (the
 * bytes do not decode). */
pe_status *pe_decode_budget_error(const pe_decode_budget *b, const char *what, size_t len);

#endif
