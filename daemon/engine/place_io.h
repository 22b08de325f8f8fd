/* Host access to place memory: the one way the executor reads and writes a
 * tensor that lives on a place, whatever the kind.
 *
 * On a device whose memory is host memory (cpu, sim: pe_device_host_memory)
 * these are plain copies on the calling thread. Otherwise (cuda, or sim
 * opened with the device_memory test hook) they are copies queued on the
 * device's copy streams (d2h for reads, h2d for writes and zeroing), and the
 * call waits for that one stream only: nothing waits on the whole device.
 *
 * Ordering is the caller's: the stream work that writes what is read (or
 * reads what is overwritten) must have completed before the call (the
 * executor's runs end by syncing their streams; model get/set are engine
 * ops ordered after the runs that touch the variable). When the call
 * returns, the copy has completed, so work launched afterwards on any
 * stream sees it.
 *
 * Errors: a failed copy (or an earlier failure kept on the copy stream) is
 * returned, naming the variable and the place. Any thread. */
#ifndef PE_ENGINE_PLACE_IO_H
#define PE_ENGINE_PLACE_IO_H

#include "core/tensor.h"
#include "engine/device.h"

/* dst (host memory) := src (a tensor in d's memory); dst is resized with
 * its own allocator (the host one when it has none). */
pe_status *pe_place_read(pe_device *d, const pe_tensor *src, pe_tensor *dst, const char *name);
/* dst (a tensor in d's memory) := src (host memory). dst without storage of
 * its own is allocated from d's allocator. */
pe_status *pe_place_write(pe_device *d, pe_tensor *dst, const pe_tensor *src, const char *name);
/* bytes at p (d's memory) := 0. `name` names what is zeroed in errors. */
pe_status *pe_place_zero(pe_device *d, void *p, size_t bytes, const char *name);

#endif
