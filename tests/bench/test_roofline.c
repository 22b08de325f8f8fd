/* pe-bench's roofline collector and timer (bench/roofline.c): the GEMMs and
 * convolutions of the built-in MLP and CNN training programs, one per
 * layer and direction with the layers' shapes; each timed positive; an op
 * whose shape stays unknown is an error naming it. */
#include <check.h>
#include <dnnl.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "ir/program.h"
#include "ops/cpu/conv_algo.h"
#include "pe_models.h"
#include "roofline.h"

/* The model's training program, compiled as pe-bench compiles it. */
static pe_program *compiled(const char *name, pe_model_spec *m) {
  char err[256];
  ck_assert_msg(pe_model_spec_build(name, m, err, sizeof err) == 0, "%s", err);
  pe_program *p;
  pe_status *st = pe_program_decode(m->bytes, m->len, &p);
  ck_assert_msg(!st, "%s", st ? pe_status_msg(st) : "");
  const char *keep[1] = {m->accuracy};
  pe_pass_opts po = {.n_keep = 1, .keep = keep, .fuse_conv_act = true};
  st = pe_program_compile_opts(p, false, &po);
  ck_assert_msg(!st, "%s", st ? pe_status_msg(st) : "");
  return p;
}

static pe_roof_list collect(const char *name, int64_t batch) {
  pe_model_spec m;
  pe_program *p = compiled(name, &m);
  pe_roof_list l;
  pe_status *st = pe_roof_collect(p, batch, &l);
  ck_assert_msg(!st, "%s", st ? pe_status_msg(st) : "");
  pe_program_free(p);
  pe_model_spec_release(&m);
  return l;
}

static bool is_gemm(const pe_roof_item *it, const char *op, int64_t m, int64_t k, int64_t n,
                    bool ta, bool tb) {
  const pe_roof_geom *g = &it->g;
  return g->kind == PE_ROOF_GEMM && !strcmp(it->op, op) && g->batch == 1 && g->m == m &&
         g->k == k && g->n == n && g->ta == ta && g->tb == tb;
}

/* The MLP (784-256-128-10): three forward products, the three weight
 * gradients (Xᵀ·dOut) and the input gradients (dOut·Yᵀ) of the two upper
 * layers; the first layer's input (the images) has no gradient. */
START_TEST(mlp_lists_each_layer_product) {
  pe_roof_list l = collect("mlp", 32);
  ck_assert_int_eq(l.n, 8);
  const pe_roof_item *it = l.items;
  ck_assert(is_gemm(&it[0], "matmul", 32, 784, 256, false, false));
  ck_assert(is_gemm(&it[1], "matmul", 32, 256, 128, false, false));
  ck_assert(is_gemm(&it[2], "matmul", 32, 128, 10, false, false));
  ck_assert(is_gemm(&it[3], "matmul_grad", 32, 10, 128, false, true));
  ck_assert(is_gemm(&it[4], "matmul_grad", 128, 32, 10, true, false));
  ck_assert(is_gemm(&it[5], "matmul_grad", 32, 128, 256, false, true));
  ck_assert(is_gemm(&it[6], "matmul_grad", 256, 32, 128, true, false));
  ck_assert(is_gemm(&it[7], "matmul_grad", 784, 32, 256, true, false));
  ck_assert_double_eq(pe_roof_flop(&it[0]), 2.0 * 32 * 784 * 256);
  pe_roof_list_free(&l);
}
END_TEST

/* The FMA peak runs at oneDNN's effective ISA (ONEDNN_MAX_CPU_ISA lowers
 * both), and no product can beat it: the MLP's largest product on one
 * thread is at most the one-thread peak (with room for noise), and at
 * least a tenth of it (oneDNN's products run near the peak on every ISA).
 * A loop that counted too few lanes or ran out of registers reads far
 * below the product; on a loaded machine the peak's runs can all lose the
 * core while the product's do not, so a product above the peak measures
 * the peak once more before it fails (a miscounting loop fails again). */
static void peak(pe_fma_peak *pk) {
  pe_fma_peak_measure(1, 20, 0.001, pk);
}

START_TEST(fma_peak_bounds_the_products) {
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  pe_fma_peak pk;
  peak(&pk);
  __builtin_cpu_init();
  if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core) {
    ck_assert_str_eq(pk.isa, "avx512");
    ck_assert_int_eq(pk.lanes, 16);
  } else if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2 && __builtin_cpu_supports("fma")) {
    ck_assert_str_eq(pk.isa, "avx2");
    ck_assert_int_eq(pk.lanes, 8);
  } else {
    ck_assert_str_eq(pk.isa, "sse");
    ck_assert_int_eq(pk.lanes, 4);
  }
  ck_assert_int_eq(pk.threads, 1);
  ck_assert_msg(pk.gflops > 0, "peak %g", pk.gflops);
  pe_roof_list l = collect("mlp", 128);
  pe_roof_list first = {.n = 1, .cap = 1, .items = calloc(1, sizeof(pe_roof_item))};
  first.items[0] = l.items[0]; /* [128,784] x [784,256] */
  pe_roof_totals t;
  pe_status *st = pe_roof_time(&first, 1, 3, 9, &t);
  ck_assert_msg(!st, "%s", st ? pe_status_msg(st) : "");
  double rate = t.gemm_gflop / (t.gemm_ms * 1e-3);
  if (rate > 1.25 * pk.gflops) peak(&pk);
  ck_assert_msg(rate <= 1.25 * pk.gflops && rate >= 0.1 * pk.gflops,
                "product %.1f GFLOPS against an FMA peak of %.1f (%s)", rate, pk.gflops, pk.isa);
  pe_roof_list_free(&first);
  pe_roof_list_free(&l);
}
END_TEST

static int count_kind(const pe_roof_list *l, pe_roof_kind k) {
  int n = 0;
  for (int i = 0; i < l->n; i++) n += l->items[i].g.kind == k;
  return n;
}

/* The CNN: two 5x5 convolutions (1->32 on 28x28, 32->64 on 14x14, padding
 * 2), each forward and with its weights gradient, the data gradient of the
 * second only; two fc layers (3136->1024->10) as the MLP's. */
START_TEST(cnn_lists_each_convolution_pass) {
  pe_roof_list l = collect("cnn", 16);
  ck_assert_int_eq(count_kind(&l, PE_ROOF_CONV_FWD), 2);
  ck_assert_int_eq(count_kind(&l, PE_ROOF_CONV_BWD_DATA), 1);
  ck_assert_int_eq(count_kind(&l, PE_ROOF_CONV_BWD_WEI), 2);
  ck_assert_int_eq(count_kind(&l, PE_ROOF_GEMM), 6);
  const int64_t x1[4] = {16, 1, 28, 28}, w1[4] = {32, 1, 5, 5};
  const int64_t x2[4] = {16, 32, 14, 14}, w2[4] = {64, 32, 5, 5};
  for (int i = 0; i < l.n; i++) {
    const pe_roof_geom *g = &l.items[i].g;
    if (g->kind == PE_ROOF_GEMM) continue;
    bool first = !memcmp(g->x, x1, sizeof x1) && !memcmp(g->w, w1, sizeof w1);
    bool second = !memcmp(g->x, x2, sizeof x2) && !memcmp(g->w, w2, sizeof w2);
    ck_assert_msg(first || second, "item %d (%s): unexpected conv shapes", i, l.items[i].op);
    ck_assert_msg(!first || g->kind != PE_ROOF_CONV_BWD_DATA, "the images have no gradient");
    ck_assert_int_eq(g->strides[0], 1);
    ck_assert_int_eq(g->pads[0], 2);
    ck_assert_int_eq(g->groups, 1);
  }
  pe_roof_list_free(&l);
}
END_TEST

/* Every item is timed, the totals add up, and items of one geometry are
 * timed once. */
START_TEST(timing_is_positive_and_counts_every_item) {
  pe_roof_list l = collect("cnn", 8);
  pe_roof_totals t;
  pe_status *st = pe_roof_time(&l, 1, 1, 3, &t);
  ck_assert_msg(!st, "%s", st ? pe_status_msg(st) : "");
  double sum = 0;
  for (int i = 0; i < l.n; i++) {
    ck_assert_msg(l.items[i].ms > 0, "item %d (%s) not timed", i, l.items[i].op);
    sum += l.items[i].ms;
  }
  ck_assert_int_eq(t.gemms + t.convs, l.n);
  ck_assert_int_eq(t.convs, 5);
  ck_assert(t.gemm_ms > 0 && t.conv_ms > 0 && t.gemm_gflop > 0 && t.conv_gflop > 0);
  ck_assert_double_eq_tol(t.gemm_ms + t.conv_ms, sum, 1e-9);
  ck_assert_int_le(t.distinct, l.n);
  /* A list with one item twice times it once. */
  pe_roof_list two = {.n = 2, .cap = 2, .items = calloc(2, sizeof(pe_roof_item))};
  two.items[0] = two.items[1] = l.items[0];
  st = pe_roof_time(&two, 1, 0, 1, &t);
  ck_assert_msg(!st, "%s", st ? pe_status_msg(st) : "");
  ck_assert_int_eq(t.distinct, 1);
  ck_assert_double_eq(two.items[0].ms, two.items[1].ms);
  pe_roof_list_free(&two);
  pe_roof_list_free(&l);
}
END_TEST

/* Every conv_algo mode times every convolution: a candidate without a
 * primitive for a shape (Winograd off AVX-512, on 5x5 filters) falls back
 * to direct, and time (one-thread choices included on a team of 2) keeps
 * a positive time. */
START_TEST(every_conv_algo_mode_times) {
  pe_roof_list l = collect("cnn", 4);
  const char *modes[] = {"time", "direct", "gemm", "winograd", "auto"};
  for (int i = 0; i < 5; i++) {
    int mode;
    ck_assert(pe_conv_algo_parse(modes[i], &mode));
    pe_conv_algo_set_mode(mode);
    pe_roof_totals t;
    pe_status *st = pe_roof_time(&l, 2, 0, 1, &t);
    ck_assert_msg(!st, "%s: %s", modes[i], st ? pe_status_msg(st) : "");
    ck_assert_msg(t.convs == 5 && t.conv_ms > 0, "%s: %d convs, %g ms", modes[i], t.convs,
                  t.conv_ms);
  }
  pe_conv_algo_set_mode(PE_CONV_DIRECT);
  pe_roof_list_free(&l);
}
END_TEST

/* An unknown dim besides the batch names the op, the variable and the
 * shape; a batch below 1 and a bad repeat count are refused. */
START_TEST(unknown_shapes_are_named) {
  pe_model_spec m;
  pe_program *p = compiled("mlp", &m);
  pe_block *b = p->blocks[p->main_block];
  const pe_op_desc *mul = NULL;
  for (int i = 0; i < b->n_ops && !mul; i++)
    if (!strcmp(b->ops[i]->type, "matmul")) mul = b->ops[i];
  ck_assert_ptr_nonnull(mul);
  const char *y = pe_op_input_arg(mul, "Y");
  pe_var_desc *v = pe_block_find_var(p, b, y);
  ck_assert_ptr_nonnull(v);
  v->shape.d[1] = -1;
  pe_roof_list l;
  pe_status *st = pe_roof_collect(p, 32, &l);
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
  const char *msg = pe_status_msg(st);
  ck_assert_msg(strstr(msg, "(matmul)") && strstr(msg, y) && strstr(msg, "unknown dim 1"), "%s",
                msg);
  pe_status_free(st);
  ck_assert_int_eq(l.n, 0);
  st = pe_roof_collect(p, 0, &l);
  ck_assert_msg(st && strstr(pe_status_msg(st), "batch 0"), "%s", st ? pe_status_msg(st) : "");
  pe_status_free(st);
  pe_roof_totals t;
  st = pe_roof_time(&l, 1, 0, 0, &t);
  ck_assert_msg(st && strstr(pe_status_msg(st), "repeats 0"), "%s", st ? pe_status_msg(st) : "");
  pe_status_free(st);
  pe_program_free(p);
  pe_model_spec_release(&m);
}
END_TEST

static Suite *roofline_suite(void) {
  Suite *s = suite_create("roofline");
  TCase *tc = tcase_create("roofline");
  tcase_add_test(tc, mlp_lists_each_layer_product);
  tcase_add_test(tc, cnn_lists_each_convolution_pass);
  tcase_add_test(tc, timing_is_positive_and_counts_every_item);
  tcase_add_test(tc, every_conv_algo_mode_times);
  tcase_add_test(tc, unknown_shapes_are_named);
  tcase_add_test(tc, fma_peak_bounds_the_products);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(roofline_suite)
