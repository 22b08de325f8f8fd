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

/* Copy n bytes from src to dst. Returns false when reading src raised SIGBUS
 * (dst then holds an unspecified prefix). */
bool pe_bus_guarded_copy(void *dst, const void *src, size_t n);

#endif
