/* Programs with an embedding (lookup_table_v2 of W [vocab, dim] on ids
 * [-1, seq]) whose gradient is sparse or dense, shared by the sparse
 * gradient suites (train.test_train_sparse, train.test_train_sparse_par,
 * engine.test_par_sparse_merge). Header-only. */
#ifndef PE_TESTS_SPARSE_EMB_PROG_H
#define PE_TESTS_SPARSE_EMB_PROG_H

#include <stdbool.h>
#include <string.h>

#include "../compiler/prog_util.h"
#include "compiler/pass.h"
#include "engine/parallel/executor.h"

/* A program whose main block has the feed "ids", the parameter "w" and
 * "emb" = w[ids] (is_sparse `sparse`, padding_idx `pad`); the caller adds
 * the rest. */
static inline pe_program *se_embedding(int vocab, int dim, int seq, int pad, bool sparse,
                                       pe_block **main) {
  pe_program *p = pe_program_new();
  PU_OK(pe_program_add_block(p, -1, main));
  pu_feed(*main, "ids", PE_I64, PE_SHAPE(-1, seq));
  pu_param(*main, "w", PE_SHAPE(vocab, dim));
  pu_var(*main, "emb", PE_F32, NULL);
  pe_op_desc *e = pu_op(*main, "lookup_table_v2", "W", "w", "Ids", "ids", NULL, "Out", "emb", NULL);
  PU_OK(pe_op_set_bool(e, "is_sparse", sparse));
  PU_OK(pe_op_set_long(e, "padding_idx", pad));
  return p;
}

/* loss = mean(square(w[ids])), trained by optimizer `opt` at rate lr. */
static inline pe_program *se_square_mean(int vocab, int dim, int seq, int pad, bool sparse,
                                         const char *opt, float lr) {
  pe_block *m;
  pe_program *p = se_embedding(vocab, dim, seq, pad, sparse, &m);
  pu_var(m, "sq", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "square", "X", "emb", NULL, "Out", "sq", NULL);
  pu_op(m, "mean", "X", "sq", NULL, "Out", "loss", NULL);
  p->loss = strdup("loss");
  p->opt.type = strdup(opt);
  p->opt.lr = lr;
  return p;
}

/* A program compiled for o's places, with its model and executors; the
 * startup graph has run. */
typedef struct se_par {
  pe_runtime *rt;
  pe_model *m;
  pe_par_exec *init, *step;
  int sparse_merges; /* nodes of the main graph */
} se_par;

static inline se_par se_par_new(pe_program *p, const pe_pass_opts *o, const pe_runtime_opts *ro) {
  pe_ir ir = {.prog = p, .opts = o};
  PU_OK(pe_graph_compile(&ir, false));
  se_par r = {0};
  for (int i = 0; i < ir.graph->n_nodes; i++)
    r.sparse_merges += ir.graph->nodes[i].kind == PE_NODE_SPARSE_MERGE;
  PU_OK(pe_runtime_new(ro, &r.rt));
  PU_OK(pe_model_new(r.rt, o->place_kind, o->n_places, 7, &r.m));
  PU_OK(pe_par_exec_new(r.m, ir.startup, &r.init));
  PU_OK(pe_par_exec_new(r.m, ir.graph, &r.step));
  ir.graph = ir.startup = NULL;
  pe_ir_destroy(&ir);
  PU_OK(pe_par_exec_run(r.init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  return r;
}

static inline void se_par_free(se_par *r) {
  pe_par_exec_free(r->step);
  pe_par_exec_free(r->init);
  pe_model_free(r->m);
  pe_runtime_free(r->rt);
}

#endif
