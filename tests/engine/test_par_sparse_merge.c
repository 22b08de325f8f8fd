/* The parallel executor's sparse_merge (engine/parallel/sparse_merge.c):
 * an embedding's sparse gradient (is_sparse) merged across the places.
 * After each step the merged gradient and its rows are fetched (a sparse
 * gradient fetches like a dense one: the all-reduced or the owner's) and
 * checked against the closed form of loss = mean(square(W[ids])):
 * rows = the batch's distinct ids but padding, ascending; row r's value =
 * count(r) * 2 W[r] / (B * SEQ * DIM). Batches repeat ids within a place
 * and across places, give a place only padding ids (it touches no row),
 * and give places no sample (batch 1). Every place ends with the same
 * parameter bytes. cpu:2 and sim:3, every strategy; sim:3 also with place
 * memory the host reaches only by copies (the fetch's path of cuda).
 *
 * Tolerance 1e-6 relative: each place computes its values as mean_grad's
 * (n_p / N) / (n_p SEQ DIM) times 2 W[r], a few f32 roundings, summed over
 * at most 3 places; a row lost or counted twice is off by 1/count >= 1/6. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../train/sparse_emb_prog.h"
#include "check_main.h"
#include "compiler/pass.h"
#include "engine/parallel/executor.h"

enum { VOCAB = 16, DIM = 4, SEQ = 2, BATCH = 6, PAD = 1 };

static pe_program *emb_program(void) {
  return se_square_mean(VOCAB, DIM, SEQ, PAD, true, "sgd", 0.25f);
}

/* The steps' batches (rows of SEQ ids), split in order over the places:
 * cpu:2 takes 3 + 3 rows, sim:3 2 + 2 + 2. */
static const int64_t STEP_IDS[][BATCH * SEQ] = {
    /* 5 twice in a row, in several rows and on every place; 7 and 9 on
     * two places */
    {5, 5, 7, 2, 9, 5, 5, PAD, 7, 9, 12, 5},
    /* rows 3..5: cpu:2's place 1 and sim:3's place 2 touch no row */
    {3, 3, 5, 11, 3, PAD, PAD, PAD, PAD, PAD, PAD, PAD},
};
enum { N_STEPS = 3 }; /* and a third step of one row: [3, 6] */
static const int64_t ONE_ROW[SEQ] = {3, 6};

static int step_rows(int s) {
  return s < 2 ? BATCH : 1;
}

static const int64_t *step_ids(int s) {
  return s < 2 ? STEP_IDS[s] : ONE_ROW;
}

typedef struct setting {
  pe_place_kind kind;
  int n;
  pe_graph_strategy strategy;
  bool device_memory; /* sim: place memory the host reaches only by copies */
  const char *name;
} setting;

static void run_setting(const setting *set) {
  pe_program *p = emb_program();
  const char *keep[] = {"w@GRAD", "w@GRAD@ROWS"};
  pe_pass_opts o = {.place_kind = set->kind,
                    .n_places = set->n,
                    .strategy = set->strategy,
                    .keep = keep,
                    .n_keep = 2};
  pe_runtime_opts ro = {.cores = 2, .sim_device_memory = set->device_memory};
  se_par r = se_par_new(p, &o, &ro);
  pe_model *m = r.m;
  float w0[VOCAB * DIM];
  for (int i = 0; i < VOCAB * DIM; i++) w0[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  pe_tensor w, wq, out[2];
  pe_shape ws = PE_SHAPE(VOCAB, DIM);
  pe_tensor_init(&w);
  pe_tensor_view(&w, PE_F32, &ws, w0);
  PU_OK(pe_model_set(m, "w", &w));
  pe_tensor_init(&w);
  pe_tensor_init(&wq);
  pe_tensor_init(&out[0]);
  pe_tensor_init(&out[1]);
  for (int s = 0; s < N_STEPS; s++) {
    PU_OK(pe_model_get(m, "w", &w)); /* before the step */
    int rows = step_rows(s);
    const int64_t *ids = step_ids(s);
    int count[VOCAB] = {0}, distinct = 0;
    for (int i = 0; i < rows * SEQ; i++)
      if (ids[i] != PAD && count[ids[i]]++ == 0) distinct++;
    pe_tensor it;
    pe_tensor_init(&it);
    pe_shape is = PE_SHAPE(rows, SEQ);
    pe_tensor_view(&it, PE_I64, &is, (void *)ids);
    pe_feed f = {"ids", &it};
    const char *fetch[] = {"w@GRAD", "w@GRAD@ROWS"};
    PU_OK(pe_par_exec_run(r.step, &f, 1, fetch, 2, out, NULL, NULL));
    ck_assert_msg(out[1].dtype == PE_I64 && out[1].shape.ndim == 1 &&
                      out[1].shape.d[0] == distinct && out[0].shape.ndim == 2 &&
                      out[0].shape.d[0] == distinct && out[0].shape.d[1] == DIM,
                  "%s step %d: %lld merged rows, %d distinct ids", set->name, s,
                  (long long)out[1].shape.d[0], distinct);
    const int64_t *r = pe_i64(&out[1]);
    const float *v = pe_f32(&out[0]);
    int k = 0;
    for (int id = 0; id < VOCAB; id++) {
      if (!count[id]) continue;
      ck_assert_msg(r[k] == id, "%s step %d: merged row %d is %lld, expected %d", set->name, s, k,
                    (long long)r[k], id);
      for (int j = 0; j < DIM; j++) {
        double want = count[id] * 2.0 * pe_f32(&w)[id * DIM + j] / (rows * SEQ * DIM);
        ck_assert_msg(fabs(v[k * DIM + j] - want) <= 1e-6 * fmax(fabs(want), 1e-3),
                      "%s step %d: row %d col %d: %.9g, expected %.9g", set->name, s, id, j,
                      v[k * DIM + j], want);
      }
      k++;
    }
    PU_OK(pe_model_get(m, "w", &w));
    for (int q = 1; q < set->n; q++) {
      PU_OK(pe_model_get_place(m, "w", q, &wq));
      ck_assert_msg(memcmp(w.data, wq.data, pe_tensor_bytes(&w)) == 0,
                    "%s step %d: w differs between place 0 and place %d", set->name, s, q);
    }
  }
  pe_tensor_release(&w);
  pe_tensor_release(&wq);
  pe_tensor_release(&out[0]);
  pe_tensor_release(&out[1]);
  se_par_free(&r);
  pe_program_free(p);
}

START_TEST(merged_rows_and_values_on_every_strategy) {
  static const setting sets[] = {
      {PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, "cpu:2 allreduce"},
      {PE_PLACE_CPU, 2, PE_STRATEGY_REDUCE, false, "cpu:2 reduce"},
      {PE_PLACE_CPU, 2, PE_STRATEGY_SHARDED, false, "cpu:2 sharded"},
      {PE_PLACE_SIM, 3, PE_STRATEGY_ALLREDUCE, false, "sim:3 allreduce"},
      {PE_PLACE_SIM, 3, PE_STRATEGY_REDUCE, false, "sim:3 reduce"},
      {PE_PLACE_SIM, 3, PE_STRATEGY_SHARDED, false, "sim:3 sharded"},
      {PE_PLACE_SIM, 3, PE_STRATEGY_ALLREDUCE, true, "sim:3 device memory allreduce"},
      {PE_PLACE_SIM, 3, PE_STRATEGY_REDUCE, true, "sim:3 device memory reduce"},
  };
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) run_setting(&sets[i]);
}
END_TEST

static Suite *sparse_merge_suite(void) {
  Suite *s = suite_create("engine.par_sparse_merge");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, merged_rows_and_values_on_every_strategy);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(sparse_merge_suite)
