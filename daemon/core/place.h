/* Places: where a tensor lives and an op runs. "cpu:N" means N cpu places
 * (cpu:0 .. cpu:N-1); sim and cuda likewise. */
#ifndef PE_CORE_PLACE_H
#define PE_CORE_PLACE_H

#include <stdbool.h>

#include "status.h"

typedef enum pe_place_kind { PE_PLACE_CPU = 0, PE_PLACE_SIM = 1, PE_PLACE_CUDA = 2 } pe_place_kind;

typedef struct pe_place {
  pe_place_kind kind;
  int id;
} pe_place;

#define PE_MAX_PLACES 64

static inline pe_place pe_cpu_place(void) { return (pe_place){PE_PLACE_CPU, 0}; }
bool pe_place_equal(pe_place a, pe_place b);
const char *pe_place_kind_name(pe_place_kind k);
/* "cpu:0" into buf. */
const char *pe_place_str(pe_place p, char *buf, int len);
/* Parse "cpu:2" / "sim:4" / "cuda:0": a kind and a count (or device id for
 * cuda). Errors name the offending spec. */
pe_status *pe_places_parse(const char *spec, pe_place_kind *kind, int *count);

#endif
