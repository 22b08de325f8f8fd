/* A device kind's step capture (optional row of pe_device_ops.graph): the
 * executor records one step's launches on a device as a graph and replays
 * it (engine/step_graph_key.h orders the steps; parallel/cuda_graph_step.c
 * drives them). cuda: cuda/cuda_graph.h. Kinds without it (cpu, sim) are
 * never captured.
 *
 * Threads: begin, end, launch and free of one device are called by the
 * executor's run, one at a time per device. */
#ifndef PE_ENGINE_DEVICE_GRAPH_H
#define PE_ENGINE_DEVICE_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

struct pe_device;

typedef struct pe_device_graph_ops {
  /* Start recording d's streams; the launches until end are recorded, not
   * run. */
  pe_status *(*begin)(struct pe_device *d);
  /* Stop recording; *graph: the instantiated graph. On failure the
   * recorded work did not run and the streams are usable again. */
  pe_status *(*end)(struct pe_device *d, void **graph);
  /* Launch graph on d's compute stream (asynchronous); rng_delta: how far
   * the generator moved since the capture (0 for the capture's own launch). */
  pe_status *(*launch)(void *graph, uint64_t rng_delta);
  void (*free)(void *graph);
  /* Whether op `type` (op_flags: its registry flags) may be recorded. */
  bool (*op_capturable)(const char *type, unsigned op_flags, const char **why);
} pe_device_graph_ops;

#endif
