/* The reply cache: new / done / waiting / stale, replies in receive order
 * (never an older copy after a newer one), stored copies, bounds, client 0. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "server/reply_cache.h"

/* What send() was asked to do, in order. */
typedef struct sent_log {
  int n;
  void *to[64];
  char reply[64][16];
} sent_log;

static void record_send(void *ctx, void *job, const uint8_t *reply, size_t len) {
  sent_log *lg = ctx;
  ck_assert_int_lt(lg->n, 64);
  lg->to[lg->n] = job;
  size_t k = len < 15 ? len : 15;
  memcpy(lg->reply[lg->n], reply, k);
  lg->reply[lg->n][k] = 0;
  lg->n++;
}

START_TEST(test_new_done_waiting) {
  sent_log lg = {0};
  pe_reply_cache *d = pe_reply_cache_new(16, 1 << 20, record_send, &lg);
  ck_assert_ptr_nonnull(d);
  int orig = 0, copy1 = 1, copy2 = 2, later = 3;
  ck_assert_int_eq(pe_reply_cache_begin(d, 7, 1, 10, &orig), PE_DEDUP_NEW);
  /* Same id while in flight: parked (taken out of order: 12 before 11). */
  ck_assert_int_eq(pe_reply_cache_begin(d, 7, 1, 12, &copy2), PE_DEDUP_WAITING);
  ck_assert_int_eq(pe_reply_cache_begin(d, 7, 1, 11, &copy1), PE_DEDUP_WAITING);
  /* Another client's request 1 is another request. */
  ck_assert_int_eq(pe_reply_cache_begin(d, 8, 1, 13, &later), PE_DEDUP_NEW);
  ck_assert_int_eq(lg.n, 0); /* nothing answered before the reply exists */
  /* finish answers every copy in receive order and hands the parked back. */
  pe_reply_cache_copy *parked;
  ck_assert_int_eq(pe_reply_cache_finish(d, 7, 1, 10, &orig, (const uint8_t *)"reply-1", 7, &parked), 2);
  ck_assert_ptr_eq(parked[0].job, &copy1);
  ck_assert_ptr_eq(parked[1].job, &copy2);
  free(parked);
  ck_assert_int_eq(lg.n, 3);
  ck_assert_ptr_eq(lg.to[0], &orig);
  ck_assert_ptr_eq(lg.to[1], &copy1);
  ck_assert_ptr_eq(lg.to[2], &copy2);
  ck_assert_str_eq(lg.reply[2], "reply-1");
  /* A later resend is answered from the stored reply. */
  ck_assert_int_eq(pe_reply_cache_begin(d, 7, 1, 14, &copy1), PE_DEDUP_DONE);
  ck_assert_int_eq(lg.n, 4);
  ck_assert_ptr_eq(lg.to[3], &copy1);
  ck_assert_str_eq(lg.reply[3], "reply-1");
  pe_reply_cache_stats st;
  pe_reply_cache_stats_get(d, &st);
  ck_assert_uint_eq(st.entries, 1);
  ck_assert_uint_eq(st.in_flight, 1); /* client 8 */
  ck_assert_uint_eq(st.hits, 1);
  ck_assert_uint_eq(st.waits, 2);
  ck_assert_uint_eq(st.stale, 0);
  /* No parked copy: the original alone is answered. */
  ck_assert_int_eq(pe_reply_cache_finish(d, 8, 1, 13, &later, (const uint8_t *)"x", 1, &parked), 0);
  free(parked);
  ck_assert_ptr_eq(lg.to[4], &later);
  pe_reply_cache_forget_client(d, 7);
  ck_assert_int_eq(pe_reply_cache_begin(d, 7, 1, 15, &orig), PE_DEDUP_NEW);
  pe_reply_cache_free(d);
}
END_TEST

/* Request threads can take copies out of arrival order: the original may be
 * newer than a parked copy (answered after it), and a copy older than one
 * already answered from the stored reply is not answered (nanomsg's REQ
 * socket would lose the newer reply to it). */
START_TEST(test_older_copies_never_after_newer) {
  sent_log lg = {0};
  pe_reply_cache *d = pe_reply_cache_new(16, 1 << 20, record_send, &lg);
  int a = 0, b = 1, c = 2, e = 3;
  pe_reply_cache_copy *parked;
  /* Copy 21 starts first and runs; copy 20 (older) is parked. */
  ck_assert_int_eq(pe_reply_cache_begin(d, 5, 9, 21, &b), PE_DEDUP_NEW);
  ck_assert_int_eq(pe_reply_cache_begin(d, 5, 9, 20, &a), PE_DEDUP_WAITING);
  ck_assert_int_eq(pe_reply_cache_finish(d, 5, 9, 21, &b, (const uint8_t *)"r", 1, &parked), 1);
  free(parked);
  ck_assert_int_eq(lg.n, 2);
  ck_assert_ptr_eq(lg.to[0], &a); /* 20 before 21 */
  ck_assert_ptr_eq(lg.to[1], &b);
  /* Done: 23 answered; then 22 shows up late: stale, not answered. */
  ck_assert_int_eq(pe_reply_cache_begin(d, 5, 9, 23, &e), PE_DEDUP_DONE);
  ck_assert_int_eq(pe_reply_cache_begin(d, 5, 9, 22, &c), PE_DEDUP_STALE);
  ck_assert_int_eq(lg.n, 3);
  ck_assert_ptr_eq(lg.to[2], &e);
  /* The same copy number again (cannot come from the socket): stale. */
  ck_assert_int_eq(pe_reply_cache_begin(d, 5, 9, 23, &e), PE_DEDUP_STALE);
  pe_reply_cache_stats st;
  pe_reply_cache_stats_get(d, &st);
  ck_assert_uint_eq(st.stale, 2);
  pe_reply_cache_free(d);
}
END_TEST

/* Many threads race copies of one request through begin/finish, as the
 * server's request threads do: the answers, in the order send() ran, must
 * have strictly increasing copy numbers, and the newest copy is answered. */
typedef struct race {
  pe_reply_cache *d;
  pthread_mutex_t mu; /* serialises only the log, like the server's queue */
  int answered[256], n;
  int copies[256];
  _Atomic int next;
} race;

static void race_send(void *ctx, void *job, const uint8_t *reply, size_t len) {
  race *r = ctx;
  pthread_mutex_lock(&r->mu);
  r->answered[r->n++] = *(int *)job;
  pthread_mutex_unlock(&r->mu);
}

static void *race_thread(void *arg) {
  race *r = arg;
  for (int i; (i = r->next++) < 256;) {
    /* copies[i] == i: its seq is its index + 1 (arrival order) */
    uint64_t seq = (uint64_t)i + 1;
    if (pe_reply_cache_begin(r->d, 3, 3, seq, &r->copies[i]) == PE_DEDUP_NEW) {
      pe_reply_cache_copy *parked;
      pe_reply_cache_finish(r->d, 3, 3, seq, &r->copies[i], (const uint8_t *)"z", 1, &parked);
      free(parked);
    }
  }
  return NULL;
}

START_TEST(test_racing_copies_answer_in_order) {
  for (int round = 0; round < 50; round++) {
    race r = {.n = 0};
    pthread_mutex_init(&r.mu, NULL);
    for (int i = 0; i < 256; i++) r.copies[i] = i;
    r.d = pe_reply_cache_new(16, 1 << 20, race_send, &r);
    pthread_t t[4];
    for (int k = 0; k < 4; k++) pthread_create(&t[k], NULL, race_thread, &r);
    for (int k = 0; k < 4; k++) pthread_join(t[k], NULL);
    ck_assert_int_ge(r.n, 1);
    for (int k = 1; k < r.n; k++)
      ck_assert_msg(r.answered[k] > r.answered[k - 1], "round %d: copy %d answered after copy %d",
                    round, r.answered[k], r.answered[k - 1]);
    ck_assert_int_eq(r.answered[r.n - 1], 255);
    pe_reply_cache_free(r.d);
    pthread_mutex_destroy(&r.mu);
  }
}
END_TEST

START_TEST(test_client_zero_opts_out) {
  sent_log lg = {0};
  pe_reply_cache *d = pe_reply_cache_new(16, 1 << 20, record_send, &lg);
  int a = 0, b = 1;
  pe_reply_cache_copy *parked;
  ck_assert_int_eq(pe_reply_cache_begin(d, 0, 5, 1, &a), PE_DEDUP_NEW);
  ck_assert_int_eq(pe_reply_cache_finish(d, 0, 5, 1, &a, (const uint8_t *)"a", 1, &parked), 0);
  ck_assert_int_eq(lg.n, 1);
  ck_assert_ptr_eq(lg.to[0], &a);
  ck_assert_int_eq(pe_reply_cache_begin(d, 0, 5, 2, &b), PE_DEDUP_NEW);
  pe_reply_cache_free(d);
}
END_TEST

START_TEST(test_bounds_evict_oldest) {
  sent_log lg = {0};
  pe_reply_cache *d = pe_reply_cache_new(4, 100, record_send, &lg);
  int job = 0;
  pe_reply_cache_copy *parked;
  uint64_t seq = 0;
  uint8_t payload[40] = {0};
  for (uint64_t i = 1; i <= 10; i++) {
    ck_assert_int_eq(pe_reply_cache_begin(d, 1, i, ++seq, &job), PE_DEDUP_NEW);
    payload[0] = (uint8_t)i;
    pe_reply_cache_finish(d, 1, i, seq, &job, payload, i == 10 ? 40 : 10, &parked);
    free(parked);
  }
  pe_reply_cache_stats st;
  pe_reply_cache_stats_get(d, &st);
  ck_assert_uint_le(st.entries, 4);
  ck_assert_uint_le(st.bytes, 100);
  ck_assert_uint_eq(st.evictions, 10 - st.entries);
  /* The newest survive, the oldest are gone. */
  lg.n = 0;
  ck_assert_int_eq(pe_reply_cache_begin(d, 1, 10, ++seq, &job), PE_DEDUP_DONE);
  ck_assert_int_eq(lg.reply[0][0], 10);
  ck_assert_int_eq(pe_reply_cache_begin(d, 1, 9, ++seq, &job), PE_DEDUP_DONE);
  ck_assert_int_eq(pe_reply_cache_begin(d, 1, 1, ++seq, &job), PE_DEDUP_NEW);
  /* Tighter limits evict down to them. */
  pe_reply_cache_set_limits(d, 1, 100);
  pe_reply_cache_stats_get(d, &st);
  ck_assert_uint_eq(st.entries, 1);
  ck_assert_int_eq(pe_reply_cache_begin(d, 1, 10, ++seq, &job), PE_DEDUP_DONE);
  pe_reply_cache_free(d);
}
END_TEST
static Suite *suite(void) {
  Suite *s = suite_create("server_dedup");
  TCase *tc = tcase_create("dedup");
  tcase_add_test(tc, test_new_done_waiting);
  tcase_add_test(tc, test_older_copies_never_after_newer);
  tcase_add_test(tc, test_racing_copies_answer_in_order);
  tcase_add_test(tc, test_client_zero_opts_out);
  tcase_add_test(tc, test_bounds_evict_oldest);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
