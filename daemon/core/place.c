#include "place.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_names[] = {"cpu", "sim", "cuda"};

bool pe_place_equal(pe_place a, pe_place b) { return a.kind == b.kind && a.id == b.id; }

const char *pe_place_kind_name(pe_place_kind k) {
  return (unsigned)k < 3 ? kind_names[k] : "?";
}

const char *pe_place_str(pe_place p, char *buf, int len) {
  snprintf(buf, (size_t)len, "%s:%d", pe_place_kind_name(p.kind), p.id);
  return buf;
}

pe_status *pe_places_parse(const char *spec, pe_place_kind *kind, int *count) {
  const char *colon = spec ? strchr(spec, ':') : NULL;
  if (!colon) return pe_error(PE_EINVAL, "places '%s': expected KIND:N (cpu:2, sim:4, cuda:0)", spec ? spec : "");
  size_t klen = (size_t)(colon - spec);
  int k = -1;
  for (int i = 0; i < 3; i++)
    if (strlen(kind_names[i]) == klen && strncmp(spec, kind_names[i], klen) == 0) k = i;
  if (k < 0) return pe_error(PE_EINVAL, "places '%s': unknown kind (cpu, sim, cuda)", spec);
  char *end;
  long n = strtol(colon + 1, &end, 10);
  if (*end || end == colon + 1 || n < 0 || n > PE_MAX_PLACES || (k != PE_PLACE_CUDA && n == 0))
    return pe_error(PE_EINVAL, "places '%s': count must be 1..%d", spec, PE_MAX_PLACES);
  if (n == 0) n = 1; /* cuda:0: "GPU 0", the usual spelling of one GPU */
  *kind = (pe_place_kind)k;
  *count = (int)n;
  return NULL;
}

const char *pe_stream_kind_name(pe_stream_kind k) {
  static const char *const names[PE_STREAM_KINDS] = {"compute", "comm", "h2d", "d2h"};
  return (unsigned)k < PE_STREAM_KINDS ? names[k] : "?";
}
