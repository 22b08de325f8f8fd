/* The order rule's map (server/lanes_order.h) with many clients: the map
 * grows past its first slots, and clients leave it in an order other than
 * they came (deletion moves the entries that probed past a freed slot):
 * each client's first request goes, the others wait and come back one at
 * a time, in receive order, as the one before starts; a client whose
 * requests all started is gone (its next request goes at once). */
#include <stdlib.h>

#include "check_main.h"
#include "server/lanes_order.h"

#define CLIENTS 3000
#define PER 3

static pe_job *job(uint64_t client, uint64_t seq) {
  pe_job *j = calloc(1, sizeof *j);
  ck_assert_ptr_nonnull(j);
  j->client = client;
  j->seq = seq;
  return j;
}

/* Client i's id: small and large ones, some sharing low bits. */
static uint64_t id(int i) {
  return i % 2 ? (uint64_t)i + 1 : ((uint64_t)i << 40) | 1u;
}

START_TEST(many_clients_keep_their_order) {
  pe_lanes_order o;
  ck_assert(pe_lanes_order_init(&o));
  static pe_job *free_go[CLIENTS];
  uint64_t seq = 0;
  for (int k = 0; k < PER; k++)
    for (int i = 0; i < CLIENTS; i++) {
      pe_job *j = job(id(i), ++seq);
      pe_order_verdict v = pe_lanes_order_add(&o, j);
      ck_assert_int_eq(v, k == 0 ? PE_ORDER_GO : PE_ORDER_WAIT);
      if (k == 0) free_go[i] = j;
    }
  ck_assert_uint_eq(o.n, CLIENTS);
  /* Start the free ones, clients in a scattered order, round by round. */
  for (int k = 0; k < PER; k++)
    for (int n = 0; n < CLIENTS; n++) {
      int i = (int)((n * 7919L) % CLIENTS);
      ck_assert_ptr_nonnull(free_go[i]);
      ck_assert_uint_eq(free_go[i]->seq, (uint64_t)k * CLIENTS + (uint64_t)i + 1);
      pe_job_free(free_go[i]);
      free_go[i] = pe_lanes_order_started(&o, id(i));
      ck_assert(k < PER - 1 ? free_go[i] != NULL : free_go[i] == NULL);
    }
  ck_assert_uint_eq(o.n, 0);
  /* Gone: a new request of each goes at once. */
  for (int i = 0; i < CLIENTS; i++) {
    pe_job *j = job(id(i), ++seq);
    ck_assert_int_eq(pe_lanes_order_add(&o, j), PE_ORDER_GO);
    pe_job_free(j);
  }
  /* Destroy frees what still waits. */
  for (int i = 0; i < 10; i++)
    ck_assert_int_eq(pe_lanes_order_add(&o, job(id(i), ++seq)), PE_ORDER_WAIT);
  pe_lanes_order_destroy(&o);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("lanes_order");
  TCase *tc = tcase_create("map");
  tcase_add_test(tc, many_clients_keep_their_order);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
