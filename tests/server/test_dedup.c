/* The reply cache: new / done / waiting, stored copies, bounds, client 0. */
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "server/dedup.h"

START_TEST(test_new_done_waiting) {
  pe_dedup *d = pe_dedup_new(16, 1 << 20);
  ck_assert_ptr_nonnull(d);
  uint8_t *r = NULL;
  size_t len = 0;
  int waiter1 = 1, waiter2 = 2;
  ck_assert_int_eq(pe_dedup_begin(d, 7, 1, NULL, &r, &len), PE_DEDUP_NEW);
  /* Same id while in flight: parked. */
  ck_assert_int_eq(pe_dedup_begin(d, 7, 1, &waiter1, &r, &len), PE_DEDUP_WAITING);
  ck_assert_int_eq(pe_dedup_begin(d, 7, 1, &waiter2, &r, &len), PE_DEDUP_WAITING);
  /* Another client's request 1 is another request. */
  ck_assert_int_eq(pe_dedup_begin(d, 8, 1, NULL, &r, &len), PE_DEDUP_NEW);
  void **w;
  int nw;
  pe_dedup_finish(d, 7, 1, (const uint8_t *)"reply-1", 7, &w, &nw);
  ck_assert_int_eq(nw, 2);
  ck_assert_ptr_eq(w[0], &waiter1);
  ck_assert_ptr_eq(w[1], &waiter2);
  free(w);
  ck_assert_int_eq(pe_dedup_begin(d, 7, 1, NULL, &r, &len), PE_DEDUP_DONE);
  ck_assert_uint_eq(len, 7);
  ck_assert_int_eq(memcmp(r, "reply-1", 7), 0);
  free(r);
  pe_dedup_stats st;
  pe_dedup_stats_get(d, &st);
  ck_assert_uint_eq(st.entries, 1);
  ck_assert_uint_eq(st.in_flight, 1); /* client 8 */
  ck_assert_uint_eq(st.hits, 1);
  ck_assert_uint_eq(st.waits, 2);
  pe_dedup_finish(d, 8, 1, (const uint8_t *)"x", 1, &w, &nw);
  ck_assert_int_eq(nw, 0);
  free(w);
  pe_dedup_forget_client(d, 7);
  ck_assert_int_eq(pe_dedup_begin(d, 7, 1, NULL, &r, &len), PE_DEDUP_NEW);
  pe_dedup_free(d);
}
END_TEST

START_TEST(test_client_zero_opts_out) {
  pe_dedup *d = pe_dedup_new(16, 1 << 20);
  uint8_t *r;
  size_t len;
  void **w;
  int nw;
  ck_assert_int_eq(pe_dedup_begin(d, 0, 5, NULL, &r, &len), PE_DEDUP_NEW);
  pe_dedup_finish(d, 0, 5, (const uint8_t *)"a", 1, &w, &nw);
  ck_assert_int_eq(pe_dedup_begin(d, 0, 5, NULL, &r, &len), PE_DEDUP_NEW);
  pe_dedup_free(d);
}
END_TEST

START_TEST(test_bounds_evict_oldest) {
  pe_dedup *d = pe_dedup_new(4, 100);
  uint8_t *r;
  size_t len;
  void **w;
  int nw;
  uint8_t payload[40] = {0};
  for (uint64_t i = 1; i <= 10; i++) {
    ck_assert_int_eq(pe_dedup_begin(d, 1, i, NULL, &r, &len), PE_DEDUP_NEW);
    payload[0] = (uint8_t)i;
    pe_dedup_finish(d, 1, i, payload, i == 10 ? 40 : 10, &w, &nw);
    free(w);
  }
  pe_dedup_stats st;
  pe_dedup_stats_get(d, &st);
  ck_assert_uint_le(st.entries, 4);
  ck_assert_uint_le(st.bytes, 100);
  ck_assert_uint_eq(st.evictions, 10 - st.entries);
  /* The newest survive, the oldest are gone. */
  ck_assert_int_eq(pe_dedup_begin(d, 1, 10, NULL, &r, &len), PE_DEDUP_DONE);
  ck_assert_int_eq(r[0], 10);
  free(r);
  ck_assert_int_eq(pe_dedup_begin(d, 1, 9, NULL, &r, &len), PE_DEDUP_DONE);
  free(r);
  ck_assert_int_eq(pe_dedup_begin(d, 1, 1, NULL, &r, &len), PE_DEDUP_NEW);
  /* Tighter limits evict down to them. */
  pe_dedup_set_limits(d, 1, 100);
  pe_dedup_stats_get(d, &st);
  ck_assert_uint_eq(st.entries, 1);
  ck_assert_int_eq(pe_dedup_begin(d, 1, 10, NULL, &r, &len), PE_DEDUP_DONE);
  free(r);
  pe_dedup_free(d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("server_dedup");
  TCase *tc = tcase_create("dedup");
  tcase_add_test(tc, test_new_done_waiting);
  tcase_add_test(tc, test_client_zero_opts_out);
  tcase_add_test(tc, test_bounds_evict_oldest);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
