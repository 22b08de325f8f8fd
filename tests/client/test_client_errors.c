/* libpeclient's errors without a daemon: a missing socket is a connection
 * error at once, a silent peer is a timeout naming the request, a peer that
 * goes away before answering ends the wait at once, an oversized
 * request is refused here with both sizes, a daemon error comes back with
 * the daemon's code and message, and the code table matches pe_code.
 *
 * The "daemon" here is a nanomsg REP socket in a thread of the test (created
 * inside the test body: Check forks each test, nanomsg does not survive a
 * fork). */
#include <check.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "core/status.h"
#include "pe_client.h"
#include "service.pb-c.h"

/* A fresh ipc address in a temporary directory. */
typedef struct tmp_sock {
  char dir[48], path[64], addr[72];
} tmp_sock;

static void tmp_sock_make(tmp_sock *t) {
  snprintf(t->dir, sizeof t->dir, "/tmp/pe-client-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(t->dir));
  snprintf(t->path, sizeof t->path, "%s/d.sock", t->dir);
  snprintf(t->addr, sizeof t->addr, "ipc://%s", t->path);
}

/* A unix stream socket bound to path (not listening). */
static int bound_unix_socket(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

static void tmp_sock_remove(tmp_sock *t) {
  unlink(t->path);
  rmdir(t->dir);
}

static pe_client *connect_to(const char *addr, int timeout_ms, size_t max_message) {
  pe_client *c = pe_client_new();
  ck_assert_ptr_nonnull(c);
  pe_client_opts o = {.address = addr, .timeout_ms = timeout_ms, .max_message = max_message};
  int rc = pe_client_connect(c, &o);
  ck_assert_msg(rc == 0, "connect: %s", pe_client_error(c));
  return c;
}

START_TEST(no_socket_is_a_connection_error) {
  tmp_sock t;
  tmp_sock_make(&t);
  pe_client *c = pe_client_new();
  pe_client_opts o = {.address = t.addr, .timeout_ms = 200};
  int rc = pe_client_connect(c, &o);
  ck_assert_int_eq(rc, PE_C_ECONNECT);
  ck_assert_msg(
      strstr(pe_client_error(c), "no daemon socket at") && strstr(pe_client_error(c), t.path), "%s",
      pe_client_error(c));
  /* Requests on the unconnected handle fail the same way, naming themselves. */
  ck_assert_int_eq(pe_client_ping(c), PE_C_ECONNECT);
  ck_assert_str_eq(pe_client_error(c), "ping: not connected");
  ck_assert_str_eq(pe_client_code_name(PE_C_ECONNECT), "CONNECTION_ERROR");
  pe_client_free(c);
  tmp_sock_remove(&t);
}
END_TEST

/* The socket of a daemon that exited stays as a file nobody listens on:
 * connecting says so at once (nanomsg would retry in the background and
 * the first request time out). */
START_TEST(stale_socket_file_is_a_connection_error) {
  tmp_sock t;
  tmp_sock_make(&t);
  int fd = bound_unix_socket(t.path);
  close(fd); /* the file stays */
  pe_client *c = pe_client_new();
  pe_client_opts o = {.address = t.addr, .timeout_ms = 60000};
  ck_assert_int_eq(pe_client_connect(c, &o), PE_C_ECONNECT);
  ck_assert_msg(strstr(pe_client_error(c), "no daemon is listening on") &&
                    strstr(pe_client_error(c), t.path) && strstr(pe_client_error(c), "stale"),
                "%s", pe_client_error(c));
  pe_client_free(c);
  tmp_sock_remove(&t);
}
END_TEST

/* A socket this user may not write to (the daemon's socket_mode and
 * socket_group): connecting says so at once, naming the group. As root,
 * where the access check passes, a child connects as nobody. */
START_TEST(socket_without_access_is_a_connection_error) {
  tmp_sock t;
  tmp_sock_make(&t);
  ck_assert_int_eq(chmod(t.dir, 0755), 0);
  int fd = bound_unix_socket(t.path);
  ck_assert_int_eq(listen(fd, 4), 0);
  ck_assert_int_eq(chmod(t.path, 0600), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (getuid() != 0 && chmod(t.path, 0) != 0) _exit(3);
    if (getuid() == 0 && (setgroups(0, NULL) || setgid(65534) || setuid(65534))) _exit(4);
    pe_client *c = pe_client_new();
    pe_client_opts o = {.address = t.addr, .timeout_ms = 60000};
    int rc = pe_client_connect(c, &o);
    const char *e = pe_client_error(c);
    bool ok = rc == PE_C_ECONNECT && strstr(e, "permission denied on") && strstr(e, t.path) &&
              strstr(e, "join group");
    if (!ok) fprintf(stderr, "connect: %d %s\n", rc, e);
    _exit(ok ? 0 : 1);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
  close(fd);
  tmp_sock_remove(&t);
}
END_TEST

START_TEST(silent_listener_times_out) {
  /* A unix socket that listens but never answers: the request times out,
   * naming itself. */
  tmp_sock t;
  tmp_sock_make(&t);
  int fd = bound_unix_socket(t.path);
  ck_assert_int_eq(listen(fd, 4), 0);
  pe_client *c = connect_to(t.addr, 300, 0);
  int rc = pe_client_ping(c);
  ck_assert_int_eq(rc, PE_C_ETIMEDOUT);
  ck_assert_msg(strstr(pe_client_error(c), "ping (request 1): no reply from") &&
                    strstr(pe_client_error(c), "within 300 ms"),
                "%s", pe_client_error(c));
  /* The next request gets the next id. */
  ck_assert_int_eq(pe_client_get_status(c, &(pe_client_status){0}), PE_C_ETIMEDOUT);
  ck_assert_msg(strstr(pe_client_error(c), "status (request 2)"), "%s", pe_client_error(c));
  pe_client_free(c);
  close(fd);
  tmp_sock_remove(&t);
}
END_TEST

/* A "daemon" that accepts the request's connection, reads nothing and
 * goes away after 400 ms: with its socket file removed (a clean exit), or
 * left behind with nobody listening (a crash). */
typedef struct vanishing {
  tmp_sock *t;
  int fd;
  bool unlink_file;
} vanishing;

static void *vanish(void *arg) {
  vanishing *v = arg;
  usleep(400 * 1000);
  if (v->unlink_file) unlink(v->t->path);
  close(v->fd);
  return NULL;
}

START_TEST(daemon_gone_before_answering_ends_the_wait) {
  /* The request is never read: without a check the client would wait its
   * whole 20 s timeout. It ends within about a second of the daemon going
   * away, as SHUTTING_DOWN (what a draining daemon answers), naming why. */
  const char *why[2] = {"its socket file is gone", "nothing listens on its socket"};
  for (int k = 0; k < 2; k++) {
    tmp_sock t;
    tmp_sock_make(&t);
    vanishing v = {&t, bound_unix_socket(t.path), k == 0};
    ck_assert_int_eq(listen(v.fd, 4), 0);
    pe_client *c = connect_to(t.addr, 20000, 0);
    pthread_t th;
    pthread_create(&th, NULL, vanish, &v);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = pe_client_ping(c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(th, NULL);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(rc == PE_C_ESHUTDOWN, "case %d: rc %d: %s", k, rc, pe_client_error(c));
    ck_assert_msg(strstr(pe_client_error(c), "ping (request 1): the daemon on") &&
                      strstr(pe_client_error(c), "went away before answering") &&
                      strstr(pe_client_error(c), why[k]),
                  "case %d: %s", k, pe_client_error(c));
    ck_assert_msg(took < 10, "case %d: the wait took %.1f s (timeout 20 s)", k, took);
    pe_client_free(c);
    tmp_sock_remove(&t);
  }
}
END_TEST

START_TEST(oversized_request_is_refused_here) {
  /* Default limit (64 MiB, as the daemon): a 65 MiB feed never leaves. */
  tmp_sock t;
  tmp_sock_make(&t);
  int rep = nn_socket(AF_SP, NN_REP);
  ck_assert_int_ge(nn_bind(rep, t.addr), 0);
  pe_client *c = connect_to(t.addr, 300, 0);
  ck_assert_uint_eq(pe_client_max_message(c), 64u << 20);
  size_t n = (65u << 20) / sizeof(float);
  float *big = calloc(n, sizeof *big);
  ck_assert_ptr_nonnull(big);
  pe_client_tensor feed;
  pe_client_tensor_set(&feed, "image", PE_B_F32, 2, (int64_t[]){(int64_t)n / 784, 784}, big);
  int rc = pe_client_run(c, 42, &feed, 1, NULL, 0, NULL, NULL);
  ck_assert_int_eq(rc, PE_C_ETOOBIG);
  char want[160];
  snprintf(want, sizeof want, "over the maximum message size of %u bytes", 64u << 20);
  ck_assert_msg(
      strstr(pe_client_error(c), "run: request is 681") && strstr(pe_client_error(c), want), "%s",
      pe_client_error(c));
  free(big);
  pe_client_free(c);
  /* A small explicit limit: register's program bytes count too. */
  c = connect_to(t.addr, 300, 1000);
  uint8_t prog[2000] = {0};
  pe_client_register_args a = {.program = prog, .program_len = sizeof prog, .model = "m"};
  pe_client_program out;
  ck_assert_int_eq(pe_client_register(c, &a, &out), PE_C_ETOOBIG);
  ck_assert_msg(strstr(pe_client_error(c), "register: request is 20") &&
                    strstr(pe_client_error(c), "of 1000 bytes"),
                "%s", pe_client_error(c));
  pe_client_free(c);
  nn_close(rep);
  tmp_sock_remove(&t);
}
END_TEST

START_TEST(bad_feed_is_refused_here) {
  tmp_sock t;
  tmp_sock_make(&t);
  int rep = nn_socket(AF_SP, NN_REP);
  ck_assert_int_ge(nn_bind(rep, t.addr), 0);
  pe_client *c = connect_to(t.addr, 300, 0);
  float x[6] = {0};
  pe_client_tensor feed;
  pe_client_tensor_set(&feed, "image", PE_B_F32, 2, (int64_t[]){2, 3}, x);
  feed.nbytes = 20;
  ck_assert_int_eq(pe_client_run(c, 1, &feed, 1, NULL, 0, NULL, NULL), PE_C_EARG);
  ck_assert_str_eq(pe_client_error(c), "run: tensor 'image' f32 [2,3] needs 24 bytes, got 20");
  int64_t dims9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 6};
  pe_client_tensor_set(&feed, "image", PE_B_F32, 9, dims9, x);
  ck_assert_int_eq(pe_client_run(c, 1, &feed, 1, NULL, 0, NULL, NULL), PE_C_EARG);
  ck_assert_str_eq(pe_client_error(c), "run: tensor 'image': 9 dims (0..8)");
  pe_client_tensor_set(&feed, "image", PE_B_F32, 2, (int64_t[]){-2, 3}, x);
  ck_assert_int_eq(pe_client_run(c, 1, &feed, 1, NULL, 0, NULL, NULL), PE_C_EARG);
  ck_assert_str_eq(pe_client_error(c), "run: tensor 'image' f32 [-2,3]: negative dim 0");
  pe_client_free(c);
  nn_close(rep);
  tmp_sock_remove(&t);
}
END_TEST

/* --- a fake daemon that answers one request with a fixed code ------------------------ */

typedef struct fake {
  int sock;
  int code;
  const char *message;
  bool wrong_ids; /* reply with a request id that does not match */
  uint64_t seen_client, seen_request;
} fake;

static void *fake_serve(void *arg) {
  fake *f = arg;
  void *msg = NULL;
  int n = nn_recv(f->sock, &msg, NN_MSG, 0);
  if (n < 0) return NULL;
  Pe__Request *req = pe__request__unpack(NULL, (size_t)n, msg);
  nn_freemsg(msg);
  if (!req) return NULL;
  f->seen_client = req->client_id;
  f->seen_request = req->request_id;
  Pe__Reply r = PE__REPLY__INIT;
  r.client_id = req->client_id;
  r.request_id = req->request_id + (f->wrong_ids ? 100 : 0);
  r.code = f->code;
  r.message = (char *)f->message;
  pe__request__free_unpacked(req, NULL);
  size_t len = pe__reply__get_packed_size(&r);
  uint8_t *buf = malloc(len);
  pe__reply__pack(&r, buf);
  nn_send(f->sock, buf, len, 0);
  free(buf);
  return NULL;
}

START_TEST(daemon_error_keeps_code_and_message) {
  tmp_sock t;
  tmp_sock_make(&t);
  fake f = {.code = PE_ESHAPE, .message = "matmul: X 'fc_0.tmp_0' [8,3] vs W 'fc_0.w' [784,256]"};
  f.sock = nn_socket(AF_SP, NN_REP);
  ck_assert_int_ge(nn_bind(f.sock, t.addr), 0);
  pthread_t th;
  pthread_create(&th, NULL, fake_serve, &f);
  pe_client *c = connect_to(t.addr, 5000, 0);
  int rc = pe_client_run(c, 7, NULL, 0, NULL, 0, NULL, NULL);
  pthread_join(th, NULL);
  ck_assert_int_eq(rc, PE_ESHAPE);
  ck_assert_str_eq(pe_client_error(c), "run: matmul: X 'fc_0.tmp_0' [8,3] vs W 'fc_0.w' [784,256]");
  ck_assert_uint_eq(f.seen_client, pe_client_id(c));
  ck_assert_uint_ne(f.seen_client, 0);
  ck_assert_uint_eq(f.seen_request, 1);
  pe_client_free(c);
  nn_close(f.sock);
  tmp_sock_remove(&t);
}
END_TEST

START_TEST(reply_with_other_ids_is_refused) {
  tmp_sock t;
  tmp_sock_make(&t);
  fake f = {.code = 0, .message = "", .wrong_ids = true};
  f.sock = nn_socket(AF_SP, NN_REP);
  ck_assert_int_ge(nn_bind(f.sock, t.addr), 0);
  pthread_t th;
  pthread_create(&th, NULL, fake_serve, &f);
  pe_client *c = connect_to(t.addr, 5000, 0);
  ck_assert_int_eq(pe_client_ping(c), PE_C_EPROTO);
  pthread_join(th, NULL);
  ck_assert_msg(strstr(pe_client_error(c), "ping (request 1): reply ids") &&
                    strstr(pe_client_error(c), "request 101) do not match"),
                "%s", pe_client_error(c));
  pe_client_free(c);
  nn_close(f.sock);
  tmp_sock_remove(&t);
}
END_TEST

START_TEST(code_names_match_the_daemon) {
  for (int code = 0; code < PE_ECODE_COUNT; code++)
    ck_assert_str_eq(pe_client_code_name(code), pe_code_name((pe_code)code));
  ck_assert_int_lt(PE_ECODE_COUNT, PE_C_CLIENT_BASE);
  ck_assert_str_eq(pe_client_code_name(PE_C_ETIMEDOUT), "TIMED_OUT");
  ck_assert_str_eq(pe_client_code_name(-3), "UNKNOWN_CODE");
}
END_TEST

START_TEST(default_address_follows_the_daemon) {
  char buf[256];
  pe_client_default_address(buf, sizeof buf);
  if (geteuid() == 0) {
    ck_assert_str_eq(buf, "ipc:///run/pe-executord/pe-executord.sock");
  } else {
    setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
    ck_assert_str_eq(pe_client_default_address(buf, sizeof buf),
                     "ipc:///run/user/1234/pe-executord.sock");
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_errors");
  TCase *tc = tcase_create("client_errors");
  tcase_add_test(tc, no_socket_is_a_connection_error);
  tcase_add_test(tc, stale_socket_file_is_a_connection_error);
  tcase_add_test(tc, socket_without_access_is_a_connection_error);
  tcase_add_test(tc, silent_listener_times_out);
  tcase_add_test(tc, daemon_gone_before_answering_ends_the_wait);
  tcase_add_test(tc, oversized_request_is_refused_here);
  tcase_add_test(tc, bad_feed_is_refused_here);
  tcase_add_test(tc, daemon_error_keeps_code_and_message);
  tcase_add_test(tc, reply_with_other_ids_is_refused);
  tcase_add_test(tc, code_names_match_the_daemon);
  tcase_add_test(tc, default_address_follows_the_daemon);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
