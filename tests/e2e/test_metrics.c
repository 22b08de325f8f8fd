/* pe-executord end to end, the Prometheus endpoint ([metrics] listen):
 * after a register, an init, runs, a failed run and bytes that do not
 * decode, GET /metrics (fetched with curl) counts them by kind and code,
 * and the run latency histogram holds every run, saves, loads and
 * autosaves are counted; other paths are 404 and other methods 405. Without the key nothing
 * listens. An address that is taken stops the start with an error naming it. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "metrics_sample.h"

#define CLIENT 0x3e70
#define RUNS 3

/* A TCP socket bound to a free port of 127.0.0.1 (*port), listening or not. */
static int loopback_socket(bool listening, int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  if (listening) ck_assert_int_eq(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* A TCP port on 127.0.0.1 that was free a moment ago. */
static int free_port(void) {
  int port;
  close(loopback_socket(false, &port));
  return port;
}

/* TCP sockets of process pid in the LISTEN state: its fds' socket inodes
 * looked up in /proc/net/tcp and tcp6. */
static int listening_sockets(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  ck_assert_msg(dir != NULL, "%s: %s", path, strerror(errno));
  unsigned long inodes[256];
  int n_inodes = 0;
  struct dirent *e;
  while ((e = readdir(dir)) && n_inodes < 256) {
    char link[320], target[64];
    snprintf(link, sizeof link, "%s/%s", path, e->d_name);
    ssize_t k = readlink(link, target, sizeof target - 1);
    if (k <= 0) continue;
    target[k] = 0;
    if (sscanf(target, "socket:[%lu]", &inodes[n_inodes]) == 1) n_inodes++;
  }
  closedir(dir);
  int found = 0;
  static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
  for (int t = 0; t < 2; t++) {
    FILE *f = fopen(tables[t], "r");
    if (!f) continue; /* no IPv6 */
    char line[512];
    while (fgets(line, sizeof line, f)) {
      unsigned st;
      unsigned long inode;
      /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
      if (sscanf(line, " %*s %*s %*s %x %*s %*s %*s %*s %*s %lu", &st, &inode) != 2) continue;
      for (int i = 0; st == 0x0A && i < n_inodes; i++) found += inodes[i] == inode;
    }
    fclose(f);
  }
  return found;
}

/* curl's output for `args` (it must exit 0), in out. */
static void curl(const char *args, char *out, size_t cap) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "curl -sS --max-time 60 %s", args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = 0, k;
  while (n < cap - 1 && (k = fread(out + n, 1, cap - 1 - n, p)) > 0) n += k;
  out[n] = 0;
  int st = pclose(p);
  ck_assert_msg(st == 0, "%s: wait status 0x%x, output: %s", cmd, st, out);
  ck_assert_msg(n < cap - 1, "%s: more than %zu bytes", cmd, cap - 1);
}

/* A daemon with [metrics] listen on a free port (and conf_extra), the mlp
 * registered and initialised as `model`, and a batch. */
typedef struct fx {
  dh_daemon d;
  int s, port;
  char url[96]; /* its /metrics */
  pe_model_spec mlp;
  uint64_t h;
  dh_batch b;
} fx;

static void fx_start(fx *f, const char *conf_extra, const char *model, bool persistent) {
  memset(f, 0, sizeof *f);
  f->port = free_port();
  char conf[256];
  snprintf(conf, sizeof conf, "%s[metrics]\nlisten = 127.0.0.1:%d\n", conf_extra, f->port);
  snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d/metrics", f->port);
  dh_start(&f->d, conf);
  f->s = dh_connect(&f->d, 60000);
  f->mlp = dh_mlp();
  f->h = dh_setup_model(f->s, CLIENT, &f->mlp, model, 1, persistent, NULL);
  dh_batch_make(&f->b, 8, 1);
}

static void fx_stop(fx *f) {
  dh_batch_free(&f->b);
  pe_model_spec_release(&f->mlp);
  nn_close(f->s);
  ck_assert_int_eq(dh_stop(&f->d, SIGTERM), 0);
  dh_cleanup(&f->d);
}

static char page[1 << 20];

START_TEST(test_metrics_count_requests_and_runs) {
  ck_assert_msg(system("curl --version >/dev/null 2>&1") == 0,
                "curl is not installed (./pe installs it)");
  fx f;
  fx_start(&f, "", "m", false);
  ck_assert_msg(dh_log_has(&f.d, "metrics: GET http://127.0.0.1:"), "log %s", f.d.log);
  ck_assert_int_eq(listening_sockets(f.d.pid), 1);
  for (int i = 0; i < RUNS; i++) dh_run_loss(f.s, CLIENT, f.h, &f.b, f.mlp.loss, 1);
  /* A run of a handle that does not exist, and bytes that do not decode. */
  Pe__Reply *bad = dh_run_batches(f.s, CLIENT, f.h ^ 0x5a5a, &f.b, f.mlp.loss, 0);
  ck_assert_int_ne(bad->code, 0);
  char bad_run[160];
  snprintf(bad_run, sizeof bad_run, "pe_requests_total{kind=\"run\",code=\"%s\"}",
           pe_code_name((pe_code)bad->code));
  pe__reply__free_unpacked(bad, NULL);
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
  Pe__Reply *undecoded = dh_call_raw(f.s, junk, sizeof junk);
  ck_assert_ptr_nonnull(undecoded);
  ck_assert_int_ne(undecoded->code, 0);
  char bad_bytes[160];
  snprintf(bad_bytes, sizeof bad_bytes, "pe_requests_total{kind=\"undecodable\",code=\"%s\"}",
           pe_code_name((pe_code)undecoded->code));
  pe__reply__free_unpacked(undecoded, NULL);
  /* A save, and a load of a checkpoint that does not exist. */
  Pe__Reply *saved = dh_checkpoint(f.s, CLIENT, true, "m", "c1");
  dh_ok(saved);
  pe__reply__free_unpacked(saved, NULL);
  Pe__Reply *loaded = dh_checkpoint(f.s, CLIENT, false, "m", "nope");
  ck_assert_int_ne(loaded->code, 0);
  pe__reply__free_unpacked(loaded, NULL);

  curl(f.url, page, sizeof page);
  ck_assert_double_eq(metrics_sample(page, "pe_requests_total{kind=\"register\",code=\"OK\"}"), 1);
  ck_assert_double_eq(metrics_sample(page, "pe_requests_total{kind=\"init\",code=\"OK\"}"), 1);
  ck_assert_double_eq(metrics_sample(page, "pe_requests_total{kind=\"run\",code=\"OK\"}"), RUNS);
  ck_assert_double_eq(metrics_sample(page, bad_run), 1);
  ck_assert_double_eq(metrics_sample(page, bad_bytes), 1);
  ck_assert_double_ge(metrics_sample(page, "pe_requests_total{kind=\"ping\",code=\"OK\"}"), 1);
  ck_assert_double_ge(metrics_sample(page, "pe_requests_failed_total"), 2);
  /* Every run, the failed one too; the buckets end at the count. */
  ck_assert_double_eq(metrics_sample(page, "pe_run_duration_seconds_count"), RUNS + 1);
  ck_assert_double_eq(metrics_sample(page, "pe_run_duration_seconds_bucket{le=\"+Inf\"}"),
                      RUNS + 1);
  ck_assert_double_gt(metrics_sample(page, "pe_run_duration_seconds_sum"), 0);
  ck_assert_double_eq(metrics_sample(page, "pe_run_steps_total"), RUNS);
  /* The Status reply's view of the model and its place. */
  ck_assert_double_eq(metrics_sample(page, "pe_models"), 1);
  ck_assert_double_gt(metrics_sample(page, "pe_model_param_bytes{model=\"m\"}"), 0);
  ck_assert_double_eq(metrics_sample(page, "pe_model_param_bytes{model=\"m\"}"),
                      metrics_sample(page, "pe_place_param_bytes{place=\"cpu:0\"}"));
  ck_assert_double_eq(metrics_sample(page, "pe_checkpoints_total{op=\"save\",result=\"ok\"}"), 1);
  ck_assert_double_eq(metrics_sample(page, "pe_checkpoints_total{op=\"save\",result=\"failed\"}"),
                      0);
  ck_assert_double_eq(metrics_sample(page, "pe_checkpoints_total{op=\"load\",result=\"failed\"}"),
                      1);
  ck_assert_double_eq(metrics_sample(page, "pe_model_checkpoints_saved_total{model=\"m\"}"), 1);
  ck_assert_double_eq(metrics_sample(page, "pe_queue_depth"), 0);
  ck_assert_double_gt(metrics_sample(page, "pe_memory_rss_bytes"), 0);
  ck_assert(strstr(page, "# TYPE pe_run_duration_seconds histogram\n"));

  /* Only GET /metrics. */
  char args[160], code[64];
  snprintf(args, sizeof args, "-o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/other", f.port);
  curl(args, code, sizeof code);
  ck_assert_str_eq(code, "404");
  snprintf(args, sizeof args, "-o /dev/null -w '%%{http_code}' -X POST %s", f.url);
  curl(args, code, sizeof code);
  ck_assert_str_eq(code, "405");
  fx_stop(&f);
}
END_TEST

/* The autosave thread's saves are counted: a persistent model changed by a
 * run is autosaved within a few intervals (polled for up to 120 s). */
START_TEST(test_metrics_count_autosaves) {
  fx f;
  fx_start(&f, "[state]\ncheckpoint_interval = 0.2\n", "p", true);
  dh_run_loss(f.s, CLIENT, f.h, &f.b, f.mlp.loss, 1);
  double autosaves = 0;
  for (double t0 = dh_now(); autosaves < 1 && dh_now() - t0 < 120; dh_sleep_ms(100)) {
    curl(f.url, page, sizeof page);
    autosaves = metrics_sample(page, "pe_checkpoints_total{op=\"autosave\",result=\"ok\"}");
  }
  ck_assert_msg(autosaves >= 1, "no autosave counted (log %s):\n%s", f.d.log, page);
  ck_assert_double_eq(
      metrics_sample(page, "pe_checkpoints_total{op=\"autosave\",result=\"failed\"}"), 0);
  ck_assert_double_eq(metrics_sample(page, "pe_checkpoint_interval_seconds"), 0.2);
  fx_stop(&f);
}
END_TEST

START_TEST(test_metrics_off_by_default) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  ck_assert_int_eq(listening_sockets(d.pid), 0);
  ck_assert(!dh_log_has(&d, "metrics:"));
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

START_TEST(test_metrics_address_taken) {
  /* Our own listener holds the port. */
  int port;
  int fd = loopback_socket(true, &port);
  char conf[96], out[4096], want[128];
  snprintf(conf, sizeof conf, "[metrics]\nlisten = 127.0.0.1:%d\n", port);
  dh_daemon d = {0};
  int st = dh_run_to_exit(&d, conf, out, sizeof out);
  close(fd);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x, output: %s", st, out);
  snprintf(want, sizeof want, "config [metrics] listen: 127.0.0.1:%d: cannot bind: ", port);
  ck_assert_msg(
      strstr(out, want) && strstr(out, "Address already in use") && !strstr(out, "ready on"),
      "output: %s", out);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("metrics");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_metrics_count_requests_and_runs);
  tcase_add_test(tc, test_metrics_count_autosaves);
  tcase_add_test(tc, test_metrics_off_by_default);
  tcase_add_test(tc, test_metrics_address_taken);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
