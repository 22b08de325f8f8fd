/* Register's program path: the RegisterRequest a client sends, unpacked,
 * then the daemon's own compile step (server/program_compile.c:
 * pe_reg_compile): ProgramDesc decode under the op and variable limits,
 * the options (loss, optimizer, strategy, keep, for_test, fusion),
 * validation and every pass of the pipeline, for the places that
 * options.places names (cpu or sim, at most MAX_PLACES of them; cuda is
 * compiled as cpu: no device is touched). A bad program must come back as
 * an error; the model binding and the executor that follow a compile are
 * not run (they need a running daemon).
 *
 * Cost per input stays bounded: the limits are far below the daemon's
 * defaults (the passes' time grows with the ops) and the places are few
 * (the graph is replicated per place). */
#include <stdio.h>
#include <stdlib.h>

#include "compiler/graph.h"
#include "core/log.h"
#include "core/place.h"
#include "server/registry_internal.h"
#include "server/server.h"

#define MAX_OPS 512
#define MAX_VARS 2048
#define MAX_PLACES 4

static pe_server *server; /* pe_reg_compile reads its stopping flag only */
static bool verbose;      /* PE_FUZZ_VERBOSE set: print each refusal (why a seed stops early) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  pe_log_set_level(PE_LOG_ERROR);
  verbose = getenv("PE_FUZZ_VERBOSE") != NULL;
  server = calloc(1, sizeof *server);
  return server ? 0 : 1;
}

static void free_infos(pe_var_info *v, int n) {
  for (int i = 0; i < n; i++) free(v[i].name);
  free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Pe__RegisterRequest *rq = pe__register_request__unpack(NULL, size, data);
  if (!rq) return 0;
  pe_place_kind kind = PE_PLACE_CPU;
  int n_places = 1;
  const Pe__RegisterOptions *o = rq->options;
  if (o && o->places && o->places[0]) {
    pe_status *st = pe_places_parse(o->places, &kind, &n_places);
    if (st || n_places > MAX_PLACES) {
      pe_status_free(st);
      pe__register_request__free_unpacked(rq, NULL);
      return 0;
    }
    if (kind == PE_PLACE_CUDA) kind = PE_PLACE_CPU;
  }
  pe_limits lim = {.max_program_ops = MAX_OPS, .max_program_vars = MAX_VARS};
  pe_srv_program p = {0};
  pe_graph *g = NULL, *sg = NULL;
  pe_status *st = pe_reg_compile(server, rq, &lim, kind, n_places, &g, &sg, &p);
  if (verbose) fprintf(stderr, "fuzz_program: %s\n", pe_status_msg(st));
  pe_status_free(st);
  pe_graph_free(g);
  pe_graph_free(sg);
  free_infos(p.params, p.n_params);
  free_infos(p.feeds, p.n_feeds);
  pe__register_request__free_unpacked(rq, NULL);
  return 0;
}
