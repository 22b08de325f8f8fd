/* Decode budgets: protobuf-c's unpack through a budget's allocator fails
 * past the message's limit or past the pool that all decoded messages
 * share, says which, and gives back every byte (the message's count and
 * the pool's) when it fails or when the message is freed. */
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "server/decode_budget.h"
#include "service.pb-c.h"

/* A packed RunRequest-bearing Request of n empty feeds (2 bytes each on
 * the wire, a Pe__Tensor each unpacked); *len its length. */
static uint8_t *empty_feeds(size_t n, size_t *len) {
  Pe__Tensor t = PE__TENSOR__INIT;
  Pe__Tensor **feeds = malloc(n * sizeof *feeds);
  for (size_t i = 0; i < n; i++) feeds[i] = &t;
  Pe__RunRequest run = PE__RUN_REQUEST__INIT;
  run.n_feeds = n;
  run.feeds = feeds;
  Pe__Request rq = PE__REQUEST__INIT;
  rq.client_id = 3;
  rq.body_case = PE__REQUEST__BODY_RUN;
  rq.run = &run;
  *len = pe__request__get_packed_size(&rq);
  uint8_t *buf = malloc(*len);
  pe__request__pack(&rq, buf);
  free(feeds);
  return buf;
}

START_TEST(message_limit) {
  size_t len;
  uint8_t *buf = empty_feeds(100000, &len); /* 200 KB on the wire */
  pe_decode_budget b;
  pe_decode_budget_init(&b, NULL, 0, 4 << 20);
  ck_assert_ptr_null(pe__request__unpack(&b.alloc, len, buf));
  ck_assert(b.over_limit);
  ck_assert_int_eq(b.used, 0); /* protobuf-c freed what it had */
  pe_status *st = pe_decode_budget_error(&b, "request", len);
  ck_assert_int_eq(pe_status_code(st), PE_ENOMEM);
  ck_assert_msg(strstr(pe_status_msg(st),
                       "request (200006 bytes): decoding it takes more than "
                       "[limits] memory_per_request = 4194304 bytes"),
                "%s", pe_status_msg(st));
  pe_status_free(st);
  /* Unlimited, it decodes to over 30 bytes per byte. */
  pe_decode_budget_init(&b, NULL, 0, 0);
  Pe__Request *rq = pe__request__unpack(&b.alloc, len, buf);
  ck_assert_ptr_nonnull(rq);
  ck_assert_int_gt(b.used, (int64_t)(30 * len));
  ck_assert_ptr_null(pe_decode_budget_error(&b, "request", len));
  pe__request__free_unpacked(rq, &b.alloc);
  ck_assert_int_eq(b.used, 0);
  free(buf);
}
END_TEST

/* Two messages that fit their own limits but not the pool together: the
 * second is refused while the first is held, and decodes once it is
 * freed. */
START_TEST(pool_shared) {
  size_t len;
  uint8_t *buf = empty_feeds(20000, &len);
  pe_decode_pool pool = {0};
  pe_decode_budget a, b;
  pe_decode_budget_init(&a, &pool, 0, 0);
  Pe__Request *ra = pe__request__unpack(&a.alloc, len, buf);
  ck_assert_ptr_nonnull(ra);
  int64_t one = a.used;
  ck_assert_int_eq(atomic_load(&pool.used), one);
  int64_t limit = one + one / 2;
  pe_decode_budget_init(&b, &pool, limit, one * 2);
  ck_assert_ptr_null(pe__request__unpack(&b.alloc, len, buf));
  ck_assert(b.over_pool && !b.over_limit);
  ck_assert_int_eq(atomic_load(&pool.used), one); /* b's share given back */
  pe_status *st = pe_decode_budget_error(&b, "request", len);
  ck_assert_int_eq(pe_status_code(st), PE_EEXHAUSTED);
  ck_assert_msg(strstr(pe_status_msg(st), "memory_requests_total"), "%s", pe_status_msg(st));
  pe_status_free(st);
  pe__request__free_unpacked(ra, &a.alloc);
  ck_assert_int_eq(atomic_load(&pool.used), 0);
  pe_decode_budget_init(&b, &pool, limit, one * 2);
  Pe__Request *rb = pe__request__unpack(&b.alloc, len, buf);
  ck_assert_ptr_nonnull(rb);
  ck_assert_int_eq(atomic_load(&pool.used), one);
  pe__request__free_unpacked(rb, &b.alloc);
  ck_assert_int_eq(atomic_load(&pool.used), 0);
  free(buf);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("server_decode_budget");
  TCase *tc = tcase_create("budget");
  tcase_add_test(tc, message_limit);
  tcase_add_test(tc, pool_shared);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
