/* pe-executord [--config FILE] [--socket ADDR] [--places SPEC] [--state-dir DIR]
 * pe-executord --config-keys | --version | --help
 *
 * Runs in the foreground (the systemd way: Type=notify, logs on stderr).
 * Layers: embedded defaults, then FILE, then the options given here. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/omp_policy.h"
#include "server/config.h"
#include "server/heap_trim.h"
#include "server/server.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: pe-executord [--config FILE] [--socket ADDR] [--places SPEC] [--state-dir DIR]\n"
          "                    [--log-level LEVEL]\n"
          "       pe-executord --config-keys | --version | --help\n"
          "\n"
          "  --config FILE     INI configuration (see conf/pe-executord.conf); without it the\n"
          "                    embedded defaults are used\n"
          "  --socket ADDR     nanomsg address, e.g. ipc:///run/pe-executord/pe-executord.sock\n"
          "  --places SPEC     auto | cpu:N | sim:N | cuda:N\n"
          "  --state-dir DIR   where checkpoints are kept (absolute path)\n"
          "  --log-level L     error | warn | info | debug\n"
          "  --config-keys     print every configuration key, one a line, tab-separated:\n"
          "                    section, key, type, default, reload or restart, description\n"
          "\n"
          "Signals: SIGTERM/SIGINT stop (finish in-flight requests, checkpoint persistent\n"
          "models, exit 0); SIGUSR1/SIGUSR2 are logged and ignored (SIGPIPE too);\n"
          "SIGHUP reloads log level, session TTL, limits and\n"
          "checkpoint_interval from FILE (the options given here still win).\n"
          "One daemon per state directory: a second one on it exits 1.\n");
}

int main(int argc, char **argv) {
  /* First: it may re-execute the daemon (core/omp_policy.h). */
  bool omp_ok = pe_omp_policy_init("pe-executord", argv);
  static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                       {"socket", required_argument, NULL, 's'},
                                       {"places", required_argument, NULL, 'p'},
                                       {"state-dir", required_argument, NULL, 'd'},
                                       {"log-level", required_argument, NULL, 'l'},
                                       {"config-keys", no_argument, NULL, 'k'},
                                       {"version", no_argument, NULL, 'V'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  const char *config_path = NULL;
  /* Command-line overrides, applied after the file, at start and on every
   * SIGHUP reload (the server keeps a copy). */
  pe_config_override ov[8];
  int n_ov = 0;
  int c;
  while ((c = getopt_long(argc, argv, "c:s:p:d:l:kVh", opts, NULL)) != -1) {
    switch (c) {
      case 'c': config_path = optarg; break;
      case 's': ov[n_ov++] = (pe_config_override){"server", "socket", optarg}; break;
      case 'p': ov[n_ov++] = (pe_config_override){"runtime", "places", optarg}; break;
      case 'd': ov[n_ov++] = (pe_config_override){"state", "dir", optarg}; break;
      case 'l': ov[n_ov++] = (pe_config_override){"server", "log_level", optarg}; break;
      case 'k': {
        pe_status *st = pe_config_print_keys(stdout);
        if (!st) return 0;
        fprintf(stderr, "pe-executord: %s\n", pe_status_msg(st));
        pe_status_free(st);
        return 1;
      }
      case 'V': printf("pe-executord %s\n", PE_SERVER_VERSION); return 0;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
    if (n_ov == 8) {
      fprintf(stderr, "pe-executord: too many options\n");
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "pe-executord: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  pe_srv_config cfg;
  pe_status *st = pe_config_build(&cfg, config_path, ov, n_ov);
  if (st) {
    PE_LOGE("pe-executord: %s", pe_status_msg(st));
    pe_status_free(st);
    return 2;
  }
  pe_log_set_level(cfg.log_level);
  char omp_line[320];
  if (omp_ok)
    PE_LOGI("%s", pe_omp_policy_describe(omp_line, sizeof omp_line));
  else
    PE_LOGW("%s", pe_omp_policy_describe(omp_line, sizeof omp_line));
  pe_heap_trim_setup(); /* before the runtime's threads */
  pe_server *s;
  st = pe_server_new(&cfg, config_path, ov, n_ov, &s);
  if (st) {
    PE_LOGE("pe-executord: %s", pe_status_msg(st));
    pe_status_free(st);
    pe_config_free(&cfg);
    return 1;
  }
  st = pe_server_run(s);
  pe_server_free(s);
  if (st) {
    PE_LOGE("pe-executord: %s", pe_status_msg(st));
    pe_status_free(st);
    return 1;
  }
  return 0;
}
