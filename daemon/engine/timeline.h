/* Timeline: per-op spans (start, end, place, lane, name) recorded while a
 * graph runs, written as Chrome trace JSON (chrome://tracing, Perfetto).
 *
 * Recording is lock-free and allocation-free on the hot path. Every
 * recording thread owns a lane: a preallocated buffer it alone appends to
 * (a pool worker, or a sim stream's thread). A lane is claimed once per
 * thread with one atomic increment; pe_timeline_thread_lane caches the
 * calling thread's lane in a thread-local. A full lane drops spans and
 * counts them (pe_timeline_dropped).
 *
 * Output: {"traceEvents": [...]} with one "X" (complete) event per span,
 * pid = the place (process_name metadata "cpu:0", "sim:3"), tid = the lane
 * (thread_name metadata: the lane's name, e.g. "worker 2" or
 * "sim:0/compute"); ts/dur in microseconds from the timeline's creation.
 *
 * Threads: claim and record from any thread, each lane from one thread
 * only. pe_timeline_json may run while others record: it writes the spans
 * published when it looked. reset and free need recording to have
 * stopped. */
#ifndef PE_ENGINE_TIMELINE_H
#define PE_ENGINE_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/place.h"
#include "core/status.h"

typedef struct pe_timeline pe_timeline;
typedef struct pe_tl_lane pe_tl_lane;

/* At most max_lanes lanes of spans_per_lane spans each (lane buffers are
 * allocated when a lane is claimed). */
pe_status *pe_timeline_new(int max_lanes, size_t spans_per_lane, pe_timeline **out);
void pe_timeline_free(pe_timeline *tl);

/* Monotonic clock, nanoseconds. */
uint64_t pe_timeline_now_ns(void);

/* Claim a new lane named `name` (copied). NULL when every lane is taken or
 * its buffer cannot be allocated: recording into NULL is a no-op. */
pe_tl_lane *pe_timeline_lane(pe_timeline *tl, const char *name);
/* The calling thread's lane of tl, claimed (with `name`) on first use. */
pe_tl_lane *pe_timeline_thread_lane(pe_timeline *tl, const char *name);

/* Append a span to a lane; only the lane's thread may call this. `name` is
 * copied (up to 47 bytes). lane NULL: no-op. */
void pe_timeline_record(pe_tl_lane *lane, pe_place place, const char *name, uint64_t start_ns,
                        uint64_t end_ns);

/* The trace as a NUL-terminated JSON string (*out, malloc'd, caller frees;
 * *len its length, may be NULL). */
pe_status *pe_timeline_json(pe_timeline *tl, char **out, size_t *len);
/* Write it to path (through a temporary file and rename). */
pe_status *pe_timeline_write(pe_timeline *tl, const char *path);

uint64_t pe_timeline_spans(pe_timeline *tl);   /* recorded and kept */
uint64_t pe_timeline_dropped(pe_timeline *tl); /* lost to full lanes */
/* Forget every span; lanes stay claimed. */
void pe_timeline_reset(pe_timeline *tl);

#endif
