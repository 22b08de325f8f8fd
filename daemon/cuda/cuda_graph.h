/* Capturing one step of a cuda place as a CUDA graph and replaying it.
 *
 * What the executor does with it (engine/step_graph_key.h orders the steps
 * of one key: warm-up, capture, replays):
 *
 *   pe_cuda_graph_begin(dev)      before the step's first launch
 *     the step runs as usual: its kernels, copies, event records and waits
 *     on the device's streams are recorded, not run
 *   pe_cuda_graph_end(dev, &g)    after the step's last launch
 *   ...
 *   pe_cuda_graph_replay(g, ...)  each later step of the same key
 *
 * Streams. Capture starts on the compute stream; the comm and copy
 * streams join it through an event recorded on compute that they wait on
 * (the fork), and at the end compute waits on an event recorded on each of
 * them (the join), as CUDA requires for a multi-stream capture. NCCL
 * calls on the comm stream are captured like kernels (NCCL >= 2.9).
 *
 * Mode: cudaStreamCaptureModeThreadLocal. Global would make every other
 * thread's unsafe call (a cudaMalloc of another model on the same daemon)
 * fail while this capture runs; Relaxed would let an unsafe call on the
 * capturing thread pass silently. ThreadLocal checks the capturing thread;
 * the pool threads that launch the step's kernels are covered by the
 * device allocator's guard (pe_cuda_graph_capturing: no cudaMalloc on a
 * device while it captures; the allocation fails, the capture with it, and
 * the key falls back with the reason).
 *
 * Feeds and fetches. A replay reads and writes the device addresses of the
 * captured step. Feeds are copied before the launch, on the compute
 * stream, from pinned staging into the step's fixed device buffers; the
 * fetches are copied D2H after it into pinned staging, together with the
 * device-side finite flag of the step (one int, written by the captured
 * finite check), so one stream sync reads both.
 *
 * Random ops. A kernel argument is frozen at capture, so the random
 * kernels (dropout, uniform_random, gaussian_random) also read the
 * generator's step delta from device memory: the capture's (a device
 * uint64, pe_cuda_graph_rng_delta) while the device captures, none
 * otherwise (their numbers are then the host base's, bit for bit). The
 * capture's own launch runs with delta 0; each replay writes, before its
 * launch and in stream order, how far the generator moved since the
 * capture, so its numbers are those of the unreplayed step. The executor
 * advances the host generator by the step's counters per replay.
 *
 * Threads: begin, end and replay of one device are called by the
 * executor's run, one at a time per device. */
#ifndef PE_CUDA_CUDA_GRAPH_H
#define PE_CUDA_CUDA_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "cuda/cuda_ctx.h"
#include "engine/device.h"

typedef struct pe_cuda_graph pe_cuda_graph;

/* Whether op `type` (op_flags: its registry flags) may be inside a
 * captured step: engine/step_graph_key.h's rule for the cuda kernels. */
bool pe_cuda_graph_op_capturable(const char *type, unsigned op_flags, const char **why);

/* While cuda device `ordinal` captures and stream s is part of the
 * capture: the capture's generator step delta (device memory) that random
 * kernels add to their base; NULL otherwise. Any thread. */
const uint64_t *pe_cuda_graph_rng_delta(int ordinal, cudaStream_t s);

/* Whether cuda device `ordinal` is capturing now (the device allocator
 * refuses cudaMalloc then). Any thread. */
bool pe_cuda_graph_capturing(int ordinal);

/* Start capturing d's streams (d is a cuda device). One capture per GPU at
 * a time: a second begin on the same ordinal is refused, naming it. */
pe_status *pe_cuda_graph_begin(pe_device *d);
/* End the capture and instantiate it. On failure (an unsafe call, a
 * stream left out of the join, an invalidated capture) the capture is
 * discarded, d's streams are out of capture mode again, and the status
 * says why; the step's work was not run: the caller runs it the normal way. */
pe_status *pe_cuda_graph_end(pe_device *d, pe_cuda_graph **out);

/* One feed or fetch of a replay: host memory, the step's device buffer. */
typedef struct pe_cuda_graph_io {
  void *host;
  void *device;
  size_t bytes;
} pe_cuda_graph_io;

/* Run the captured step once: feeds copied in (host -> pinned -> device),
 * rng_delta written to the capture's generator delta (0 for the capture's
 * own launch), the graph launched on d's compute stream, fetches and the finite flag
 * copied out, then a sync of the compute stream. *finite (may be NULL):
 * the step's flag (false: a NaN or Inf reached a checked output). A fault
 * of the replayed work comes back as the status, naming the graph's
 * device, as a normal step's does. */
pe_status *pe_cuda_graph_replay(pe_cuda_graph *g, const pe_cuda_graph_io *feeds, int n_feeds,
                                const pe_cuda_graph_io *fetches, int n_fetches, uint64_t rng_delta,
                                const int *finite_flag_dev, bool *finite);

/* Launch g on its compute stream with the generator delta rng_delta
 * (written before the launch, in stream order); no copies, no sync: the
 * executor's own copies and events order the rest. */
pe_status *pe_cuda_graph_launch(pe_cuda_graph *g, uint64_t rng_delta);

/* The cuda row of pe_device_ops.graph (engine/device_graph.h). */
extern const struct pe_device_graph_ops pe_cuda_device_graph_ops;

/* Frees g (instantiated graph, its staging); NULL: no-op. The signature is
 * pe_step_graph_free_fn's. */
void pe_cuda_graph_free(void *g);

#endif
