/* A shared-memory region belongs to the client that registered it (no
 * other client that knows a region id may feed from it, fetch the bytes
 * back or unregister it, and the daemon does not log the ids at info
 * level). Client B naming client A's region in a run feed, a batched run's
 * feed, a SetParams value or an unregister gets NOT_FOUND with the message
 * an unknown id gets; A's region keeps working, also after B's session
 * ends; no info line of the daemon's log names the id.
 *
 * And registering needs the token of the region's trailer (the follow-up:
 * B could register A's object by its name, listed in /dev/shm, and read it
 * through the daemon): B's register of A's name without the token, or with
 * a wrong one, is refused as a name that does not exist, while A's works.
 * Neither the name nor an info or warn line of the log holds a client id
 * (ids are credentials). */
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_daemon.h"
#include "daemon_harness.h"
#include "pe_client.h"
#include "pe_models.h"

#define ROWS 4
static const char SECRET[] = "SECRET OF CLIENT A";

/* The model's eval program under model `ns` for c, initialised. */
static uint64_t register_eval(pe_client *c, const pe_model_spec *m, const char *ns) {
  pe_client_register_args a = {
      .program = m->bytes, .program_len = m->len, .model = ns, .places = "cpu:1", .for_test = true};
  pe_client_program p;
  CD_OK(c, pe_client_register(c, &a, &p));
  CD_OK(c, pe_client_init(c, p.handle, false, NULL));
  return p.handle;
}

/* A run of handle h on c whose image rows come from `region` (offset 0),
 * batches mini-batches of ROWS / batches rows; fetches the image. */
static int run_from(pe_client *c, const pe_model_spec *m, uint64_t h, uint64_t region,
                    uint32_t batches, pe_client_run_result *r) {
  static int64_t labels[ROWS];
  pe_client_tensor f[2];
  pe_client_tensor_set(&f[0], m->image, PE_B_F32, 2, (int64_t[]){ROWS, 784}, NULL);
  f[0].shm_region = region;
  f[0].shm_offset = 0;
  pe_client_tensor_set(&f[1], m->label, PE_B_I64, 2, (int64_t[]){ROWS, 1}, labels);
  const char *fetch[] = {m->image};
  pe_client_run_opts o = {.batches = batches};
  return pe_client_run(c, h, f, 2, fetch, 1, &o, r);
}

/* The client id as the daemon printed it before (16 hex digits). */
static void id_hex(char *buf, size_t len, uint64_t id) {
  snprintf(buf, len, "%016" PRIx64, id);
}

/* rc is NOT_FOUND with the message of a region `region` that c never
 * registered; it names c by its tag, not its id. */
static void expect_not_found(pe_client *c, int rc, uint64_t region, const char *what) {
  char want[160], id[24];
  snprintf(want, sizeof want, "shm region %" PRIu64 " is not registered by client c-", region);
  id_hex(id, sizeof id, pe_client_id(c));
  ck_assert_msg(
      rc == PE_C_ENOTFOUND && strstr(pe_client_error(c), want) && !strstr(pe_client_error(c), id),
      "%s: rc %d (%s): %s", what, rc, pe_client_code_name(rc), pe_client_error(c));
}

/* Whether a line of the daemon's log at level `level` contains needle. */
static bool log_has(const cd_daemon *d, const char *level, const char *needle) {
  FILE *f = fopen(d->log, "r");
  ck_assert_ptr_nonnull(f);
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, level) && strstr(line, needle);
  fclose(f);
  return found;
}

START_TEST(test_region_belongs_to_its_client) {
  char err[256];
  pe_model_spec m;
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  cd_daemon d;
  cd_start(&d);
  pe_client *A = cd_connect(&d), *B = cd_connect(&d);
  pe_client_shm sh;
  CD_OK(A, pe_client_shm_create(A, ROWS * 784 * sizeof(float), &sh));
  memset(sh.base, 0, ROWS * 784 * sizeof(float));
  memcpy(sh.base, SECRET, sizeof SECRET);
  uint64_t ha = register_eval(A, &m, "scope-a");
  uint64_t hb = register_eval(B, &m, "scope-b");
  pe_client_run_result r;
  CD_OK(A, run_from(A, &m, ha, sh.region, 0, &r));
  ck_assert(!memcmp(r.fetched[0].data, SECRET, sizeof SECRET));

  /* B: a run's feed, a batched run's feed (pinned, not copied), a
   * SetParams value, an unregister: not found, as an unknown id. */
  expect_not_found(B, run_from(B, &m, hb, sh.region, 0, &r), sh.region, "run");
  expect_not_found(B, run_from(B, &m, hb, sh.region, 2, &r), sh.region, "batched run");
  pe_client_tensor v;
  pe_client_tensor_set(&v, "fc_0.b", PE_B_F32, 1, (int64_t[]){256}, NULL);
  v.shm_region = sh.region;
  expect_not_found(B, pe_client_set_params(B, "scope-b", &v, 1), sh.region, "set_params");
  expect_not_found(B, pe_client_unregister_shm(B, sh.region), sh.region, "unregister_shm");
  uint64_t unknown = sh.region ^ 0x5a5a5a5a;
  expect_not_found(B, run_from(B, &m, hb, unknown, 0, &r), unknown, "run, unknown id");
  expect_not_found(B, pe_client_unregister_shm(B, unknown), unknown, "unregister, unknown id");

  /* A's region is intact, also once B's session has ended. */
  CD_OK(A, run_from(A, &m, ha, sh.region, 2, &r));
  CD_OK(B, pe_client_close(B));
  CD_OK(A, run_from(A, &m, ha, sh.region, 0, &r));
  ck_assert(!memcmp(r.fetched[0].data, SECRET, sizeof SECRET));

  /* The id is at debug level only: the register's info line names the
   * object, not the id. */
  char id[32];
  snprintf(id, sizeof id, "%" PRIu64, sh.region);
  char registered[96];
  snprintf(registered, sizeof registered, "shm %s registered", sh.name);
  ck_assert_msg(log_has(&d, " info ", registered), "no info line '%s' in %s", registered, d.log);
  ck_assert_msg(!log_has(&d, " info ", id), "an info line of %s names region %s", d.log, id);

  pe_client_shm_close(A, &sh);
  CD_OK(A, pe_client_close(A));
  pe_client_free(A);
  pe_client_free(B);
  cd_stop(&d);
  pe_model_spec_release(&m);
}
END_TEST

/* RegisterShm of name with size from raw client `client`, with token_len
 * bytes of token (0: none); the reply. */
static Pe__Reply *register_raw(int sock, uint64_t client, const char *name, uint64_t size,
                               const uint8_t *token, size_t token_len) {
  Pe__ShmRequest sr = PE__SHM_REQUEST__INIT;
  sr.name = (char *)name;
  sr.size = size;
  sr.token.data = (uint8_t *)token;
  sr.token.len = token_len;
  Pe__Request rq = dh_req(client);
  rq.body_case = PE__REQUEST__BODY_REGISTER_SHM;
  rq.register_shm = &sr;
  return dh_call(sock, &rq);
}

/* rep is NOT_FOUND, and its message is the one for a name that does not
 * exist (name in place of `unknown`): nothing tells the object is there. */
static void expect_as_unknown(Pe__Reply *rep, const char *name, const Pe__Reply *unknown,
                              const char *unknown_name, const char *what) {
  ck_assert_msg(rep->code == PE_ENOTFOUND, "%s: code %d: %s", what, rep->code, rep->message);
  const char *a = strstr(rep->message, name), *b = strstr(unknown->message, unknown_name);
  ck_assert_msg(a && b && a - rep->message == b - unknown->message &&
                    !strcmp(a + strlen(name), b + strlen(unknown_name)),
                "%s: '%s' is not the unknown name's '%s'", what, rep->message, unknown->message);
  pe__reply__free_unpacked(rep, NULL);
}

/* Whether a line of the daemon's log at info or warn level contains needle. */
static bool log_has_above_debug(const cd_daemon *d, const char *needle) {
  return log_has(d, " info ", needle) || log_has(d, " warn ", needle);
}

START_TEST(test_register_needs_the_token) {
  char err[256];
  pe_model_spec m;
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  cd_daemon d;
  cd_start(&d);
  pe_client *A = cd_connect(&d);
  pe_client_shm sh;
  CD_OK(A, pe_client_shm_create(A, ROWS * 784 * sizeof(float), &sh));
  memset(sh.base, 0, ROWS * 784 * sizeof(float));
  memcpy(sh.base, SECRET, sizeof SECRET);
  /* The name, listed in /dev/shm, holds no client id. */
  char a_id[24];
  id_hex(a_id, sizeof a_id, pe_client_id(A));
  ck_assert_msg(!strstr(sh.name, a_id), "region name %s holds client id %s", sh.name, a_id);

  /* B, a raw client, knows A's name (ls /dev/shm) but not the token. */
  const uint64_t B = 0x0b0b0b0b0b0b0b0bULL;
  dh_daemon raw = {0};
  snprintf(raw.addr, sizeof raw.addr, "%s", d.addr);
  int s = dh_connect(&raw, 30000);
  char none[64];
  snprintf(none, sizeof none, "/pe-no-such-region-%d", (int)getpid());
  Pe__Reply *unknown = register_raw(s, B, none, sh.size, NULL, 0);
  ck_assert_msg(unknown->code == PE_ENOTFOUND, "unknown name: %s", unknown->message);
  expect_as_unknown(register_raw(s, B, sh.name, sh.size, NULL, 0), sh.name, unknown, none,
                    "no token");
  uint8_t wrong[PE_SHM_TOKEN_LEN];
  ck_assert_int_eq(pe_shm_token_new(wrong), 0);
  expect_as_unknown(register_raw(s, B, sh.name, sh.size, wrong, sizeof wrong), sh.name, unknown,
                    none, "a wrong token");
  expect_as_unknown(register_raw(s, B, sh.name, sh.size, wrong, sizeof wrong - 1), sh.name, unknown,
                    none, "a short token");
  pe__reply__free_unpacked(unknown, NULL);

  /* A's own register (again: the same region) and its feed work. */
  uint64_t again = 0;
  CD_OK(A, pe_client_register_shm(A, sh.name, sh.size, &again));
  ck_assert_uint_eq(again, sh.region);
  uint64_t ha = register_eval(A, &m, "token-a");
  pe_client_run_result r;
  CD_OK(A, run_from(A, &m, ha, sh.region, 0, &r));
  ck_assert(!memcmp(r.fetched[0].data, SECRET, sizeof SECRET));

  /* An object of A's own: without a trailer the library says so; sealed
   * (pe_client_shm_seal), it registers. */
  char own[64];
  snprintf(own, sizeof own, "/pe-e2e-own-%d", (int)getpid());
  int fd = shm_open(own, O_CREAT | O_EXCL | O_RDWR, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, 4096), 0);
  uint64_t mine = 0;
  int rc = pe_client_register_shm(A, own, 4096, &mine);
  ck_assert_msg(rc == PE_C_EARG && strstr(pe_client_error(A), "no trailer at byte 4096"),
                "rc %d: %s", rc, pe_client_error(A));
  ck_assert_int_eq(pe_client_shm_seal(fd, 4096), 0);
  close(fd);
  rc = pe_client_register_shm(A, own, 4096, &mine);
  shm_unlink(own);
  CD_OK(A, rc);
  CD_OK(A, pe_client_unregister_shm(A, mine));

  /* No client id at info or warn level: the tag stands for it. */
  char b_id[24];
  id_hex(b_id, sizeof b_id, B);
  ck_assert_msg(log_has_above_debug(&d, "req client=c-"), "no tagged request line in %s", d.log);
  ck_assert_msg(!log_has_above_debug(&d, a_id), "an info/warn line of %s names client %s", d.log,
                a_id);
  ck_assert_msg(!log_has_above_debug(&d, b_id), "an info/warn line of %s names client %s", d.log,
                b_id);

  nn_close(s);
  pe_client_shm_close(A, &sh);
  CD_OK(A, pe_client_close(A));
  pe_client_free(A);
  cd_stop(&d);
  pe_model_spec_release(&m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("shm_scope");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_region_belongs_to_its_client);
  tcase_add_test(tc, test_register_needs_the_token);
  suite_add_tcase(s, tc);
  return s;
}

CD_CHECK_MAIN(suite)
