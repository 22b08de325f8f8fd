/* Register's program path: the RegisterRequest a client sends, unpacked,
 * then the daemon's own compile step (server/registry/compile.c:
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
 * (the graph is replicated per place).
 *
 * Byte mutations rarely keep the nested messages of a ProgramDesc whole, so
 * half of the mutations (LLVMFuzzerCustomMutator) unpack the program and
 * set one integer, an attribute's or a declared dimension, to a value at an
 * edge (0, -1, 2^31, 2^40, 2^62, INT64_MAX, ...), and pack it again: the
 * arithmetic of the shape inference and the passes meets every size. */
#include <stdio.h>
#include <stdlib.h>

#include "compiler/graph.h"
#include "core/log.h"
#include "core/place.h"
#include "program.pb-c.h"
#include "server/registry/internal.h"
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

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static const int64_t edges[] = {0,
                                -1,
                                -2,
                                1,
                                2,
                                3,
                                INT32_MAX,
                                (int64_t)1 << 31,
                                (int64_t)1 << 40,
                                ((int64_t)1 << 40) + 1,
                                (int64_t)1 << 62,
                                INT64_MAX,
                                INT64_MIN};

/* One integer of rq's program, chosen by r: an INT/LONG/INTS attribute's
 * value or a variable's dimension; false when the program has none. */
static bool set_edge(Pe__ProgramDesc *p, uint32_t r) {
  size_t n = 0;
  for (size_t b = 0; b < p->n_blocks; b++) {
    for (size_t v = 0; v < p->blocks[b]->n_vars; v++) n += p->blocks[b]->vars[v]->n_shape;
    for (size_t o = 0; o < p->blocks[b]->n_ops; o++)
      for (size_t a = 0; a < p->blocks[b]->ops[o]->n_attrs; a++)
        n += 1 + p->blocks[b]->ops[o]->attrs[a]->n_ints;
  }
  if (!n) return false;
  size_t at = r % n;
  int64_t value = edges[(r / 7) % (sizeof edges / sizeof edges[0])];
  for (size_t b = 0; b < p->n_blocks; b++) {
    Pe__BlockDesc *bd = p->blocks[b];
    for (size_t v = 0; v < bd->n_vars; v++) {
      if (at < bd->vars[v]->n_shape) return bd->vars[v]->shape[at] = value, true;
      at -= bd->vars[v]->n_shape;
    }
    for (size_t o = 0; o < bd->n_ops; o++)
      for (size_t a = 0; a < bd->ops[o]->n_attrs; a++) {
        Pe__Attr *attr = bd->ops[o]->attrs[a];
        if (at == 0) return attr->i = value, true;
        if (at <= attr->n_ints) return attr->ints[at - 1] = value, true;
        at -= 1 + attr->n_ints;
      }
  }
  return false;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
  if (seed % 2) return LLVMFuzzerMutate(data, size, max_size);
  Pe__RegisterRequest *rq = pe__register_request__unpack(NULL, size, data);
  Pe__ProgramDesc *p =
      rq ? pe__program_desc__unpack(NULL, rq->program.len, rq->program.data) : NULL;
  size_t out = 0;
  if (p && set_edge(p, seed / 2)) {
    size_t plen = pe__program_desc__get_packed_size(p);
    uint8_t *pbuf = malloc(plen ? plen : 1);
    if (pbuf) {
      pe__program_desc__pack(p, pbuf);
      Pe__RegisterRequest copy = *rq;
      copy.program.data = pbuf;
      copy.program.len = plen;
      size_t len = pe__register_request__get_packed_size(&copy);
      if (len <= max_size) out = pe__register_request__pack(&copy, data);
      free(pbuf);
    }
  }
  if (p) pe__program_desc__free_unpacked(p, NULL);
  if (rq) pe__register_request__free_unpacked(rq, NULL);
  return out ? out : LLVMFuzzerMutate(data, size, max_size);
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
