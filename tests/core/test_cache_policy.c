/* The caching allocators' shared policy (core/cache_policy.h): size
 * classes, the bound, largest-first eviction; and the CUDA cache
 * (cuda/cuda_alloc.c, built here over a malloc backend, no GPU needed),
 * which before kept every block it was given back, so a GPU model's large
 * run kept its device memory cached for good. */
#include <stdlib.h>

#include "check_main.h"
#include "core/cache_policy.h"
#include "cuda/cuda_alloc.h"

START_TEST(classes_round_up_to_powers_of_two) {
  pe_cache_policy p;
  pe_cache_policy_init(&p, 8, 0);
  size_t r;
  ck_assert_int_eq(pe_cache_class(&p, 0, &r), 0);
  ck_assert_uint_eq(r, 256);
  ck_assert_int_eq(pe_cache_class(&p, 256, &r), 0);
  ck_assert_int_eq(pe_cache_class(&p, 257, &r), 1);
  ck_assert_uint_eq(r, 512);
  ck_assert_int_eq(pe_cache_class(&p, (size_t)1 << 20, &r), 12);
  ck_assert_uint_eq(r, (size_t)1 << 20);
  ck_assert_int_eq(pe_cache_class(&p, ((size_t)1 << (8 + PE_CACHE_CLASSES - 1)) + 1, &r), -1);
}
END_TEST

/* Within the limit nothing is evicted (a steady loop's churn stays
 * cached); past it the largest cached class goes first, until it fits. */
START_TEST(evicts_largest_first_down_to_the_limit) {
  pe_cache_policy p;
  pe_cache_policy_init(&p, 6, 4096);
  int k64 = 0, k1k = 4, k4k = 6;
  ck_assert_uint_eq(pe_cache_class_bytes(&p, k1k), 1024);
  for (int i = 0; i < 4; i++) pe_cache_put(&p, k1k);
  pe_cache_put(&p, k64);
  ck_assert_uint_eq(p.cached, 4096 + 64);
  ck_assert_int_eq(pe_cache_victim(&p), k1k);
  ck_assert(pe_cache_take(&p, k1k));
  ck_assert_int_eq(pe_cache_victim(&p), -1); /* 3136 bytes: fits */
  pe_cache_put(&p, k4k);
  ck_assert_int_eq(pe_cache_victim(&p), k4k);
  ck_assert(pe_cache_take(&p, k4k));
  ck_assert(!pe_cache_take(&p, k4k)); /* none left: nothing changes */
  ck_assert_uint_eq(p.cached, 3 * 1024 + 64);
  p.limit = 0;
  int order[8], n = 0;
  for (int k; (k = pe_cache_victim(&p)) >= 0 && n < 8;) {
    order[n++] = k;
    pe_cache_take(&p, k);
  }
  ck_assert_int_eq(n, 4);
  ck_assert_int_eq(order[0], k1k);
  ck_assert_int_eq(order[3], k64);
  ck_assert_uint_eq(p.cached, 0);
}
END_TEST

/* A backend over malloc that counts what it holds. */
typedef struct fake_mem {
  size_t held;
  int allocs, frees;
} fake_mem;

static void *fake_alloc(size_t bytes, void *arg) {
  fake_mem *m = arg;
  m->held += bytes;
  m->allocs++;
  void *p = malloc(sizeof(size_t));
  *(size_t *)p = bytes;
  return p;
}

static void fake_free(void *p, void *arg) {
  fake_mem *m = arg;
  m->held -= *(size_t *)p;
  m->frees++;
  free(p);
}

/* The CUDA cache holds at most its limit: what a release would cache past
 * it goes back to the backend (cudaFree), largest first; blocks within it
 * are reused without a backend call. */
START_TEST(cuda_cache_is_bounded) {
  fake_mem m = {0};
  pe_cuda_cache *c = pe_cuda_cache_new((pe_cuda_backend){fake_alloc, fake_free, &m}, 1 << 20);
  size_t cap[4];
  void *big[3];
  for (int i = 0; i < 3; i++)
    ck_assert_ptr_nonnull(big[i] = pe_cuda_cache_alloc(c, 600000, &cap[i]));
  ck_assert_uint_eq(cap[0], 1 << 20);
  ck_assert_uint_eq(m.held, 3u << 20);
  for (int i = 0; i < 3; i++) pe_cuda_cache_release(c, big[i], cap[i]);
  pe_alloc_stats s = pe_cuda_cache_stats(c);
  ck_assert_uint_eq(s.bytes_in_use, 0);
  ck_assert_uint_eq(s.bytes_cached, 1 << 20);
  ck_assert_uint_eq(m.held, 1 << 20); /* two went back to the backend */
  ck_assert_int_eq(m.frees, 2);
  /* The cached one is reused without a backend call. */
  int allocs = m.allocs;
  void *again = pe_cuda_cache_alloc(c, 700000, &cap[3]);
  ck_assert_int_eq(m.allocs, allocs);
  pe_cuda_cache_release(c, again, cap[3]);
  /* Small blocks cached next to it: the large one is evicted first. */
  void *small[4];
  for (int i = 0; i < 4; i++) small[i] = pe_cuda_cache_alloc(c, 4096, &cap[i]);
  for (int i = 0; i < 4; i++) pe_cuda_cache_release(c, small[i], cap[i]);
  s = pe_cuda_cache_stats(c);
  ck_assert_uint_eq(s.bytes_cached, 4 * 4096);
  ck_assert_uint_eq(m.held, 4 * 4096);
  /* A lower limit gives back the excess now; trim gives back all. */
  pe_cuda_cache_set_limit(c, 8192);
  ck_assert_uint_eq(pe_cuda_cache_stats(c).bytes_cached, 8192);
  ck_assert_uint_eq(m.held, 8192);
  pe_cuda_cache_trim(c);
  ck_assert_uint_eq(m.held, 0);
  pe_cuda_cache_free(c);
  ck_assert_int_eq(m.allocs, m.frees);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cache_policy");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, classes_round_up_to_powers_of_two);
  tcase_add_test(tc, evicts_largest_first_down_to_the_limit);
  tcase_add_test(tc, cuda_cache_is_bounded);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
