/* pe-executord config: embedded defaults, INI layers, sizes, errors that
 * name the section, key, value and line; reloadable fields. */
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "server/config.h"
#include "server/host_memory.h"
#include "test_assert.h"

START_TEST(test_defaults) {
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  unsetenv("RUNTIME_DIRECTORY");
  unsetenv("STATE_DIRECTORY");
  pe_srv_config c;
  PE_CK_OK(pe_config_defaults(&c));
  if (geteuid() == 0)
    ck_assert_str_eq(c.socket, "ipc:///run/pe-executord/pe-executord.sock");
  else
    ck_assert_str_eq(c.socket, "ipc:///run/user/4242/pe-executord.sock");
  ck_assert_uint_eq(c.socket_mode, 0660);
  ck_assert_str_eq(c.places, "auto");
  ck_assert_str_eq(c.sync, "event");
  ck_assert_int_eq(c.request_threads, 8);
  ck_assert_int_eq(c.run_threads, 0); /* as many as request_threads */
  ck_assert_int_eq(c.worker_threads, 0);
  ck_assert(c.flush_denormals);
  ck_assert(c.check_finite);
  ck_assert(c.checkpoint_on_shutdown);
  ck_assert_int_eq(c.max_message, 64 << 20);
  ck_assert_int_eq(c.max_programs, 256);
  ck_assert_int_eq(c.memory_per_client, 0);
  ck_assert_int_eq(c.max_steps_per_request, 1000000);
  ck_assert_int_eq(c.max_program_ops, 100000);
  ck_assert_int_eq(c.max_program_vars, 200000);
  /* Shares of the host's memory: the physical memory, or the cgroup's
   * limit when lower. */
  int64_t host = pe_host_memory_bytes();
  ck_assert(host > 0 && host <= (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE));
  ck_assert_int_eq(c.memory_per_run, host / 100 * 50);
  ck_assert_int_eq(c.memory_runs_total, host / 100 * 75);
  ck_assert_int_eq(c.memory_total, host / 100 * 75);
  ck_assert_int_eq(c.memory_kept_per_program, 256LL << 20);
  ck_assert_double_eq(c.session_ttl_s, 600);
  ck_assert_double_eq(c.checkpoint_interval_s, 300);
  ck_assert(c.state_dir[0] == '/');
  PE_CK_OK(pe_config_check(&c));
  pe_config_free(&c);
  /* systemd's RuntimeDirectory wins. */
  setenv("RUNTIME_DIRECTORY", "/run/pe-executord", 1);
  setenv("STATE_DIRECTORY", "/var/lib/pe-executord", 1);
  PE_CK_OK(pe_config_defaults(&c));
  ck_assert_str_eq(c.socket, "ipc:///run/pe-executord/pe-executord.sock");
  ck_assert_str_eq(c.state_dir, "/var/lib/pe-executord");
  pe_config_free(&c);
}
END_TEST

START_TEST(test_file_layers) {
  char path[] = "/tmp/pe-conf-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *text =
      "; comment\n"
      "[server]\n"
      "socket = ipc:///tmp/x.sock\n"
      "socket_mode = 0600\n"
      "request_threads = 2\n"
      "run_threads = 5\n"
      "log_level = debug\n"
      "[runtime]\n"
      "places = cpu:2\n"
      "worker_threads = 3\n"
      "sync = producer\n"
      "flush_denormals = off\n"
      "check_finite = false\n"
      "[state]\n"
      "dir = /tmp/pe-state\n"
      "checkpoint_on_shutdown = no\n"
      "checkpoint_interval = 0.5\n"
      "[sessions]\n"
      "ttl = 2.5\n"
      "[limits]\n"
      "max_message = 1M\n"
      "max_programs = 7\n"
      "memory_per_client = 2G\n"
      "max_steps_per_request = 50\n"
      "max_program_ops = 40\n"
      "max_program_vars = 60\n"
      "memory_per_run = 3G\n"
      "memory_runs_total = 5G\n"
      "memory_kept_per_program = 0\n";
  ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
  close(fd);
  pe_srv_config c;
  PE_CK_OK(pe_config_defaults(&c));
  PE_CK_OK(pe_config_load_file(&c, path));
  unlink(path);
  ck_assert_str_eq(c.socket, "ipc:///tmp/x.sock");
  ck_assert_uint_eq(c.socket_mode, 0600);
  ck_assert_int_eq(c.request_threads, 2);
  ck_assert_int_eq(c.run_threads, 5);
  ck_assert_int_eq(c.log_level, PE_LOG_DEBUG);
  ck_assert_str_eq(c.places, "cpu:2");
  ck_assert_int_eq(c.worker_threads, 3);
  ck_assert_str_eq(c.sync, "producer");
  ck_assert(!c.flush_denormals);
  ck_assert(!c.check_finite);
  ck_assert_str_eq(c.state_dir, "/tmp/pe-state");
  ck_assert(!c.checkpoint_on_shutdown);
  ck_assert_double_eq(c.checkpoint_interval_s, 0.5);
  ck_assert_double_eq(c.session_ttl_s, 2.5);
  ck_assert_int_eq(c.max_message, 1 << 20);
  ck_assert_int_eq(c.max_programs, 7);
  ck_assert_int_eq(c.memory_per_client, 2LL << 30);
  /* A command-line override on top. */
  PE_CK_OK(pe_config_set(&c, "runtime", "places", "sim:4"));
  ck_assert_str_eq(c.places, "sim:4");
  /* Reloadable subset. */
  pe_srv_config d;
  PE_CK_OK(pe_config_defaults(&d));
  pe_config_reloadable_apply(&d, &c);
  ck_assert_double_eq(d.session_ttl_s, 2.5);
  ck_assert_double_eq(d.checkpoint_interval_s, 0.5);
  ck_assert_int_eq(d.max_programs, 7);
  ck_assert_int_eq(d.max_steps_per_request, 50);
  ck_assert_int_eq(d.max_program_ops, 40);
  ck_assert_int_eq(d.max_program_vars, 60);
  ck_assert_int_eq(d.memory_per_run, 3LL << 30);
  ck_assert_int_eq(d.memory_runs_total, 5LL << 30);
  ck_assert_int_eq(d.memory_kept_per_program, 0);
  ck_assert(!d.check_finite);
  ck_assert_int_eq(d.log_level, PE_LOG_DEBUG);
  ck_assert_str_eq(d.places, "auto"); /* not reloadable */
  pe_config_free(&d);
  pe_config_free(&c);
}
END_TEST

START_TEST(test_errors) {
  pe_srv_config c;
  PE_CK_OK(pe_config_defaults(&c));
  expect_errors(pe_config_load_string(&c, "[server]\nsocket_mode = 0999\n", "t.conf"), PE_EINVAL,
                "t.conf", "line 2", "socket_mode", "0999", (const char *)NULL);
  /* An unknown group: file and line, like every other key (it failed at
   * start with neither, exit 1). */
  expect_errors(pe_config_load_string(&c, "[server]\nsocket_group = nosuchgroup-pe\n", "t.conf"),
                PE_EINVAL, "t.conf", "line 2", "socket_group", "nosuchgroup-pe", "no such group",
                (const char *)NULL);
  const struct group *own = getgrgid(getgid());
  ck_assert_ptr_nonnull(own);
  char text[128];
  snprintf(text, sizeof text, "[server]\nsocket_group = %s\n", own->gr_name);
  PE_CK_OK(pe_config_load_string(&c, text, "t.conf"));
  ck_assert_str_eq(c.socket_group, own->gr_name);
  expect_errors(pe_config_load_string(&c, "[server]\nrun_threads = 257\n", "t.conf"), PE_EINVAL,
                "line 2", "run_threads", "0..256", "as many as request_threads",
                (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[runtime]\n\nplaces = gpu:3\n", "t.conf"), PE_EINVAL,
                "line 3", "places", "gpu:3", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[limits]\nmax_message = 12Q\n", "t.conf"), PE_EINVAL,
                "max_message", "12Q", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[limits]\nmax_steps_per_request = 0\n", "t.conf"),
                PE_EINVAL, "max_steps_per_request", "1..2147483647", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[limits]\nmax_program_ops = 0\n", "t.conf"), PE_EINVAL,
                "max_program_ops", "1..2147483647", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[limits]\nmemory_per_run = 150%\n", "t.conf"), PE_EINVAL,
                "memory_per_run", "150%", "share of the host's memory", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[limits]\nmemory_runs_total = lots\n", "t.conf"),
                PE_EINVAL, "memory_runs_total", "lots", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[limits]\nmemory_total = 0.5\n", "t.conf"), PE_EINVAL,
                "memory_total", "0.5", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[limits]\nmemory_kept_per_program = -1\n", "t.conf"),
                PE_EINVAL, "memory_kept_per_program", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[bogus]\nx = 1\n", "t.conf"), PE_EINVAL, "[bogus]",
                (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[server]\nsokcet = ipc:///x\n", "t.conf"), PE_EINVAL,
                "unknown key 'sokcet'", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[server]\nthis is not ini\n", "t.conf"), PE_EINVAL,
                "line 2", "syntax", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[state]\ndir = relative/path\n", "t.conf"), PE_EINVAL,
                "absolute", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[sessions]\nttl = -1\n", "t.conf"), PE_EINVAL, "ttl",
                (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[state]\ncheckpoint_interval = -5\n", "t.conf"),
                PE_EINVAL, "checkpoint_interval", "-5", "seconds >= 0", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[runtime]\nsync = maybe\n", "t.conf"), PE_EINVAL,
                "event or producer", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[runtime]\nflush_denormals = maybe\n", "t.conf"),
                PE_EINVAL, "flush_denormals", "maybe", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[server]\nsocket = /no/scheme\n", "t.conf"), PE_EINVAL,
                "nanomsg address", (const char *)NULL);
  /* A header without its ']': reported at the header's line, not as a
   * mystery about the key after it. */
  expect_errors(pe_config_load_string(&c, "[server\nlog_level = debug\n", "t.conf"), PE_EINVAL,
                "t.conf: line 1", "log_level", "before any valid [section] header",
                (const char *)NULL);
  /* A key given twice: refused at the second line, not the last one winning silently. */
  expect_errors(
      pe_config_load_string(&c, "[server]\nlog_level = debug\n\nlog_level = error\n", "t.conf"),
      PE_EINVAL, "line 4", "[server] log_level is set twice", (const char *)NULL);
  /* Keys are counted per load: loading a file again (SIGHUP) is no repeat. */
  PE_CK_OK(pe_config_load_string(&c, "[limits]\nmax_programs = 9\n", "t.conf"));
  PE_CK_OK(pe_config_load_string(&c, "[limits]\nmax_programs = 9\n", "t.conf"));
  expect_errors(pe_config_load_file(&c, "/nonexistent/pe.conf"), PE_EIO, "/nonexistent/pe.conf",
                (const char *)NULL);
  /* Failed loads left the values alone. */
  ck_assert_str_eq(c.places, "auto");
  ck_assert_uint_eq(c.socket_mode, 0660);
  pe_config_free(&c);
}
END_TEST

START_TEST(test_sizes) {
  int64_t v;
  ck_assert(pe_config_parse_size("4096", &v) && v == 4096);
  ck_assert(pe_config_parse_size("64K", &v) && v == 65536);
  ck_assert(pe_config_parse_size("64M", &v) && v == 64 << 20);
  ck_assert(pe_config_parse_size("1GiB", &v) && v == 1LL << 30);
  ck_assert(pe_config_parse_size("2g", &v) && v == 2LL << 30);
  ck_assert(!pe_config_parse_size("", &v));
  ck_assert(!pe_config_parse_size("-1", &v));
  ck_assert(!pe_config_parse_size("1T", &v));
  ck_assert(!pe_config_parse_size("99999999999999G", &v));
}
END_TEST

START_TEST(test_shipped_conf_parses) {
  /* conf/pe-executord.conf must load as is (it documents every key). */
  const char *src = getenv("PE_SOURCE_DIR");
  ck_assert(src != NULL);
  char path[512];
  snprintf(path, sizeof path, "%s/conf/pe-executord.conf", src);
  pe_srv_config c;
  PE_CK_OK(pe_config_defaults(&c));
  PE_CK_OK(pe_config_load_file(&c, path));
  PE_CK_OK(pe_config_check(&c));
  ck_assert_uint_eq(c.socket_mode, 0660);
  ck_assert_int_eq(c.max_message, 64 << 20);
  pe_config_free(&c);
}
END_TEST

/* The layers of a start and of every SIGHUP reload: the command line wins
 * over the file; a bad override names the command line. */
START_TEST(test_build_command_line_wins) {
  char path[] = "/tmp/pe-conf-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *text = "[server]\nlog_level = info\n[runtime]\nplaces = cpu:2\n";
  ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
  close(fd);
  const pe_config_override ov[] = {{"server", "log_level", "error"},
                                   {"runtime", "places", "cpu:1"}};
  pe_srv_config c;
  PE_CK_OK(pe_config_build(&c, path, ov, 2));
  ck_assert_int_eq(c.log_level, PE_LOG_ERROR);
  ck_assert_str_eq(c.places, "cpu:1");
  pe_config_free(&c);
  PE_CK_OK(pe_config_build(&c, path, NULL, 0));
  ck_assert_int_eq(c.log_level, PE_LOG_INFO);
  ck_assert_str_eq(c.places, "cpu:2");
  pe_config_free(&c);
  const pe_config_override bad[] = {{"server", "log_level", "loud"}};
  expect_errors(pe_config_build(&c, path, bad, 1), PE_EINVAL, "command line", "log_level", "'loud'",
                NULL);
  unlink(path);
}
END_TEST

/* A reload warns about the restart-only keys that changed, with both
 * values, and about nothing when only reloadable keys changed. */
START_TEST(test_restart_changes) {
  pe_srv_config a, b;
  PE_CK_OK(pe_config_defaults(&a));
  PE_CK_OK(pe_config_defaults(&b));
  ck_assert_ptr_null(pe_config_restart_changes(&a, &b));
  PE_CK_OK(pe_config_set(&b, "server", "log_level", "debug"));
  PE_CK_OK(pe_config_set(&b, "sessions", "ttl", "5"));
  PE_CK_OK(pe_config_set(&b, "limits", "dedup_entries", "8"));
  ck_assert_ptr_null(pe_config_restart_changes(&a, &b));
  PE_CK_OK(pe_config_set(&b, "runtime", "places", "cpu:2"));
  PE_CK_OK(pe_config_set(&b, "runtime", "worker_threads", "3"));
  PE_CK_OK(pe_config_set(&b, "runtime", "flush_denormals", "false"));
  PE_CK_OK(pe_config_set(&b, "server", "socket_mode", "0600"));
  PE_CK_OK(pe_config_set(&b, "server", "run_threads", "4"));
  char *m = pe_config_restart_changes(&a, &b);
  ck_assert_ptr_nonnull(m);
  ck_assert_msg(strstr(m, "[runtime] places 'auto' -> 'cpu:2'") &&
                    strstr(m, "[runtime] worker_threads 0 -> 3") &&
                    strstr(m, "[runtime] flush_denormals true -> false") &&
                    strstr(m, "[server] socket_mode 0660 -> 0600") &&
                    strstr(m, "[server] run_threads 0 -> 4") && !strstr(m, "request_threads") &&
                    !strstr(m, "log_level"),
                "changes: %s", m);
  free(m);
  pe_config_free(&a);
  pe_config_free(&b);
}
END_TEST

/* What `load` logs on stderr (redirected to a file for the call). */
static char *stderr_of(pe_status *(*load)(pe_srv_config *, const char *), pe_srv_config *c,
                       const char *arg) {
  char path[] = "/tmp/pe-conf-log-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  ck_assert_int_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
  PE_CK_OK(load(c, arg));
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  char *buf = calloc(1, 4096);
  ssize_t n = pread(fd, buf, 4095, 0);
  ck_assert_int_ge(n, 0);
  close(fd);
  unlink(path);
  return buf;
}

static pe_status *load_t_conf(pe_srv_config *c, const char *text) {
  return pe_config_load_string(c, text, "t.conf");
}

/* A socket mode that lets others connect (o+w) is taken, with a warning
 * naming the file and line (0777 must not pass silently). */
START_TEST(test_world_socket_mode_warns) {
  pe_srv_config c;
  PE_CK_OK(pe_config_defaults(&c));
  char *log = stderr_of(load_t_conf, &c,
                        "; who may connect\n[server]\n\nrequest_threads = 4\nsocket_mode = 0777\n");
  ck_assert_uint_eq(c.socket_mode, 0777);
  ck_assert_msg(strstr(log, "t.conf:5: [server] socket_mode = 0777 lets every user"),
                "logged: '%s'", log);
  free(log);
  /* From a file too. */
  char path[] = "/tmp/pe-conf-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "[server]\n# others may connect\nsocket_mode = 666\n");
  fclose(f);
  log = stderr_of(pe_config_load_file, &c, path);
  char want[64];
  snprintf(want, sizeof want, "%s:3: [server] socket_mode = 666", path);
  ck_assert_msg(strstr(log, want), "want '%s' in: %s", want, log);
  free(log);
  unlink(path);
  /* Group-only or others read-only (a socket needs write to connect): quiet. */
  const char *quiet[] = {"[server]\nsocket_mode = 0660\n", "[server]\nsocket_mode = 0664\n",
                         "[server]\nsocket_mode = 0770\n"};
  for (int i = 0; i < 3; i++) {
    log = stderr_of(load_t_conf, &c, quiet[i]);
    ck_assert_msg(!*log, "%s: %s", quiet[i], log);
    free(log);
  }
  pe_config_free(&c);
}
END_TEST

/* [metrics] listen: off by default, address:port, restart-only. */
START_TEST(test_metrics_listen) {
  pe_srv_config a, b;
  PE_CK_OK(pe_config_defaults(&a));
  PE_CK_OK(pe_config_defaults(&b));
  ck_assert_str_eq(a.metrics_listen, "");
  PE_CK_OK(pe_config_load_string(&b, "[metrics]\nlisten = 127.0.0.1:9464\n", "t.conf"));
  ck_assert_str_eq(b.metrics_listen, "127.0.0.1:9464");
  PE_CK_OK(pe_config_set(&b, "metrics", "listen", "[::1]:9464"));
  ck_assert_str_eq(b.metrics_listen, "[::1]:9464");
  const char *bad[] = {
      "9464", ":9464", "localhost:", "localhost:0", "localhost:65536", "localhost:http"};
  for (int i = 0; i < 6; i++) {
    char text[64];
    snprintf(text, sizeof text, "[metrics]\nlisten = %s\n", bad[i]);
    expect_errors(pe_config_load_string(&b, text, "t.conf"), PE_EINVAL, "t.conf", "line 2",
                  "[metrics] listen", bad[i], "address:port", (const char *)NULL);
  }
  ck_assert_str_eq(b.metrics_listen, "[::1]:9464"); /* refused values left it alone */
  char *m = pe_config_restart_changes(&a, &b);
  ck_assert_ptr_nonnull(m);
  ck_assert_msg(strstr(m, "[metrics] listen '' -> '[::1]:9464'"), "changes: %s", m);
  free(m);
  pe_config_reloadable_apply(&a, &b);
  ck_assert_str_eq(a.metrics_listen, "");
  pe_config_free(&a);
  pe_config_free(&b);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("server_config");
  TCase *tc = tcase_create("config");
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_file_layers);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_sizes);
  tcase_add_test(tc, test_shipped_conf_parses);
  tcase_add_test(tc, test_build_command_line_wins);
  tcase_add_test(tc, test_restart_changes);
  tcase_add_test(tc, test_world_socket_mode_warns);
  tcase_add_test(tc, test_metrics_listen);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
