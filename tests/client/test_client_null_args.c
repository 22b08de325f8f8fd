/* libpeclient's NULL arguments: a NULL handle, out-pointer,
 * array with a count above 0 or entry of a name array is refused with
 * PE_C_EARG and a message naming the argument, before anything is sent;
 * the accessors answer "" or 0 for a NULL handle. A crash on any of
 * these fails the test (Check forks each one).
 *
 * The "daemon" is a unix socket that listens and never answers: a request
 * that went out anyway would time out (TIMED_OUT, not BAD_CLIENT_ARGUMENT). */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check_main.h"
#include "pe_client.h"

typedef struct silent_peer {
  char dir[48], path[64], addr[72];
  int fd;
  pe_client *c;
} silent_peer;

static void peer_start(silent_peer *p) {
  snprintf(p->dir, sizeof p->dir, "/tmp/pe-null-args-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(p->dir));
  snprintf(p->path, sizeof p->path, "%s/d.sock", p->dir);
  snprintf(p->addr, sizeof p->addr, "ipc://%s", p->path);
  p->fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(p->fd, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", p->path);
  ck_assert_int_eq(bind(p->fd, (struct sockaddr *)&sa, sizeof sa), 0);
  ck_assert_int_eq(listen(p->fd, 4), 0);
  p->c = pe_client_new();
  pe_client_opts o = {.address = p->addr, .timeout_ms = 300};
  ck_assert_msg(pe_client_connect(p->c, &o) == 0, "%s", pe_client_error(p->c));
}

static void peer_stop(silent_peer *p) {
  pe_client_free(p->c);
  close(p->fd);
  unlink(p->path);
  rmdir(p->dir);
}

#define EXPECT_EARG(c, call, want)                                                      \
  do {                                                                                  \
    int rc_ = (call);                                                                   \
    ck_assert_msg(rc_ == PE_C_EARG && !strcmp(pe_client_error(c), want),                \
                  "%s: rc %d (%s) '%s', expected BAD_CLIENT_ARGUMENT '%s'", #call, rc_, \
                  pe_client_code_name(rc_), pe_client_error(c), want);                  \
  } while (0)

START_TEST(null_handle_is_a_bad_argument) {
  pe_client *c = NULL;
  pe_client_program prog;
  pe_client_status st;
  pe_client_shm shm;
  const pe_client_tensor *v;
  size_t n;
  uint64_t region;
  static const uint8_t prog_bytes[] = {1};
  pe_client_register_args a = {.program = prog_bytes, .program_len = 1, .model = "m"};
  ck_assert_int_eq(pe_client_connect(c, NULL), PE_C_EARG);
  ck_assert_int_eq(pe_client_set_timeout(c, 100), PE_C_EARG);
  ck_assert_int_eq(pe_client_ping(c), PE_C_EARG);
  ck_assert_int_eq(pe_client_register(c, &a, &prog), PE_C_EARG);
  ck_assert_int_eq(pe_client_init(c, 1, false, NULL), PE_C_EARG);
  ck_assert_int_eq(pe_client_run(c, 1, NULL, 0, NULL, 0, NULL, NULL), PE_C_EARG);
  ck_assert_int_eq(pe_client_get_params(c, "m", NULL, 0, &v, &n), PE_C_EARG);
  ck_assert_int_eq(pe_client_set_params(c, "m", NULL, 0), PE_C_EARG);
  ck_assert_int_eq(pe_client_save(c, "m", "x", NULL, NULL), PE_C_EARG);
  ck_assert_int_eq(pe_client_load(c, "m", "x", NULL, NULL), PE_C_EARG);
  ck_assert_int_eq(pe_client_deregister(c, 1), PE_C_EARG);
  ck_assert_int_eq(pe_client_deregister_force(c, 1), PE_C_EARG);
  ck_assert_int_eq(pe_client_drop_model(c, "m", NULL), PE_C_EARG);
  ck_assert_int_eq(pe_client_close(c), PE_C_EARG);
  ck_assert_int_eq(pe_client_get_status(c, &st), PE_C_EARG);
  ck_assert_int_eq(pe_client_register_shm(c, "/x", 8, &region), PE_C_EARG);
  ck_assert_int_eq(pe_client_unregister_shm(c, 1), PE_C_EARG);
  ck_assert_int_eq(pe_client_shm_create(c, 8, &shm), PE_C_EARG);
  char err[64];
  ck_assert_int_eq(pe_client_interrupt(c, 0, 0, err, sizeof err), PE_C_EARG);
  ck_assert_str_eq(err, "interrupt: no client handle");
  ck_assert_int_eq(pe_client_interrupt(c, 0, 0, NULL, 64), PE_C_EARG);
  ck_assert_str_eq(pe_client_error(c), "no client handle");
  ck_assert_str_eq(pe_client_address(c), "");
  ck_assert_uint_eq(pe_client_id(c), 0);
  ck_assert_uint_eq(pe_client_last_request_id(c), 0);
  ck_assert_uint_eq(pe_client_max_message(c), 0);
  pe_client_recovery r;
  memset(&r, 0xff, sizeof r);
  pe_client_recovery_info(c, &r);
  ck_assert_uint_eq(r.recoveries, 0);
  pe_client_recovery_info(c, NULL);
  pe_client_free(c);
  pe_client_shm_close(c, NULL);
}
END_TEST

START_TEST(null_arrays_and_entries_are_named) {
  silent_peer p;
  peer_start(&p);
  pe_client *c = p.c;
  float x[4] = {0};
  pe_client_tensor f[2];
  pe_client_tensor_set(&f[0], "x", PE_B_F32, 2, (int64_t[]){1, 4}, x);
  f[1] = f[0];
  f[1].name = "y";
  pe_client_run_result rr;
  const char *nf[] = {NULL};
  EXPECT_EARG(c, pe_client_run(c, 1, f, 2, nf, 1, NULL, &rr), "run: fetch 1 of 1 is NULL");
  const char *fetch2[] = {"a", NULL};
  EXPECT_EARG(c, pe_client_run(c, 1, f, 2, fetch2, 2, NULL, &rr), "run: fetch 2 of 2 is NULL");
  EXPECT_EARG(c, pe_client_run(c, 1, f, 2, NULL, 3, NULL, &rr), "run: 3 fetch names but no array");
  EXPECT_EARG(c, pe_client_run(c, 1, NULL, 2, NULL, 0, NULL, &rr), "run: 2 feeds but no array");
  /* A NULL shape given to pe_client_tensor_set is refused when sent. */
  pe_client_tensor noshape;
  pe_client_tensor_set(&noshape, "x", PE_B_F32, 2, NULL, x);
  EXPECT_EARG(c, pe_client_run(c, 1, &noshape, 1, NULL, 0, NULL, &rr),
              "run: tensor 'x': 2 dims but no shape (NULL)");
  pe_client_tensor_set(NULL, "x", PE_B_F32, 0, NULL, x); /* nothing to fill */
  ck_assert_int_eq(pe_client_tensor_numel(NULL), -1);
  ck_assert_ptr_null(pe_client_find(NULL, 2, "x"));
  ck_assert_ptr_null(pe_client_find(f, 2, NULL));

  static const uint8_t prog_bytes[] = {1};
  pe_client_register_args a = {.program = prog_bytes, .program_len = 1, .model = "m"};
  pe_client_program prog;
  a.n_keep = 3;
  EXPECT_EARG(c, pe_client_register(c, &a, &prog), "register: 3 keep names but no array");
  const char *keep[] = {"a", NULL, "c"};
  a.keep = keep;
  EXPECT_EARG(c, pe_client_register(c, &a, &prog), "register: keep 2 of 3 is NULL");
  a.keep = NULL;
  a.n_keep = 0;
  EXPECT_EARG(c, pe_client_register(c, &a, NULL), "register: out (pe_client_program *) is NULL");

  const pe_client_tensor *v;
  size_t n;
  EXPECT_EARG(c, pe_client_get_params(c, "t1", NULL, 0, NULL, NULL), "get_params: values is NULL");
  EXPECT_EARG(c, pe_client_get_params(c, "t1", NULL, 0, &v, NULL), "get_params: n_values is NULL");
  const char *names[] = {"fc_0.w", NULL};
  EXPECT_EARG(c, pe_client_get_params(c, "t1", names, 2, &v, &n),
              "get_params: parameter 2 of 2 is NULL");
  EXPECT_EARG(c, pe_client_set_params(c, "t1", NULL, 1), "set_params: 1 value but no array");
  EXPECT_EARG(c, pe_client_get_status(c, NULL), "status: out (pe_client_status *) is NULL");
  EXPECT_EARG(c, pe_client_register_shm(c, "/pe-x", 8, NULL), "register_shm: region is NULL");
  EXPECT_EARG(c, pe_client_shm_create(c, 8, NULL), "register_shm: out (pe_client_shm *) is NULL");
  ck_assert_ptr_null(pe_client_default_address(NULL, 16));
  /* Nothing went out: the handle's next request is its first. */
  ck_assert_uint_eq(pe_client_last_request_id(c), 0);
  peer_stop(&p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_null_args");
  TCase *tc = tcase_create("client_null_args");
  tcase_add_test(tc, null_handle_is_a_bad_argument);
  tcase_add_test(tc, null_arrays_and_entries_are_named);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
