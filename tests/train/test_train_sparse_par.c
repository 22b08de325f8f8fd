/* Sparse embedding gradients (lookup_table_v2 is_sparse) on several places:
 * the parallel executor merges the places' rows (sparse_merge,
 * engine/parallel/sparse_merge.c) and trains the same parameters as the
 * dense gradient's all-reduce, under every strategy, on cpu:2 and sim:3.
 *
 * The model: an embedding W [VOCAB, DIM] of ids [B, SEQ] and a small fc
 * head, loss = mean(square(W[ids] @ F + b)): W's gradient depends on F and
 * F's on W. The batches repeat ids within a place and across places, give
 * one place only padding ids (it touches no row) and, at one step, fewer
 * samples than places (a place with no sample).
 *
 * Tolerance. Sparse and dense runs on the same places sum in the same
 * order: a row's repeats in batch order on each place (the embedding's
 * sparse gradient, as the dense one), then the places in place order (the
 * merge, as every all-reduce), and a row a place does not touch adds 0
 * there; the updates run the same formulas. They agree to the bit in
 * practice (the test prints the largest difference); the assertion allows
 * 1e-6 relative (a few ulp), while a row lost or counted twice, a
 * gradient not scaled by n_p/N, or a place left with its own rows moves a
 * parameter by ~1e-2 within a step. Against one place (the sequential
 * executor), the fc head's sums are split over places: 1e-5 relative, as
 * tests/train/par_equiv.h explains. Parameters on different places are
 * bitwise identical. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "core/scope.h"
#include "engine/parallel/executor.h"
#include "engine/seq_executor.h"
#include "sparse_emb_prog.h"

enum { VOCAB = 24, DIM = 8, SEQ = 3, OUT = 4, STEPS = 8, MAX_BATCH = 6 };
/* PAD is the padding_idx; ALWAYS is in every batch on place 0; rows >=
 * NEVER are never used. */
enum { PAD = 1, ALWAYS = 3, NEVER = 20 };

static pe_program *model_program(const char *opt, bool sparse) {
  pe_block *m;
  pe_program *p = se_embedding(VOCAB, DIM, SEQ, PAD, sparse, &m);
  pu_param(m, "fc.w", PE_SHAPE(DIM, OUT));
  pu_param(m, "fc.b", PE_SHAPE(OUT));
  const char *tmps[] = {"h", "hb", "sq", "loss"};
  for (int i = 0; i < 4; i++) pu_var(m, tmps[i], PE_F32, NULL);
  pu_op(m, "matmul_v2", "X", "emb", "Y", "fc.w", NULL, "Out", "h", NULL);
  pu_op(m, "elementwise_add", "X", "h", "Y", "fc.b", NULL, "Out", "hb", NULL);
  pu_op(m, "square", "X", "hb", NULL, "Out", "sq", NULL);
  pu_op(m, "mean", "X", "sq", NULL, "Out", "loss", NULL);
  p->loss = strdup("loss");
  p->opt.type = strdup(opt);
  p->opt.lr = 0.1f;
  return p;
}

static int batch_ids(int s, bool few, int64_t ids[MAX_BATCH * SEQ]);

/* Step s's feed (batch_ids) viewed by *t from ids. */
static pe_feed step_feed(int s, bool few, int64_t ids[MAX_BATCH * SEQ], pe_tensor *t) {
  int rows = batch_ids(s, few, ids);
  pe_tensor_init(t);
  pe_shape is = PE_SHAPE(rows, SEQ);
  pe_tensor_view(t, PE_I64, &is, ids);
  return (pe_feed){"ids", t};
}

/* Step s's batch into ids; returns its rows. Rows are split over the
 * places in order (cpu:2: 3 + 3, sim:3: 2 + 2 + 2). `few`: every batch
 * uses the rows ALWAYS, 4 and 5 and no other (adam lazy_mode equals dense
 * adam then: a row without gradient and moments does not move), else
 * rows 4..16 vary between steps. */
static int batch_ids(int s, bool few, int64_t ids[MAX_BATCH * SEQ]) {
  int rows = s == 5 ? 1 : s == 6 ? 5 : MAX_BATCH;
  for (int i = 0; i < rows * SEQ; i++) /* repeats */
    ids[i] = few ? ALWAYS + (s + i) % 3 : 4 + (s * 5 + i * 7) % 13;
  if (few) {
    if (rows > 1) ids[4] = PAD;
  } else {
    ids[0] = ALWAYS;
    ids[1] = ALWAYS;          /* twice in one row */
    ids[rows * SEQ - 1] = 4;  /* the last place too, and the first: */
    if (rows > 1) ids[2] = 4; /* across places */
    ids[4] = PAD;
  }
  if (s == 3) /* the second half (cpu:2's place 1) touches no row */
    for (int i = MAX_BATCH * SEQ / 2; i < MAX_BATCH * SEQ; i++) ids[i] = PAD;
  return rows;
}

static void initial(const char *name, float *v, int n) {
  int salt = (int)strlen(name) * 13;
  for (int i = 0; i < n; i++) v[i] = (float)((i * 37 + salt) % 101) / 100.0f - 0.5f;
}

typedef struct param_shape {
  const char *name;
  int rows, cols;
} param_shape;

static const param_shape PARAMS[] = {{"w", VOCAB, DIM}, {"fc.w", DIM, OUT}, {"fc.b", 1, OUT}};

/* Sequential reference on one place. */
static pe_scope *train_seq(const char *opt, bool sparse, bool few, pe_program **prog) {
  pe_scope *scope = pe_scope_new(NULL);
  pe_program *p = model_program(opt, sparse);
  PU_OK(pe_program_compile(p, false));
  pe_exec_opts o = {7, 1};
  pe_seq_exec *init, *step;
  PU_OK(pe_seq_exec_new(p, p->startup_block, scope, &o, &init));
  PU_OK(pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL));
  pe_seq_exec_free(init);
  for (int k = 0; k < 3; k++) {
    float v[VOCAB * DIM];
    initial(PARAMS[k].name, v, PARAMS[k].rows * PARAMS[k].cols);
    ph_set_f32(scope, PARAMS[k].name,
               k == 2 ? PE_SHAPE(OUT) : PE_SHAPE(PARAMS[k].rows, PARAMS[k].cols), v);
  }
  PU_OK(pe_seq_exec_new(p, p->main_block, scope, &o, &step));
  for (int s = 0; s < STEPS; s++) {
    int64_t ids[MAX_BATCH * SEQ];
    pe_tensor it;
    pe_feed f = step_feed(s, few, ids, &it);
    const char *fetch = "loss";
    const pe_tensor *out;
    PU_OK(pe_seq_exec_run(step, &f, 1, &fetch, 1, &out));
  }
  pe_seq_exec_free(step);
  *prog = p;
  return scope;
}

typedef struct setting {
  pe_place_kind kind;
  int n;
  pe_graph_strategy strategy;
  pe_sync_strategy sync;
  const char *name;
} setting;

static const setting SETTINGS[] = {
    {PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, PE_SYNC_WAIT_EVENT, "cpu:2 allreduce"},
    {PE_PLACE_CPU, 2, PE_STRATEGY_REDUCE, PE_SYNC_WAIT_EVENT, "cpu:2 reduce"},
    {PE_PLACE_CPU, 2, PE_STRATEGY_SHARDED, PE_SYNC_WAIT_EVENT, "cpu:2 sharded"},
    {PE_PLACE_SIM, 3, PE_STRATEGY_ALLREDUCE, PE_SYNC_WAIT_EVENT, "sim:3 event allreduce"},
    {PE_PLACE_SIM, 3, PE_STRATEGY_REDUCE, PE_SYNC_WAIT_PRODUCER, "sim:3 producer reduce"},
    {PE_PLACE_SIM, 3, PE_STRATEGY_SHARDED, PE_SYNC_WAIT_EVENT, "sim:3 event sharded"},
};
enum { N_SETTINGS = sizeof SETTINGS / sizeof SETTINGS[0] };

/* Train on the setting's places; the model holds the result. */
static se_par train_par(const char *opt, bool sparse, bool few, const setting *set) {
  pe_program *p = model_program(opt, sparse);
  pe_pass_opts o = {.place_kind = set->kind, .n_places = set->n, .strategy = set->strategy};
  pe_runtime_opts ro = {.cores = set->n};
  se_par r = se_par_new(p, &o, &ro);
  for (int k = 0; k < 3; k++) {
    float v[VOCAB * DIM];
    initial(PARAMS[k].name, v, PARAMS[k].rows * PARAMS[k].cols);
    pe_tensor t;
    pe_tensor_init(&t);
    pe_shape s = k == 2 ? PE_SHAPE(OUT) : PE_SHAPE(PARAMS[k].rows, PARAMS[k].cols);
    pe_tensor_view(&t, PE_F32, &s, v);
    PU_OK(pe_model_set(r.m, PARAMS[k].name, &t));
  }
  pe_tensor out;
  pe_tensor_init(&out);
  for (int s = 0; s < STEPS; s++) {
    int64_t ids[MAX_BATCH * SEQ];
    pe_tensor it;
    pe_feed f = step_feed(s, few, ids, &it);
    const char *fetch = "loss";
    pe_run_opts ro2 = {.sync = set->sync};
    PU_OK(pe_par_exec_run(r.step, &f, 1, &fetch, 1, &out, &ro2, NULL));
    ck_assert_msg(isfinite(pe_f32(&out)[0]), "%s step %d: loss %g", set->name, s, pe_f32(&out)[0]);
  }
  pe_tensor_release(&out);
  pe_program_free(p);
  return r;
}

/* Max |a - b| / max(1, |b|) of variable `name` (the model's value) against
 * b; the first n_places places hold the same bytes as place 0. */
static double max_rel(se_par *r, int n_places, const char *name, const float *b, int64_t n,
                      const char *what) {
  pe_tensor t, q;
  pe_tensor_init(&t);
  pe_tensor_init(&q);
  PU_OK(pe_model_get(r->m, name, &t));
  ck_assert_int_eq(pe_tensor_numel(&t), n);
  for (int p = 1; p < n_places; p++) {
    PU_OK(pe_model_get_place(r->m, name, p, &q));
    ck_assert_msg(pe_tensor_bytes(&q) == pe_tensor_bytes(&t) &&
                      memcmp(q.data, t.data, pe_tensor_bytes(&t)) == 0,
                  "%s: %s differs between place 0 and place %d", what, name, p);
  }
  double m = 0;
  const float *a = pe_f32(&t);
  for (int64_t i = 0; i < n; i++) {
    ck_assert_msg(isfinite(a[i]), "%s: %s[%lld] = %g", what, name, (long long)i, a[i]);
    double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)b[i]));
    if (d > m) m = d;
  }
  pe_tensor_release(&t);
  pe_tensor_release(&q);
  return m;
}

static const float *model_f32(se_par *r, const char *name, pe_tensor *keep) {
  pe_tensor_init(keep);
  PU_OK(pe_model_get(r->m, name, keep));
  return pe_f32(keep);
}

/* Sparse vs dense on the same places, and sparse vs the sequential sparse
 * run, for every parameter and w's optimizer state `st0`, `st1` (or NULL). */
static void sparse_equals_dense(const char *opt, bool few, const char *st0, const char *st1) {
  pe_program *sp;
  pe_scope *seq = train_seq(opt, true, few, &sp);
  for (int k = 0; k < N_SETTINGS; k++) {
    const setting *set = &SETTINGS[k];
    se_par d = train_par(opt, false, few, set), s = train_par(opt, true, few, set);
    ck_assert_int_eq(d.sparse_merges, 0);
    ck_assert_int_eq(s.sparse_merges, 1);
    char what[96];
    snprintf(what, sizeof what, "%s %s", opt, set->name);
    double worst = 0, worst_seq = 0;
    const char *names[] = {"w", "fc.w", "fc.b", st0, st1};
    for (int i = 0; i < 5 && names[i]; i++) {
      pe_tensor dt;
      const float *dv = model_f32(&d, names[i], &dt);
      int64_t n = pe_tensor_numel(&dt);
      /* Reduce keeps the optimizer state on the owner only. */
      int same = i < 3 || set->strategy != PE_STRATEGY_REDUCE ? set->n : 1;
      double rel = max_rel(&s, same, names[i], dv, n, what);
      ck_assert_msg(rel <= 1e-6, "%s: sparse %s differs from dense by %.3g (relative)", what,
                    names[i], rel);
      const pe_tensor *ref = ph_get(seq, names[i]);
      ck_assert_ptr_nonnull(ref);
      double rs = max_rel(&s, same, names[i], pe_f32(ref), n, what);
      ck_assert_msg(rs <= 1e-5, "%s: %s differs from one place by %.3g (relative)", what, names[i],
                    rs);
      worst = fmax(worst, rel);
      worst_seq = fmax(worst_seq, rs);
      pe_tensor_release(&dt);
    }
    /* The rows used moved; padding and unused rows did not. */
    pe_tensor wt;
    const float *w = model_f32(&s, "w", &wt);
    float w0[VOCAB * DIM];
    initial("w", w0, VOCAB * DIM);
    ck_assert(w[ALWAYS * DIM] != w0[ALWAYS * DIM]);
    ck_assert(w[4 * DIM] != w0[4 * DIM]);
    ck_assert(w[5 * DIM] != w0[5 * DIM]);
    for (int i = PAD * DIM; i < (PAD + 1) * DIM; i++) ck_assert(w[i] == w0[i]);
    for (int i = NEVER * DIM; i < VOCAB * DIM; i++) ck_assert(w[i] == w0[i]);
    pe_tensor_release(&wt);
    printf("%s: sparse vs dense max rel %.3g, vs one place %.3g\n", what, worst, worst_seq);
    se_par_free(&d);
    se_par_free(&s);
  }
  pe_scope_free(seq);
  pe_program_free(sp);
}

START_TEST(sgd_sparse_equals_dense_on_every_strategy) {
  sparse_equals_dense("sgd", false, NULL, NULL);
}
END_TEST

START_TEST(momentum_sparse_equals_dense_on_every_strategy) {
  sparse_equals_dense("momentum", false, "w@VELOCITY", NULL);
}
END_TEST

START_TEST(adam_lazy_sparse_equals_dense_on_every_strategy) {
  sparse_equals_dense("adam", true, "w@MOMENT1", "w@MOMENT2");
}
END_TEST

/* Compile-time: a sparse_merge per strategy where the gradient's
 * all_reduce / reduce would be, on the owner under reduce; cuda places
 * refuse a sparse gradient, naming the op, the rows and the places. */
START_TEST(graph_merges_sparse_gradients_and_cuda_refuses) {
  for (int k = 0; k < 3; k++) {
    pe_program *p = model_program("sgd", true);
    pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 2, .strategy = SETTINGS[k].strategy};
    pe_ir ir = {.prog = p, .opts = &o};
    PU_OK(pe_graph_compile(&ir, false));
    const pe_graph *g = ir.graph;
    int merges = 0, reduces = 0;
    for (int i = 0; i < g->n_nodes; i++) {
      const pe_graph_node *n = &g->nodes[i];
      if (n->kind == PE_NODE_SPARSE_MERGE) {
        merges++;
        if (SETTINGS[k].strategy == PE_STRATEGY_REDUCE)
          ck_assert_int_ge(n->root, 0);
        else
          ck_assert_int_eq(n->root, -1);
        ck_assert_int_eq(n->n_in_lv, 4);
        ck_assert_int_eq(n->n_out_lv, n->root >= 0 ? 2 : 4);
        ck_assert_str_eq(g->lvars[n->in_lv[1]].name, "w@GRAD@ROWS");
      }
      for (int j = 0; j < n->n_in_lv; j++)
        reduces += n->kind != PE_NODE_SPARSE_MERGE && n->kind != PE_NODE_OP &&
                   !strcmp(g->lvars[n->in_lv[j]].name, "w@GRAD");
    }
    ck_assert_int_eq(merges, 1);
    ck_assert_int_eq(reduces, 0); /* no dense collective of w@GRAD */
    pe_ir_destroy(&ir);
    pe_program_free(p);
  }
  pe_program *p = model_program("sgd", true);
  pe_pass_opts o = {.place_kind = PE_PLACE_CUDA, .n_places = 2, .strategy = PE_STRATEGY_ALLREDUCE};
  pe_ir ir = {.prog = p, .opts = &o};
  pu_expect(pe_graph_compile(&ir, false), PE_EINVAL, "lookup_table_v2_grad", "w@GRAD@ROWS",
            "is_sparse", "2 cuda", NULL);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

static Suite *sparse_par_suite(void) {
  Suite *s = suite_create("train.sparse_par");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, sgd_sparse_equals_dense_on_every_strategy);
  tcase_add_test(tc, momentum_sparse_equals_dense_on_every_strategy);
  tcase_add_test(tc, adam_lazy_sparse_equals_dense_on_every_strategy);
  tcase_add_test(tc, graph_merges_sparse_gradients_and_cuda_refuses);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(sparse_par_suite)
