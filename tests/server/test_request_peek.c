/* Reading a request's client id and body kind off its bytes (the main
 * thread's choice of lane): every body kind as protobuf-c packs it, unknown
 * fields of each wire type, two bodies (the last wins, as unpack has it),
 * truncated and garbage bytes; and which kinds are control. */
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "server/dispatch.h"
#include "server/request_decode.h"
#include "server/request_peek.h"
#include "test_assert.h"

/* Pack rq into buf (cap bytes); its length. */
static size_t pack(const Pe__Request *rq, uint8_t *buf, size_t cap) {
  size_t n = pe__request__get_packed_size(rq);
  ck_assert_uint_le(n, cap);
  pe__request__pack(rq, buf);
  return n;
}

/* A request of client 0x1234567890 with a body of kind k (sub-messages
 * empty but for a RunRequest of program `handle` with a 1 KiB feed, to
 * skip). */
static size_t pack_run_or(Pe__Request__BodyCase k, uint64_t handle, uint8_t *buf, size_t cap) {
  static uint8_t data[1024];
  Pe__Request rq = PE__REQUEST__INIT;
  rq.client_id = 0x1234567890ull;
  rq.request_id = 77;
  rq.client_pid = 4242;
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  Pe__InitRequest in = PE__INIT_REQUEST__INIT;
  Pe__RunRequest run = PE__RUN_REQUEST__INIT;
  Pe__Tensor t = PE__TENSOR__INIT, *feeds[] = {&t};
  t.name = (char *)"x";
  t.data.data = data;
  t.data.len = sizeof data;
  run.n_feeds = 1;
  run.feeds = feeds;
  run.handle = handle;
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  Pe__CheckpointRequest cr = PE__CHECKPOINT_REQUEST__INIT;
  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  Pe__ShmRequest sr = PE__SHM_REQUEST__INIT;
  Pe__DropModelRequest dm = PE__DROP_MODEL_REQUEST__INIT;
  rq.body_case = k;
  switch (k) {
    case PE__REQUEST__BODY_PING: rq.ping = 1; break;
    case PE__REQUEST__BODY_REGISTER: rq.register_ = &reg; break;
    case PE__REQUEST__BODY_INIT: rq.init = &in; break;
    case PE__REQUEST__BODY_RUN: rq.run = &run; break;
    case PE__REQUEST__BODY_GET_PARAMS: rq.get_params = &pr; break;
    case PE__REQUEST__BODY_SET_PARAMS: rq.set_params = &pr; break;
    case PE__REQUEST__BODY_SAVE: rq.save = &cr; break;
    case PE__REQUEST__BODY_LOAD: rq.load = &cr; break;
    case PE__REQUEST__BODY_DEREGISTER: rq.deregister = &dr; break;
    case PE__REQUEST__BODY_STATUS: rq.status = 1; break;
    case PE__REQUEST__BODY_REGISTER_SHM: rq.register_shm = &sr; break;
    case PE__REQUEST__BODY_UNREGISTER_SHM: rq.unregister_shm = &sr; break;
    case PE__REQUEST__BODY_CLOSE: rq.close = 1; break;
    case PE__REQUEST__BODY_DROP_MODEL: rq.drop_model = &dm; break;
    default: ck_abort_msg("kind %d", (int)k);
  }
  return pack(&rq, buf, cap);
}

static size_t pack_kind(Pe__Request__BodyCase k, uint8_t *buf, size_t cap) {
  return pack_run_or(k, 0, buf, cap);
}

START_TEST(test_every_kind) {
  static uint8_t buf[4096];
  for (int k = PE__REQUEST__BODY_PING; k <= PE__REQUEST__BODY_DROP_MODEL; k++) {
    size_t n = pack_kind((Pe__Request__BodyCase)k, buf, sizeof buf);
    pe_request_peek pk;
    ck_assert_msg(pe_request_peek_read(buf, n, &pk), "kind %d not read", k);
    ck_assert_int_eq(pk.kind, k);
    ck_assert_uint_eq(pk.client, 0x1234567890ull);
    /* What unpack decodes agrees. */
    Pe__Request *rq = pe__request__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(rq);
    ck_assert_int_eq(rq->body_case, pk.kind);
    pe__request__free_unpacked(rq, NULL);
  }
}
END_TEST

START_TEST(test_unknown_fields_and_two_bodies) {
  /* client_id 5, field 99 varint, field 100 fixed64, field 101 bytes,
   * field 102 fixed32, a run body (13, empty), then ping (10) = 1. */
  const uint8_t m[] = {0x08, 0x05, 0x98, 0x06, 0x01, 0xa1, 0x06, 1,    2,    3,
                       4,    5,    6,    7,    8,    0xaa, 0x06, 0x02, 0xff, 0xff,
                       0xb5, 0x06, 1,    2,    3,    4,    0x6a, 0x00, 0x50, 0x01};
  pe_request_peek pk;
  ck_assert(pe_request_peek_read(m, sizeof m, &pk));
  ck_assert_uint_eq(pk.client, 5);
  ck_assert_int_eq(pk.kind, PE__REQUEST__BODY_PING);
  Pe__Request *rq = pe__request__unpack(NULL, sizeof m, m);
  ck_assert_ptr_nonnull(rq);
  ck_assert_int_eq(rq->body_case, PE__REQUEST__BODY_PING);
  pe__request__free_unpacked(rq, NULL);
  /* No body, no client: read, both zero. */
  ck_assert(pe_request_peek_read(m, 0, &pk));
  ck_assert_int_eq(pk.kind, PE__REQUEST__BODY__NOT_SET);
  ck_assert_uint_eq(pk.client, 0);
}
END_TEST

/* A Run's handle (the run lane's read-only check), past a 1 KiB feed;
 * of several run bodies the last one's, as unpack has it; none: 0. */
START_TEST(test_run_handle) {
  static uint8_t buf[4096];
  size_t n = pack_run_or(PE__REQUEST__BODY_RUN, 0xfeedface12345678ull, buf, sizeof buf);
  pe_request_peek pk;
  ck_assert(pe_request_peek_read(buf, n, &pk));
  ck_assert_int_eq(pk.kind, PE__REQUEST__BODY_RUN);
  ck_assert_uint_eq(pk.run_handle, 0xfeedface12345678ull);
  /* Run bodies {handle 5, steps 2}, {handle 7}, then {steps 1} or not. */
  const uint8_t three[] = {0x6a, 0x04, 0x08, 0x05, 0x20, 0x02, 0x6a,
                           0x02, 0x08, 0x07, 0x6a, 0x02, 0x20, 0x01};
  for (size_t len = sizeof three - 4; len <= sizeof three; len += 4) {
    ck_assert(pe_request_peek_read(three, len, &pk));
    Pe__Request *u = pe__request__unpack(NULL, len, three);
    ck_assert_ptr_nonnull(u);
    ck_assert_uint_eq(u->run->handle, len < sizeof three ? 7 : 0);
    ck_assert_uint_eq(pk.run_handle, u->run->handle);
    pe__request__free_unpacked(u, NULL);
  }
  /* Another kind: 0. */
  n = pack_kind(PE__REQUEST__BODY_SAVE, buf, sizeof buf);
  ck_assert(pe_request_peek_read(buf, n, &pk));
  ck_assert_uint_eq(pk.run_handle, 0);
}
END_TEST

START_TEST(test_unreadable) {
  static uint8_t buf[4096];
  size_t n = pack_kind(PE__REQUEST__BODY_RUN, buf, sizeof buf);
  pe_request_peek pk;
  /* Cut anywhere inside the run's length-delimited body. */
  for (size_t back = 1; back < 1030; back += 97) {
    size_t cut = n - back;
    ck_assert_msg(!pe_request_peek_read(buf, cut, &pk), "cut at %zu of %zu read", cut, n);
    ck_assert_int_eq(pk.kind, PE__REQUEST__BODY__NOT_SET);
  }
  const uint8_t varint_cut[] = {0x08, 0x80}; /* client_id, varint unfinished */
  const uint8_t group[] = {0x0b, 0x0c};      /* field 1 as a group */
  const uint8_t field0[] = {0x00, 0x01};     /* field number 0 */
  const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}; /* 11 bytes */
  ck_assert(!pe_request_peek_read(varint_cut, sizeof varint_cut, &pk));
  ck_assert(!pe_request_peek_read(group, sizeof group, &pk));
  ck_assert(!pe_request_peek_read(field0, sizeof field0, &pk));
  ck_assert(!pe_request_peek_read(long_varint, sizeof long_varint, &pk));
}
END_TEST

/* buf[0..n) and then extra[0..m) in out (cap bytes); its length. */
static size_t append(const uint8_t *buf, size_t n, const uint8_t *extra, size_t m, uint8_t *out,
                     size_t cap) {
  ck_assert_uint_le(n + m, cap);
  memcpy(out, buf, n);
  memcpy(out + n, extra, m);
  return n + m;
}

/* A Run with 82 00 00 appended: field number 0 in a two-byte key, which
 * protobuf-c skips as an unknown field and the peek cannot route. The
 * peek refuses it (the daemon answers it as malformed and never decodes
 * it), so the two agree; before, the run went to the work lane as client
 * 0. The same with the field 0 in the run's own body, keys of 6 bytes
 * (protobuf-c refuses them, the peek did not) and repeated bodies. */
START_TEST(test_peek_and_unpack_agree) {
  static uint8_t run[4096], buf[4200];
  size_t n = pack_run_or(PE__REQUEST__BODY_RUN, 0x77, run, sizeof run);
  pe_request_peek pk;
  const uint8_t field0[] = {0x82, 0x00, 0x00};
  size_t m = append(run, n, field0, sizeof field0, buf, sizeof buf);
  ck_assert_msg(!pe_request_peek_read(buf, m, &pk), "a field 0 key was routed");
  Pe__Request *rq = pe__request__unpack(NULL, m, buf);
  ck_assert_ptr_nonnull(rq); /* what made them disagree */
  ck_assert_int_eq(rq->body_case, PE__REQUEST__BODY_RUN);
  pe__request__free_unpacked(rq, NULL);
  ck_assert(pe_request_peek_agrees(buf, m));

  /* Field 0 inside the Run body: {handle 7, 82 00 00}. */
  const uint8_t inner0[] = {0x08, 0x05, 0x6a, 0x05, 0x08, 0x07, 0x82, 0x00, 0x00};
  ck_assert(!pe_request_peek_read(inner0, sizeof inner0, &pk));
  rq = pe__request__unpack(NULL, sizeof inner0, inner0);
  ck_assert_ptr_nonnull(rq);
  ck_assert_uint_eq(rq->run->handle, 7);
  pe__request__free_unpacked(rq, NULL);
  ck_assert(pe_request_peek_agrees(inner0, sizeof inner0));

  /* client 5 as a 5-byte key (read by both) and as a 6-byte key (refused
   * by both), then ping. */
  const uint8_t key5[] = {0x88, 0x80, 0x80, 0x80, 0x00, 0x05, 0x50, 0x01};
  const uint8_t key6[] = {0x88, 0x80, 0x80, 0x80, 0x80, 0x00, 0x05, 0x50, 0x01};
  ck_assert(pe_request_peek_read(key5, sizeof key5, &pk));
  ck_assert_uint_eq(pk.client, 5);
  rq = pe__request__unpack(NULL, sizeof key5, key5);
  ck_assert_ptr_nonnull(rq);
  ck_assert(pe_request_peek_matches(&pk, rq));
  pe__request__free_unpacked(rq, NULL);
  ck_assert(!pe_request_peek_read(key6, sizeof key6, &pk));
  ck_assert_ptr_null(pe__request__unpack(NULL, sizeof key6, key6));

  /* An overlong varint key (client 9 in 0x88 0x00), an unknown wire type,
   * and bodies run, ping: the last wins, with no run handle. */
  const uint8_t overlong[] = {0x08, 0x05, 0x88, 0x00, 0x09, 0x50, 0x01};
  const uint8_t wire6[] = {0x08, 0x05, 0x50, 0x01, 0x0e, 0x00};
  const uint8_t run_ping[] = {0x08, 0x05, 0x6a, 0x02, 0x08, 0x07, 0x50, 0x01};
  const uint8_t *msgs[] = {overlong, wire6, run_ping};
  size_t lens[] = {sizeof overlong, sizeof wire6, sizeof run_ping};
  for (int i = 0; i < 3; i++) ck_assert_msg(pe_request_peek_agrees(msgs[i], lens[i]), "case %d", i);
  ck_assert(pe_request_peek_read(overlong, sizeof overlong, &pk));
  ck_assert_uint_eq(pk.client, 9);
  ck_assert(!pe_request_peek_read(wire6, sizeof wire6, &pk));
  ck_assert(pe_request_peek_read(run_ping, sizeof run_ping, &pk));
  ck_assert_int_eq(pk.kind, PE__REQUEST__BODY_PING);
  ck_assert_uint_eq(pk.run_handle, 0);
}
END_TEST

/* The request thread's side: bytes the peek refused are not decoded, and
 * a request that decodes otherwise than it was routed is refused. */
START_TEST(test_decode_only_as_routed) {
  static uint8_t buf[4096];
  size_t n = pack_run_or(PE__REQUEST__BODY_RUN, 0x77, buf, sizeof buf);
  pe_decode_budget b;
  pe_decode_budget_init(&b, NULL, 0, 0);
  Pe__Request *rq = (Pe__Request *)1;
  pe_status *st = pe_request_decode(buf, n, NULL, &b, &rq);
  ck_assert_ptr_null(rq);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  ck_assert_msg(strstr(pe_status_msg(st), "malformed request: 1050 bytes are not a pe.Request"),
                "%s", pe_status_msg(st));
  pe_status_free(st);
  pe_request_peek pk;
  ck_assert(pe_request_peek_read(buf, n, &pk));
  ck_assert_uint_eq(pk.request, 77);
  pe_request_peek other[4] = {pk, pk, pk, pk};
  other[0].client++;
  other[1].kind = PE__REQUEST__BODY_SAVE;
  other[2].run_handle = 0x78;
  other[3].request++;
  for (int i = 0; i < 4; i++) {
    st = pe_request_decode(buf, n, &other[i], &b, &rq);
    ck_assert_ptr_null(rq);
    ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
    ck_assert_msg(strstr(pe_status_msg(st), "but it decodes as client c-"), "%s",
                  pe_status_msg(st));
    pe_status_free(st);
    ck_assert_int_eq(b.used, 0); /* the refused request was freed */
  }
  PE_CK_OK(pe_request_decode(buf, n, &pk, &b, &rq));
  ck_assert_uint_eq(rq->run->handle, 0x77);
  ck_assert_int_gt(b.used, 1024);
  pe__request__free_unpacked(rq, &b.alloc);
  ck_assert_int_eq(b.used, 0);
}
END_TEST

/* Control: the kinds that never run a program nor touch a checkpoint file;
 * run: Run, which holds its thread for all its steps; work: the rest. */
START_TEST(test_lanes) {
  const Pe__Request__BodyCase control[] = {
      PE__REQUEST__BODY_PING,          PE__REQUEST__BODY_STATUS,     PE__REQUEST__BODY_CLOSE,
      PE__REQUEST__BODY_DEREGISTER,    PE__REQUEST__BODY_DROP_MODEL, PE__REQUEST__BODY_REGISTER_SHM,
      PE__REQUEST__BODY_UNREGISTER_SHM};
  for (int k = PE__REQUEST__BODY_PING; k <= PE__REQUEST__BODY_DROP_MODEL; k++) {
    bool want = false;
    for (size_t i = 0; i < sizeof control / sizeof control[0]; i++) want |= (int)control[i] == k;
    pe_lane lane = want ? PE_LANE_CONTROL : k == PE__REQUEST__BODY_RUN ? PE_LANE_RUN : PE_LANE_WORK;
    ck_assert_msg(pe_request_lane((Pe__Request__BodyCase)k) == lane, "kind %s in the wrong lane",
                  pe_request_kind_name((Pe__Request__BodyCase)k));
  }
  ck_assert_int_eq(pe_request_lane(PE__REQUEST__BODY__NOT_SET), PE_LANE_WORK);
  ck_assert_int_eq(pe_request_lane((Pe__Request__BodyCase)99), PE_LANE_WORK);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("server_request_peek");
  TCase *tc = tcase_create("peek");
  tcase_add_test(tc, test_every_kind);
  tcase_add_test(tc, test_unknown_fields_and_two_bodies);
  tcase_add_test(tc, test_run_handle);
  tcase_add_test(tc, test_unreadable);
  tcase_add_test(tc, test_peek_and_unpack_agree);
  tcase_add_test(tc, test_decode_only_as_routed);
  tcase_add_test(tc, test_lanes);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
