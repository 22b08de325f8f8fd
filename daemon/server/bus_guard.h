/* A memcpy that survives SIGBUS.
 *
 * The daemon reads client shared memory that the client may truncate at any
 * time (a bug or on purpose); touching a page past the object's new end
 * raises SIGBUS, which would kill the daemon and every other client's work.
 * pe_bus_guarded_copy copies under a per-thread recovery point: a SIGBUS
 * raised by that copy unwinds to it and becomes an error. A SIGBUS anywhere
 * else keeps its previous disposition (default: the process dies with a
 * core), so real faults are not hidden.
 *
 * The handler is installed once per process on first use. Thread-safe. */
#ifndef PE_SERVER_BUS_GUARD_H
#define PE_SERVER_BUS_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Copy n bytes from src to dst. Returns false when reading src raised SIGBUS
 * (dst then holds an unspecified prefix). */
bool pe_bus_guarded_copy(void *dst, const void *src, size_t n);
/* The same for n rows of `row` bytes: dst's row i is src's row rows[i]
 * (rows NULL: src's rows 0..n-1), under one recovery point. */
bool pe_bus_guarded_gather(void *dst, const void *src, const int64_t *rows, int64_t n, size_t row);

#endif
