/* The memory the daemon may count on: the physical memory, or the memory
 * limit of the daemon's cgroup (and its ancestors') when lower, as under
 * systemd's MemoryMax= or in a container. The config's "N%" sizes
 * ([limits] memory_total, memory_per_run, ...) are shares of it: a share
 * of the host's RAM inside a cgroup of a tenth of it would let the kernel's
 * OOM killer end the daemon long before any limit refused anything.
 *
 * Threads: any (reads /proc and /sys each call). */
#ifndef PE_SERVER_HOST_MEMORY_H
#define PE_SERVER_HOST_MEMORY_H

#include <stdint.h>

/* Bytes; 0 when even the physical memory is unknown. */
int64_t pe_host_memory_bytes(void);

#endif
