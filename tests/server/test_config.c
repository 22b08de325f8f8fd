/* pe-executord config: embedded defaults, INI layers, sizes, errors that
 * name the section, key, value and line; reloadable fields. */
#include <grp.h>
#include <stdint.h>
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
  ck_assert_str_eq(c.conv_algo, "default");
  ck_assert_str_eq(c.conv_layout, "blocked");
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
  expect_errors(pe_config_load_string(&c, "[runtime]\nconv_algo = fft\n", "t.conf"), PE_EINVAL,
                "conv_algo", "fft", "default, time, direct, gemm, winograd or auto", (const char *)NULL);
  expect_errors(pe_config_load_string(&c, "[runtime]\nconv_layout = nhwc\n", "t.conf"), PE_EINVAL,
                "conv_layout", "nhwc", "blocked or plain", (const char *)NULL);
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

/* The table's rows: named [a-z_]+, one row per section and key, a doc
 * each, and the sections contiguous (the conf and the man page follow it). */
START_TEST(test_table_rows) {
  size_t n;
  const pe_config_key *keys = pe_config_keys(&n);
  ck_assert_uint_ge(n, 31);
  for (size_t i = 0; i < n; i++) {
    const pe_config_key *k = &keys[i];
    ck_assert_msg(strspn(k->section, "abcdefghijklmnopqrstuvwxyz_") == strlen(k->section) &&
                      strspn(k->key, "abcdefghijklmnopqrstuvwxyz_") == strlen(k->key),
                  "[%s] %s", k->section, k->key);
    ck_assert_msg(k->doc && *k->doc && !strchr(k->doc, '\t') && !strchr(k->doc, '\n'),
                  "[%s] %s: doc", k->section, k->key);
    ck_assert_msg((k->def != NULL) != (k->compute_default != NULL), "[%s] %s: one default",
                  k->section, k->key);
    ck_assert_ptr_eq(pe_config_key_find(k->section, k->key), k);
    for (size_t j = 0; j < i; j++) {
      ck_assert_msg(strcmp(keys[j].section, k->section) || strcmp(keys[j].key, k->key),
                    "[%s] %s twice", k->section, k->key);
      /* A section seen before must be the one just before. */
      if (!strcmp(keys[j].section, k->section))
        ck_assert_msg(!strcmp(keys[i - 1].section, k->section), "[%s] split", k->section);
    }
  }
}
END_TEST

/* k's value in c, as text. */
static const char *value_of(const pe_config_key *k, const pe_srv_config *c, char *buf, size_t len) {
  pe_config_key_value(k, c, false, buf, len);
  return buf;
}

/* Each integer and size key takes its bounds and refuses one past them,
 * naming section, key, value and the bound; the other types likewise. */
START_TEST(test_table_bounds) {
  pe_srv_config c;
  PE_CK_OK(pe_config_defaults(&c));
  size_t n;
  const pe_config_key *keys = pe_config_keys(&n);
  int checked = 0;
  for (size_t i = 0; i < n; i++) {
    const pe_config_key *k = &keys[i];
    if (k->type != PE_CFG_INT && k->type != PE_CFG_SIZE) continue;
    char v[32], got[64], want[64];
    snprintf(v, sizeof v, "%lld", (long long)k->min);
    PE_CK_OK(pe_config_set(&c, k->section, k->key, v));
    ck_assert_str_eq(value_of(k, &c, got, sizeof got), v);
    snprintf(v, sizeof v, "%lld", (long long)k->max);
    PE_CK_OK(pe_config_set(&c, k->section, k->key, v));
    ck_assert_str_eq(value_of(k, &c, got, sizeof got), v);
    if (k->min > 0) {
      snprintf(v, sizeof v, "%lld", (long long)k->min - 1);
      if (k->type == PE_CFG_INT)
        snprintf(want, sizeof want, "%lld..%lld", (long long)k->min, (long long)k->max);
      else
        snprintf(want, sizeof want, "a size");
      char where[64];
      snprintf(where, sizeof where, "[%s] %s = '%s'", k->section, k->key, v);
      expect_errors(pe_config_set(&c, k->section, k->key, v), PE_EINVAL, where, want,
                    (const char *)NULL);
    }
    if (k->max < INT64_MAX) {
      snprintf(v, sizeof v, "%lld", (long long)k->max + 1);
      expect_errors(pe_config_set(&c, k->section, k->key, v), PE_EINVAL, k->key, v,
                    (const char *)NULL);
    }
    snprintf(v, sizeof v, "%lld", (long long)k->max);
    ck_assert_str_eq(value_of(k, &c, got, sizeof got), v); /* refused: unchanged */
    checked++;
  }
  ck_assert_int_ge(checked, 10);
  /* The bounds as errors and --config-keys write them. */
  expect_errors(pe_config_set(&c, "limits", "max_message", "4095"), PE_EINVAL,
                "[limits] max_message = '4095'", "a size in 4K..2G-1", (const char *)NULL);
  expect_errors(pe_config_set(&c, "limits", "dedup_bytes", "1K"), PE_EINVAL, "a size >= 4K",
                (const char *)NULL);
  char type[128];
  pe_config_key_type(pe_config_key_find("limits", "max_message"), type, sizeof type);
  ck_assert_str_eq(type, "size[4K..2G-1]");
  pe_config_key_type(pe_config_key_find("server", "log_level"), type, sizeof type);
  ck_assert_str_eq(type, "enum[error|warn|info|debug]");
  pe_config_key_type(pe_config_key_find("server", "run_threads"), type, sizeof type);
  ck_assert_str_eq(type, "int[0..256]");
  /* Octal modes up to 0777; seconds from 0; an enum's names in any case;
   * shares of memory 1%..100%. */
  PE_CK_OK(pe_config_set(&c, "server", "socket_mode", "0777"));
  expect_errors(pe_config_set(&c, "server", "socket_mode", "01000"), PE_EINVAL, "01000", "0777",
                (const char *)NULL);
  PE_CK_OK(pe_config_set(&c, "sessions", "ttl", "0"));
  expect_errors(pe_config_set(&c, "sessions", "ttl", "-0.5"), PE_EINVAL, "[sessions] ttl",
                "seconds >= 0", "sessions never expire", (const char *)NULL);
  PE_CK_OK(pe_config_set(&c, "server", "log_level", "WARN"));
  ck_assert_int_eq(c.log_level, PE_LOG_WARN);
  expect_errors(pe_config_set(&c, "server", "log_level", "loud"), PE_EINVAL,
                "expected error, warn, info or debug", (const char *)NULL);
  PE_CK_OK(pe_config_set(&c, "limits", "memory_total", "100%"));
  ck_assert_int_eq(c.memory_total, pe_host_memory_bytes() / 100 * 100);
  expect_errors(pe_config_set(&c, "limits", "memory_total", "0%"), PE_EINVAL, "'0%'", "1%..100%",
                (const char *)NULL);
  expect_errors(pe_config_set(&c, "limits", "memory_total", "101%"), PE_EINVAL, "'101%'",
                (const char *)NULL);
  const char *yes[] = {"true", "YES", "on", "1"}, *no[] = {"false", "No", "OFF", "0"};
  for (int i = 0; i < 4; i++) {
    PE_CK_OK(pe_config_set(&c, "runtime", "check_finite", yes[i]));
    ck_assert(c.check_finite);
    PE_CK_OK(pe_config_set(&c, "runtime", "check_finite", no[i]));
    ck_assert(!c.check_finite);
  }
  pe_config_free(&c);
}
END_TEST

/* A valid value of k other than the one c holds. */
static const char *other_value(const pe_config_key *k, const pe_srv_config *c, char *buf,
                               size_t len) {
  static const struct {
    const char *section, *key, *value;
  } strings[] = {
      {"server", "socket", "ipc:///tmp/pe-other.sock"},
      {"runtime", "places", "cpu:2"},
      {"runtime", "sync", "producer"},
      {"runtime", "cuda_graph", "off"},
      {"runtime", "conv_algo", "time"},
      {"runtime", "conv_layout", "plain"},
      {"state", "dir", "/tmp/pe-other-state"},
      {"state", "shutdown_checkpoint", "other"},
      {"metrics", "listen", "127.0.0.1:9464"},
      {"job", "host", "127.0.0.1"},
  };
  char now[256];
  value_of(k, c, now, sizeof now);
  switch (k->type) {
    case PE_CFG_BOOL: snprintf(buf, len, "%s", strcmp(now, "true") ? "true" : "false"); break;
    case PE_CFG_INT:
    case PE_CFG_SIZE:
      snprintf(buf, len, "%lld", (long long)k->min);
      if (!strcmp(buf, now)) snprintf(buf, len, "%lld", (long long)k->max);
      break;
    case PE_CFG_MEMORY: snprintf(buf, len, "1M"); break;
    case PE_CFG_SECONDS: snprintf(buf, len, "1.5"); break;
    case PE_CFG_MODE: snprintf(buf, len, "0600"); break;
    case PE_CFG_ENUM:
      snprintf(buf, len, "%s", k->choices[strcmp(now, k->choices[0]) ? 0 : 1]);
      break;
    case PE_CFG_STRING:
      if (!strcmp(k->key, "socket_group")) { /* the default is "" */
        const struct group *own = getgrgid(getgid());
        ck_assert_ptr_nonnull(own);
        snprintf(buf, len, "%s", own->gr_name);
        break;
      }
      *buf = 0;
      for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!strcmp(strings[i].section, k->section) && !strcmp(strings[i].key, k->key))
          snprintf(buf, len, "%s", strings[i].value);
      ck_assert_msg(*buf, "no other value for [%s] %s: add one to other_value", k->section, k->key);
      break;
  }
  return buf;
}

/* What a reload does with each key follows the table: a reloadable key is
 * copied and not reported, a restart-only one reported with both values
 * and not copied. And the table's reloadable keys are the documented ones. */
START_TEST(test_table_reload_restart) {
  static const char *const reloadable[] = {"server log_level",
                                           "runtime check_finite",
                                           "runtime places_trial",
                                           "runtime places_trial_steps",
                                           "runtime places_trial_time",
                                           "runtime places_trial_batch",
                                           "state checkpoint_on_shutdown",
                                           "state checkpoint_interval",
                                           "job timeout",
                                           "sessions ttl",
                                           "limits max_message",
                                           "limits max_programs",
                                           "limits memory_per_client",
                                           "limits max_steps_per_request",
                                           "limits max_program_ops",
                                           "limits max_program_vars",
                                           "limits memory_per_run",
                                           "limits memory_runs_total",
                                           "limits memory_total",
                                           "limits memory_kept_per_program",
                                           "limits memory_per_request",
                                           "limits memory_requests_total",
                                           "limits dedup_entries",
                                           "limits dedup_bytes"};
  size_t n;
  const pe_config_key *keys = pe_config_keys(&n);
  int n_reload = 0;
  for (size_t i = 0; i < n; i++) {
    const pe_config_key *k = &keys[i];
    char name[96];
    snprintf(name, sizeof name, "%s %s", k->section, k->key);
    bool listed = false;
    for (size_t j = 0; j < sizeof reloadable / sizeof reloadable[0]; j++)
      listed |= !strcmp(reloadable[j], name);
    ck_assert_msg(listed == k->reloadable, "[%s] %s: reloadable %d", k->section, k->key,
                  k->reloadable);
    n_reload += k->reloadable;

    pe_srv_config cur, next;
    PE_CK_OK(pe_config_defaults(&cur));
    PE_CK_OK(pe_config_defaults(&next));
    char v[256], before[256], after[256], got[256];
    other_value(k, &next, v, sizeof v);
    value_of(k, &cur, before, sizeof before);
    PE_CK_OK(pe_config_set(&next, k->section, k->key, v));
    value_of(k, &next, after, sizeof after);
    ck_assert_str_ne(before, after);
    char *m = pe_config_restart_changes(&cur, &next);
    char head[96];
    snprintf(head, sizeof head, "[%s] %s ", k->section, k->key);
    if (k->reloadable) {
      ck_assert_msg(!m, "[%s] %s: reported as needing a restart: %s", k->section, k->key, m);
    } else {
      ck_assert_msg(m && strstr(m, head) && !strchr(m, ','), "[%s] %s: changes: %s", k->section,
                    k->key, m ? m : "(none)");
      pe_config_key_value(k, &next, true, after, sizeof after);
      ck_assert_msg(strstr(m, after), "[%s] %s: '%s' not in %s", k->section, k->key, after, m);
    }
    free(m);
    pe_config_reloadable_apply(&cur, &next);
    value_of(k, &cur, got, sizeof got);
    value_of(k, &next, after, sizeof after);
    ck_assert_str_eq(got, k->reloadable ? after : before);
    pe_config_free(&cur);
    pe_config_free(&next);
  }
  ck_assert_int_eq(n_reload, (int)(sizeof reloadable / sizeof reloadable[0]));
}
END_TEST

/* Unknown keys and sections: the error names them (and the sections there
 * are), from a file, the setter and the command line; c stays as it was. */
START_TEST(test_unknown_key) {
  pe_srv_config c;
  PE_CK_OK(pe_config_defaults(&c));
  ck_assert_ptr_null(pe_config_key_find("limits", "max_widgets"));
  ck_assert_ptr_null(pe_config_key_find("server", "ttl")); /* [sessions] ttl */
  expect_errors(pe_config_set(&c, "limits", "max_widgets", "3"), PE_EINVAL,
                "config [limits]: unknown key 'max_widgets'", (const char *)NULL);
  expect_errors(pe_config_set(&c, "server", "ttl", "3"), PE_EINVAL,
                "config [server]: unknown key 'ttl'", (const char *)NULL);
  expect_errors(
      pe_config_set(&c, "widgets", "max", "3"), PE_EINVAL,
      "unknown section [widgets] (server, runtime, state, job, sessions, limits, metrics)",
      (const char *)NULL);
  expect_errors(
      pe_config_load_string(&c, "[limits]\nmax_programs = 9\nmax_widgets = 3\n", "t.conf"),
      PE_EINVAL, "t.conf: line 3", "unknown key 'max_widgets'", (const char *)NULL);
  ck_assert_int_eq(c.max_programs, 9); /* the line before was taken */
  const pe_config_override ov[] = {{"limits", "max_widgets", "3"}};
  pe_srv_config d;
  expect_errors(pe_config_build(&d, NULL, ov, 1), PE_EINVAL, "command line",
                "unknown key 'max_widgets'", (const char *)NULL);
  pe_config_free(&c);
}
END_TEST

/* The table's defaults are the embedded defaults the daemon has always had
 * (its INI string, kept here as it was): loaded on top of the table's
 * defaults, that string changes no key. */
START_TEST(test_table_defaults_unchanged) {
  static const char embedded_defaults[] =
      "[server]\n"
      "socket_mode = 0660\n"
      "socket_group =\n"
      "request_threads = 8\n"
      "run_threads = 0\n"
      "log_level = info\n"
      "[runtime]\n"
      "places = auto\n"
      "worker_threads = 0\n"
      "sync = event\n"
      "flush_denormals = true\n"
      "check_finite = true\n"
      "[state]\n"
      "checkpoint_on_shutdown = true\n"
      "shutdown_checkpoint = shutdown\n"
      "checkpoint_interval = 300\n"
      "[sessions]\n"
      "ttl = 600\n"
      "[limits]\n"
      "max_message = 64M\n"
      "max_programs = 256\n"
      "memory_per_client = 0\n"
      "max_steps_per_request = 1000000\n"
      "max_program_ops = 100000\n"
      "max_program_vars = 200000\n"
      "memory_per_run = 50%\n"
      "memory_runs_total = 75%\n"
      "memory_total = 75%\n"
      "memory_kept_per_program = 256M\n"
      "memory_per_request = 0\n"
      "memory_requests_total = 25%\n"
      "dedup_entries = 4096\n"
      "dedup_bytes = 256M\n";
  pe_srv_config table, old;
  PE_CK_OK(pe_config_defaults(&table));
  PE_CK_OK(pe_config_defaults(&old));
  PE_CK_OK(pe_config_load_string(&old, embedded_defaults, "embedded defaults"));
  size_t n;
  const pe_config_key *keys = pe_config_keys(&n);
  for (size_t i = 0; i < n; i++) {
    char a[256], b[256];
    value_of(&keys[i], &table, a, sizeof a);
    value_of(&keys[i], &old, b, sizeof b);
    ck_assert_msg(!strcmp(a, b), "[%s] %s: table default %s, embedded %s", keys[i].section,
                  keys[i].key, a, b);
  }
  /* A few by value. */
  ck_assert_uint_eq(table.socket_mode, 0660);
  ck_assert_str_eq(table.socket_group, "");
  ck_assert_int_eq(table.log_level, PE_LOG_INFO);
  ck_assert_str_eq(table.shutdown_checkpoint, "shutdown");
  ck_assert_int_eq(table.memory_per_request, 0);
  ck_assert_int_eq(table.memory_requests_total, pe_host_memory_bytes() / 100 * 25);
  ck_assert_int_eq(table.dedup_entries, 4096);
  ck_assert_int_eq(table.dedup_bytes, 256LL << 20);
  ck_assert_str_eq(table.metrics_listen, "");
  pe_config_free(&table);
  pe_config_free(&old);
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
  tcase_add_test(tc, test_table_rows);
  tcase_add_test(tc, test_table_bounds);
  tcase_add_test(tc, test_table_reload_restart);
  tcase_add_test(tc, test_unknown_key);
  tcase_add_test(tc, test_table_defaults_unchanged);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
