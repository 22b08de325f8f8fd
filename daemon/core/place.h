/* Places: where a tensor lives and an op runs. "cpu:N" means N cpu places
 * (cpu:0 .. cpu:N-1); sim and cuda likewise. */
#ifndef PE_CORE_PLACE_H
#define PE_CORE_PLACE_H

#include <stdbool.h>

#include "status.h"

typedef enum pe_place_kind {
  PE_PLACE_CPU = 0,
  PE_PLACE_SIM = 1,
  PE_PLACE_CUDA = 2,
  PE_PLACE_KINDS /* count */
} pe_place_kind;

typedef struct pe_place {
  pe_place_kind kind;
  int id;
} pe_place;

#define PE_MAX_PLACES 64

/* The in-order queues every device has, one of each kind (engine/device.h);
 * graph nodes name the one they are issued on. */
typedef enum pe_stream_kind {
  PE_STREAM_COMPUTE = 0, /* kernels */
  PE_STREAM_COMM = 1,    /* collectives (all-reduce, broadcast) */
  PE_STREAM_H2D = 2,     /* copies host -> device (feeds, prefetch) */
  PE_STREAM_D2H = 3,     /* copies device -> host (fetches) */
  PE_STREAM_KINDS
} pe_stream_kind;

/* "compute", "comm", "h2d", "d2h". */
const char *pe_stream_kind_name(pe_stream_kind k);

static inline pe_place pe_cpu_place(void) { return (pe_place){PE_PLACE_CPU, 0}; }
bool pe_place_equal(pe_place a, pe_place b);
const char *pe_place_kind_name(pe_place_kind k);
/* "cpu:0" into buf. */
const char *pe_place_str(pe_place p, char *buf, int len);
/* Parse "cpu:2" / "sim:4" / "cuda:2": a kind and a count of places (ids
 * 0..count-1). "cuda:0" is accepted as one place (GPU 0, the usual way to
 * name one GPU), the same as "cuda:1". Errors name the offending spec. */
pe_status *pe_places_parse(const char *spec, pe_place_kind *kind, int *count);

#endif
