/* Reply packing: a reply goes out as built when it can; over max_message it
 * becomes INVALID_ARGUMENT, and when its buffer cannot be allocated an
 * OUT_OF_MEMORY notice packed without allocating takes its place. In every
 * case the ids survive, so the reply cache can answer resends with it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "core/status.h"
#include "server/reply_pack.h"

static int allocs;
static void *no_memory(size_t bytes) {
  (void)bytes;
  allocs++;
  return NULL;
}

/* A run reply fetching one tensor of `bytes` bytes. */
typedef struct run_reply {
  Pe__Reply rep;
  Pe__RunReply run;
  Pe__Tensor t, *tp;
  uint8_t *data;
} run_reply;

static void run_reply_init(run_reply *r, size_t bytes) {
  r->rep = (Pe__Reply)PE__REPLY__INIT;
  r->run = (Pe__RunReply)PE__RUN_REPLY__INIT;
  r->t = (Pe__Tensor)PE__TENSOR__INIT;
  r->data = calloc(bytes, 1);
  ck_assert_ptr_nonnull(r->data);
  for (size_t i = 0; i < bytes; i++) r->data[i] = (uint8_t)(i * 7);
  r->t.name = "fc_0.w";
  r->t.data.data = r->data;
  r->t.data.len = bytes;
  r->tp = &r->t;
  r->run.n_fetched = 1;
  r->run.fetched = &r->tp;
  r->rep.client_id = 0x1234abcdULL;
  r->rep.request_id = 77;
  r->rep.body_case = PE__REPLY__BODY_RUN;
  r->rep.run = &r->run;
}

/* One pe_reply_pack call and what came out of it, unpacked (ids checked). */
typedef struct packed {
  pe_reply_buf rb;
  const uint8_t *buf;
  size_t len;
  bool owned;
  Pe__Reply *u;
} packed;

static void pack(run_reply *r, int64_t max_message, pe_reply_alloc_fn alloc, packed *p) {
  p->len = 0;
  p->buf = pe_reply_pack(&r->rep, max_message, alloc, &p->rb, &p->len, &p->owned);
  ck_assert_ptr_nonnull(p->buf);
  p->u = pe__reply__unpack(NULL, p->len, p->buf);
  ck_assert_ptr_nonnull(p->u);
  ck_assert_uint_eq(p->u->client_id, 0x1234abcdULL);
  ck_assert_uint_eq(p->u->request_id, 77);
}

static void packed_free(packed *p, run_reply *r) {
  pe__reply__free_unpacked(p->u, NULL);
  if (p->owned) free((void *)p->buf);
  free(r->data);
}

START_TEST(test_fits_as_built) {
  run_reply r;
  run_reply_init(&r, 4000);
  packed p;
  pack(&r, 1 << 20, malloc, &p);
  ck_assert(p.owned);
  ck_assert_uint_gt(p.len, 4000);
  ck_assert_int_eq(p.u->code, 0);
  ck_assert_int_eq(p.u->body_case, PE__REPLY__BODY_RUN);
  ck_assert_uint_eq(p.u->run->fetched[0]->data.len, 4000);
  ck_assert_mem_eq(p.u->run->fetched[0]->data.data, r.data, 4000);
  ck_assert_uint_eq(p.u->max_message, 1 << 20); /* every reply tells the client the limit */
  packed_free(&p, &r);
}
END_TEST

START_TEST(test_over_max_message) {
  run_reply r;
  run_reply_init(&r, 4000);
  packed p;
  pack(&r, 1000, malloc, &p);
  ck_assert(p.owned);
  ck_assert_uint_le(p.len, 1000);
  /* rep says what went out (the server logs it). */
  ck_assert_int_eq(r.rep.code, PE_EINVAL);
  ck_assert_ptr_nonnull(strstr(r.rep.message, "exceeds max_message 1000"));
  ck_assert_int_eq(p.u->code, PE_EINVAL);
  ck_assert_int_eq(p.u->body_case, PE__REPLY__BODY__NOT_SET);
  ck_assert_ptr_nonnull(strstr(p.u->message, "fetch less per request"));
  ck_assert_ptr_nonnull(strstr(p.u->message, "the request itself was carried out"));
  ck_assert_uint_eq(p.u->max_message, 1000);
  packed_free(&p, &r);
}
END_TEST

START_TEST(test_out_of_memory_notice) {
  run_reply r;
  run_reply_init(&r, 4000);
  r.rep.max_message = 1 << 20; /* as the pack sets it */
  size_t full = pe__reply__get_packed_size(&r.rep);
  allocs = 0;
  packed p;
  pack(&r, 1 << 20, no_memory, &p);
  ck_assert_int_eq(allocs, 1);
  ck_assert(!p.owned);
  ck_assert_ptr_eq(p.buf, p.rb.notice);
  ck_assert_uint_le(p.len, sizeof p.rb.notice);
  ck_assert_int_eq(r.rep.code, PE_ENOMEM);
  ck_assert_int_eq(p.u->code, PE_ENOMEM);
  ck_assert_int_eq(p.u->body_case, PE__REPLY__BODY__NOT_SET);
  /* The size that failed, and that the request itself was applied. */
  char want[64];
  snprintf(want, sizeof want, "out of memory for the reply (%zu bytes)", full);
  ck_assert_ptr_nonnull(strstr(p.u->message, want));
  ck_assert_ptr_nonnull(strstr(p.u->message, "the request was carried out"));
  packed_free(&p, &r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("server_reply_pack");
  TCase *tc = tcase_create("reply_pack");
  tcase_add_test(tc, test_fits_as_built);
  tcase_add_test(tc, test_over_max_message);
  tcase_add_test(tc, test_out_of_memory_notice);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
