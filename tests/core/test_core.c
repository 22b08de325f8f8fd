/* Core: status, shapes, tensors, allocator, scope, strmap, rng, place specs. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "core/allocator.h"
#include "core/place.h"
#include "core/rng.h"
#include "core/scope.h"
#include "core/status.h"
#include "core/strmap.h"
#include "core/tensor.h"
#include "test_assert.h"

START_TEST(status_carries_code_and_message) {
  pe_status *st = pe_error(PE_ESHAPE, "op #%d (%s): bad", 3, "matmul");
  ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
  ck_assert_str_eq(pe_status_msg(st), "op #3 (matmul): bad");
  st = pe_status_wrap(st, "compiling %s", "main");
  ck_assert_str_eq(pe_status_msg(st), "compiling main: op #3 (matmul): bad");
  ck_assert_str_eq(pe_code_name(PE_ESHAPE), "SHAPE_MISMATCH");
  pe_status_free(st);
  ck_assert_int_eq(pe_status_code(NULL), PE_OK);
}
END_TEST

START_TEST(shapes) {
  pe_shape a = PE_SHAPE(-1, 784), b = PE_SHAPE(128, 784), c = PE_SHAPE(128, 10);
  ck_assert(pe_shape_compatible(&a, &b));
  ck_assert(!pe_shape_compatible(&b, &c));
  ck_assert_int_eq(pe_shape_numel(&a), -1);
  ck_assert_int_eq(pe_shape_numel(&b), 128 * 784);
  char buf[PE_SHAPE_STRLEN];
  ck_assert_str_eq(pe_shape_str(&a, buf, sizeof buf), "[-1,784]");
  pe_dtype dt;
  ck_assert(pe_dtype_parse("i64", &dt) && dt == PE_I64);
  ck_assert(!pe_dtype_parse("q7", &dt));
}
END_TEST

/* A zero dimension makes the whole product 0, but not that of the other
 * dimensions: [0, 2^40, 2^40]'s inner product overflows int64_t, and is
 * -1 (does not fit) rather than undefined; pe_shape_check refuses such a
 * shape, naming it, where one is read. */
START_TEST(shape_products_do_not_overflow) {
  const int64_t big = INT64_C(1) << 40;
  pe_shape z = PE_SHAPE(0, big, big);
  ck_assert_int_eq(pe_shape_numel(&z), 0);
  ck_assert_int_eq(pe_shape_prod(&z, 1, 3), -1);
  ck_assert_int_eq(pe_shape_prod(&z, 1, 2), big);
  pe_shape w = PE_SHAPE(big, big, 0);
  ck_assert_int_eq(pe_shape_numel(&w), 0);
  ck_assert_int_eq(pe_shape_prod(&w, 0, 2), -1);
  pe_shape u = PE_SHAPE(-1, 0, 3); /* unknown wins over zero */
  ck_assert_int_eq(pe_shape_numel(&u), -1);
  ck_assert_int_eq(pe_shape_prod(&u, 1, 3), 0);
  pe_shape fits = PE_SHAPE(INT64_C(1) << 31, INT64_C(1) << 31);
  ck_assert_int_eq(pe_shape_numel(&fits), INT64_C(1) << 62);

  expect_error(pe_shape_check(&z, PE_MAX_NUMEL, "tensor 'w'"), PE_ESHAPE,
               "tensor 'w': shape [0,1099511627776,1099511627776] has more than 1099511627776 "
               "elements (zero dimensions left out)");
  pe_shape neg = PE_SHAPE(4, -2);
  expect_error(pe_shape_check(&neg, PE_MAX_NUMEL, "x"), PE_ESHAPE,
               "x: shape [4,-2]: dim 1 is -2 (must be >= -1)");
  pe_shape ok = PE_SHAPE(0, big), batch = PE_SHAPE(-1, big);
  PE_CK_OK(pe_shape_check(&ok, PE_MAX_NUMEL, "x"));
  PE_CK_OK(pe_shape_check(&batch, PE_MAX_NUMEL, "x"));
  pe_shape rank = {.ndim = PE_MAX_DIMS + 1};
  expect_error(pe_shape_check(&rank, PE_MAX_NUMEL, "x"), PE_ESHAPE, "x: rank 9, at most 8");
}
END_TEST

START_TEST(allocator_caches_blocks) {
  pe_allocator *a = pe_allocator_new();
  size_t cap;
  void *p = pe_alloc(a, 1000, &cap);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_ge(cap, 1000);
  ck_assert_uint_eq((uintptr_t)p % 64, 0);
  pe_free(a, p, cap);
  size_t cap2;
  void *q = pe_alloc(a, 900, &cap2);
  ck_assert_ptr_eq(p, q); /* same size class reused */
  pe_alloc_stats s = pe_allocator_stats(a);
  ck_assert_uint_eq(s.n_alloc, 2);
  ck_assert_uint_eq(s.n_system, 1);
  pe_free(a, q, cap2);
  pe_allocator_free(a);
}
END_TEST

/* The free lists hold at most the cache limit: the memory of a large run
 * (here three 128 MiB blocks, untouched but their first page) goes back to
 * the system, largest first, while blocks under the limit stay cached and
 * are reused; not every freed block is cached for good. */
START_TEST(allocator_cache_is_bounded) {
  pe_allocator *a = pe_allocator_new();
  size_t cap[3];
  void *p[3];
  for (int i = 0; i < 3; i++) ck_assert_ptr_nonnull(p[i] = pe_alloc(a, (size_t)128 << 20, &cap[i]));
  for (int i = 0; i < 3; i++) pe_free(a, p[i], cap[i]);
  pe_alloc_stats s = pe_allocator_stats(a);
  ck_assert_uint_eq(s.bytes_in_use, 0);
  ck_assert_uint_le(s.bytes_cached, PE_ALLOC_CACHE_LIMIT);
  ck_assert_uint_eq(s.bytes_cached, (size_t)256 << 20);
  /* A lower limit: small blocks stay cached, up to it, and are reused. */
  pe_allocator_set_cache_limit(a, 4096);
  void *q[4];
  for (int i = 0; i < 4; i++) ck_assert_ptr_nonnull(q[i] = pe_alloc(a, 1024, &cap[0]));
  for (int i = 0; i < 4; i++) pe_free(a, q[i], cap[0]);
  s = pe_allocator_stats(a);
  ck_assert_uint_eq(s.bytes_cached, 4096); /* the 128 MiB blocks went first */
  uint64_t sys = s.n_system;
  void *r = pe_alloc(a, 1000, &cap[0]);
  ck_assert_uint_eq(pe_allocator_stats(a).n_system, sys);
  pe_free(a, r, cap[0]);
  pe_allocator_trim(a);
  ck_assert_uint_eq(pe_allocator_stats(a).bytes_cached, 0);
  pe_allocator_free(a);
}
END_TEST

START_TEST(tensor_resize_keeps_capacity) {
  pe_tensor t;
  pe_tensor_init(&t);
  pe_shape s = PE_SHAPE(4, 8);
  ck_assert_ptr_null(pe_tensor_resize(&t, PE_F32, &s, "t"));
  void *d = t.data;
  pe_shape s2 = PE_SHAPE(2, 8);
  ck_assert_ptr_null(pe_tensor_resize(&t, PE_F32, &s2, "t"));
  ck_assert_ptr_eq(d, t.data);
  pe_shape bad = PE_SHAPE(-1, 8);
  pe_status *st = pe_tensor_resize(&t, PE_F32, &bad, "t");
  ck_assert_int_eq(pe_status_code(st), PE_ESHAPE);
  ck_assert_ptr_nonnull(strstr(pe_status_msg(st), "[-1,8]"));
  pe_status_free(st);
  pe_tensor_release(&t);
}
END_TEST

START_TEST(scope_lookup_walks_parents) {
  pe_scope *root = pe_scope_new(NULL), *child = pe_scope_new(root);
  pe_var *w, *h, *found;
  ck_assert_ptr_null(pe_scope_var(root, "w", &w));
  ck_assert_ptr_null(pe_scope_var(child, "h", &h));
  ck_assert_ptr_eq(pe_scope_find(child, "w"), w);
  ck_assert_ptr_null(pe_scope_find(root, "h"));
  ck_assert_ptr_null(pe_scope_var(child, "h", &found));
  ck_assert_ptr_eq(found, h);
  pe_scope_free(child);
  pe_scope_free(root);
}
END_TEST

START_TEST(strmap_grows) {
  pe_strmap m;
  pe_strmap_init(&m);
  char k[32];
  for (long i = 0; i < 1000; i++) {
    snprintf(k, sizeof k, "k%ld", i);
    ck_assert(pe_strmap_put(&m, k, (void *)(i + 1)));
  }
  for (long i = 0; i < 1000; i++) {
    snprintf(k, sizeof k, "k%ld", i);
    ck_assert_ptr_eq(pe_strmap_get(&m, k), (void *)(i + 1));
  }
  ck_assert_ptr_null(pe_strmap_get(&m, "absent"));
  pe_strmap_destroy(&m);
}
END_TEST

START_TEST(rng_is_counter_based) {
  /* Same (seed, counter) -> same value; uniform mean near 0.5. */
  ck_assert(pe_rng_uniform(7, 99) == pe_rng_uniform(7, 99));
  ck_assert(pe_rng_uniform(7, 99) != pe_rng_uniform(8, 99));
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; i++) {
    sum += pe_rng_uniform(1, (uint64_t)i);
    double z = pe_rng_normal(1, (uint64_t)i);
    sq += z * z;
  }
  ck_assert_double_eq_tol(sum / 100000, 0.5, 0.01);
  ck_assert_double_eq_tol(sq / 100000, 1.0, 0.02);
}
END_TEST

/* KIND:N is a kind and a count of places; cuda:0 (one GPU, the usual
 * spelling) is one place; malformed specs are errors naming the spec. */
START_TEST(places_parse) {
  static const struct {
    const char *spec;
    pe_place_kind kind;
    int n;
  } ok[] = {{"cpu:2", PE_PLACE_CPU, 2}, {"sim:4", PE_PLACE_SIM, 4}, {"cuda:0", PE_PLACE_CUDA, 1},
            {"cuda:1", PE_PLACE_CUDA, 1}, {"cuda:2", PE_PLACE_CUDA, 2}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    pe_place_kind k = PE_PLACE_CPU;
    int n = -1;
    pe_status *st = pe_places_parse(ok[i].spec, &k, &n);
    ck_assert_msg(!st, "%s: %s", ok[i].spec, st ? pe_status_msg(st) : "");
    ck_assert_msg(k == ok[i].kind && n == ok[i].n, "%s: kind %d, %d places", ok[i].spec, (int)k, n);
  }
  static const char *const bad[][2] = {{"cpu:0", "count"},  {"sim:65", "count"}, {"gpu:1", "unknown kind"},
                                       {"cpu", "KIND:N"},   {"cpu:x", "count"},  {"cuda:-1", "count"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pe_place_kind k;
    int n;
    pe_status *st = pe_places_parse(bad[i][0], &k, &n);
    ck_assert_msg(st && strstr(pe_status_msg(st), bad[i][0]) && strstr(pe_status_msg(st), bad[i][1]),
                  "%s: %s", bad[i][0], st ? pe_status_msg(st) : "accepted");
    pe_status_free(st);
  }
}
END_TEST

static Suite *core_suite(void) {
  Suite *s = suite_create("core");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, status_carries_code_and_message);
  tcase_add_test(tc, shapes);
  tcase_add_test(tc, shape_products_do_not_overflow);
  tcase_add_test(tc, allocator_caches_blocks);
  tcase_add_test(tc, allocator_cache_is_bounded);
  tcase_add_test(tc, tensor_resize_keeps_capacity);
  tcase_add_test(tc, scope_lookup_walks_parents);
  tcase_add_test(tc, strmap_grows);
  tcase_add_test(tc, rng_is_counter_based);
  tcase_add_test(tc, places_parse);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(core_suite)
