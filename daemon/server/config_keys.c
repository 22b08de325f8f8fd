/* The configuration's keys: defaults, the setter, and what a reload applies
 * or reports (see config.h). */
#include <errno.h>
#include <grp.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/log.h"
#include "core/place.h"
#include "engine/device.h"
#include "server/config.h"
#include "server/host_memory.h"

/* Prefer systemd's directories when the unit provides them. */
char *pe_config_default_socket(void) {
  const char *dir = getenv("RUNTIME_DIRECTORY");
  char buf[4096];
  if (dir && *dir) {
    snprintf(buf, sizeof buf, "ipc://%s/pe-executord.sock", dir);
  } else if (geteuid() == 0) {
    snprintf(buf, sizeof buf, "ipc:///run/pe-executord/pe-executord.sock");
  } else {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
      snprintf(buf, sizeof buf, "ipc://%s/pe-executord.sock", xdg);
    else
      snprintf(buf, sizeof buf, "ipc:///tmp/pe-executord-%u.sock", (unsigned)geteuid());
  }
  return strdup(buf);
}

static char *default_state_dir(void) {
  const char *dir = getenv("STATE_DIRECTORY");
  char buf[4096];
  if (dir && *dir) {
    /* systemd may pass a colon-separated list; the first is ours. */
    snprintf(buf, sizeof buf, "%s", dir);
    char *colon = strchr(buf, ':');
    if (colon) *colon = 0;
  } else if (geteuid() == 0) {
    snprintf(buf, sizeof buf, "/var/lib/pe-executord");
  } else {
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
      snprintf(buf, sizeof buf, "%s/pe-executord", xdg);
    else if (home && *home)
      snprintf(buf, sizeof buf, "%s/.local/state/pe-executord", home);
    else
      snprintf(buf, sizeof buf, "/tmp/pe-executord-state-%u", (unsigned)geteuid());
  }
  return strdup(buf);
}

/* The embedded defaults, in the file's own syntax so that the documented
 * conf/pe-executord.conf and the binary cannot drift apart in meaning. The
 * socket and state dir depend on the user and are filled in by code. */
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

pe_status *pe_config_defaults(pe_srv_config *c) {
  memset(c, 0, sizeof *c);
  c->socket = pe_config_default_socket();
  c->state_dir = default_state_dir();
  c->socket_group = strdup("");
  c->places = strdup("auto");
  c->sync = strdup("event");
  c->shutdown_checkpoint = strdup("shutdown");
  if (!c->socket || !c->state_dir || !c->socket_group || !c->places || !c->sync ||
      !c->shutdown_checkpoint) {
    pe_config_free(c);
    return pe_error(PE_ENOMEM, "config: out of memory for defaults");
  }
  pe_status *st = pe_config_load_string(c, embedded_defaults, "embedded defaults");
  if (st) pe_config_free(c);
  return st;
}

void pe_config_free(pe_srv_config *c) {
  if (!c) return;
  free(c->socket);
  free(c->socket_group);
  free(c->places);
  free(c->sync);
  free(c->state_dir);
  free(c->shutdown_checkpoint);
  memset(c, 0, sizeof *c);
}

bool pe_config_parse_size(const char *s, int64_t *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || v < 0) return false;
  int64_t mul = 1;
  if (*end) {
    switch (*end) {
      case 'k':
      case 'K': mul = 1024; break;
      case 'm':
      case 'M': mul = 1024 * 1024; break;
      case 'g':
      case 'G': mul = 1024LL * 1024 * 1024; break;
      default: return false;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return false;
  }
  if (v > INT64_MAX / mul) return false;
  *out = (int64_t)v * mul;
  return true;
}

/* "N%": N percent (1..100) of the host's memory (the physical memory, or
 * the cgroup's limit when lower: host_memory.h); else a size. */
static bool parse_memory(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long pct = strtol(s, &end, 10);
  if (end == s || strcmp(end, "%")) return pe_config_parse_size(s, out);
  if (errno || pct < 1 || pct > 100) return false;
  int64_t host = pe_host_memory_bytes();
  if (host <= 0) return false;
  *out = host / 100 * pct;
  return true;
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

/* Seconds: a finite number >= 0 (fractions allowed). */
static bool parse_seconds(const char *s, double *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

static bool parse_bool(const char *s, bool *out) {
  if (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on") || !strcmp(s, "1")) {
    *out = true;
    return true;
  }
  if (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off") || !strcmp(s, "0")) {
    *out = false;
    return true;
  }
  return false;
}

static bool parse_level(const char *s, pe_log_level *out) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (!strcasecmp(s, names[i])) {
      *out = (pe_log_level)i;
      return true;
    }
  return false;
}

static pe_status *set_str(char **field, const char *value) {
  char *v = strdup(value);
  if (!v) return pe_error(PE_ENOMEM, "config: out of memory");
  free(*field);
  *field = v;
  return NULL;
}

#define BAD(what) pe_error(PE_EINVAL, "config [%s] %s = '%.200s': %s", section, key, value, what)

pe_status *pe_config_set(pe_srv_config *c, const char *section, const char *key,
                         const char *value) {
  int iv;
  int64_t sz;
  bool bv;
  if (!strcmp(section, "server")) {
    if (!strcmp(key, "socket")) {
      if (!strstr(value, "://"))
        return BAD("expected a nanomsg address like ipc:///path or tcp://host:port");
      return set_str(&c->socket, value);
    }
    if (!strcmp(key, "socket_mode")) {
      char *end;
      errno = 0;
      unsigned long m = strtoul(value, &end, 8);
      if (errno || *end || !*value || m > 0777) return BAD("expected an octal mode like 0660");
      c->socket_mode = (unsigned)m;
      return NULL;
    }
    if (!strcmp(key, "socket_group")) {
      /* Checked here, so that the error names the file and line (the
       * socket's chgrp at start looks it up again). */
      if (*value && !getgrnam(value)) return BAD("no such group (getent group lists them)");
      return set_str(&c->socket_group, value);
    }
    if (!strcmp(key, "request_threads")) {
      if (!parse_int(value, 1, 256, &iv)) return BAD("expected an integer in 1..256");
      c->request_threads = iv;
      return NULL;
    }
    if (!strcmp(key, "run_threads")) {
      if (!parse_int(value, 0, 256, &iv))
        return BAD("expected an integer in 0..256 (0: as many as request_threads)");
      c->run_threads = iv;
      return NULL;
    }
    if (!strcmp(key, "log_level")) {
      if (!parse_level(value, &c->log_level)) return BAD("expected error, warn, info or debug");
      return NULL;
    }
  } else if (!strcmp(section, "runtime")) {
    if (!strcmp(key, "places")) {
      if (strcmp(value, "auto")) {
        pe_place_kind k;
        int n;
        pe_status *st = pe_places_parse(value, &k, &n);
        if (st) {
          pe_status *e = BAD(pe_status_msg(st));
          pe_status_free(st);
          return e;
        }
      }
      return set_str(&c->places, value);
    }
    if (!strcmp(key, "worker_threads")) {
      if (!parse_int(value, 0, 1024, &iv))
        return BAD(
            "expected an integer in 0..1024 (0: one per cpu or cuda place, else online cores)");
      c->worker_threads = iv;
      return NULL;
    }
    if (!strcmp(key, "sync")) {
      pe_sync_strategy s;
      if (!pe_sync_strategy_parse(value, &s)) return BAD("expected event or producer");
      return set_str(&c->sync, value);
    }
    if (!strcmp(key, "flush_denormals")) {
      if (!parse_bool(value, &bv)) return BAD("expected true or false");
      c->flush_denormals = bv;
      return NULL;
    }
    if (!strcmp(key, "check_finite")) {
      if (!parse_bool(value, &bv)) return BAD("expected true or false");
      c->check_finite = bv;
      return NULL;
    }
  } else if (!strcmp(section, "state")) {
    if (!strcmp(key, "dir")) {
      if (value[0] != '/') return BAD("expected an absolute path");
      return set_str(&c->state_dir, value);
    }
    if (!strcmp(key, "checkpoint_on_shutdown")) {
      if (!parse_bool(value, &bv)) return BAD("expected true or false");
      c->checkpoint_on_shutdown = bv;
      return NULL;
    }
    if (!strcmp(key, "shutdown_checkpoint")) {
      if (!*value || strlen(value) > 64 || value[0] == '.' ||
          strspn(value, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
              strlen(value))
        return BAD("expected a checkpoint name [A-Za-z0-9._-]{1,64} not starting with '.'");
      return set_str(&c->shutdown_checkpoint, value);
    }
    if (!strcmp(key, "checkpoint_interval")) {
      if (!parse_seconds(value, &c->checkpoint_interval_s))
        return BAD("expected seconds >= 0 (0: no periodic checkpoints)");
      return NULL;
    }
  } else if (!strcmp(section, "sessions")) {
    if (!strcmp(key, "ttl")) {
      if (!parse_seconds(value, &c->session_ttl_s))
        return BAD("expected seconds >= 0 (0: sessions never expire)");
      return NULL;
    }
  } else if (!strcmp(section, "limits")) {
    if (!strcmp(key, "max_message")) {
      if (!pe_config_parse_size(value, &sz) || sz < 4096 || sz > INT32_MAX)
        return BAD("expected a size in 4K..2G-1 (suffixes K, M, G)");
      c->max_message = sz;
      return NULL;
    }
    if (!strcmp(key, "max_programs")) {
      if (!parse_int(value, 1, 1 << 20, &iv)) return BAD("expected an integer >= 1");
      c->max_programs = iv;
      return NULL;
    }
    if (!strcmp(key, "memory_per_client")) {
      if (!pe_config_parse_size(value, &sz)) return BAD("expected a size (0: unlimited)");
      c->memory_per_client = sz;
      return NULL;
    }
    if (!strcmp(key, "max_steps_per_request")) {
      if (!parse_int(value, 1, INT32_MAX, &iv)) return BAD("expected an integer in 1..2147483647");
      c->max_steps_per_request = iv;
      return NULL;
    }
    if (!strcmp(key, "max_program_ops") || !strcmp(key, "max_program_vars")) {
      if (!parse_int(value, 1, INT32_MAX, &iv)) return BAD("expected an integer in 1..2147483647");
      *(!strcmp(key, "max_program_ops") ? &c->max_program_ops : &c->max_program_vars) = iv;
      return NULL;
    }
    if (!strcmp(key, "memory_per_run") || !strcmp(key, "memory_runs_total") ||
        !strcmp(key, "memory_total")) {
      if (!parse_memory(value, &sz))
        return BAD("expected a size, or a share of the host's memory like 50% (0: unlimited)");
      *(!strcmp(key, "memory_per_run")      ? &c->memory_per_run
        : !strcmp(key, "memory_runs_total") ? &c->memory_runs_total
                                            : &c->memory_total) = sz;
      return NULL;
    }
    if (!strcmp(key, "memory_per_request")) {
      if (!pe_config_parse_size(value, &sz))
        return BAD("expected a size (0: twice max_message plus 16M)");
      c->memory_per_request = sz;
      return NULL;
    }
    if (!strcmp(key, "memory_requests_total")) {
      if (!parse_memory(value, &sz))
        return BAD("expected a size, or a share of the host's memory like 25% (0: unlimited)");
      c->memory_requests_total = sz;
      return NULL;
    }
    if (!strcmp(key, "memory_kept_per_program")) {
      if (!parse_memory(value, &sz))
        return BAD("expected a size, or a share of the host's memory like 5% (0: keep none)");
      c->memory_kept_per_program = sz;
      return NULL;
    }
    if (!strcmp(key, "dedup_entries")) {
      if (!parse_int(value, 1, 1 << 24, &iv)) return BAD("expected an integer >= 1");
      c->dedup_entries = iv;
      return NULL;
    }
    if (!strcmp(key, "dedup_bytes")) {
      if (!pe_config_parse_size(value, &sz) || sz < 4096) return BAD("expected a size >= 4K");
      c->dedup_bytes = sz;
      return NULL;
    }
  } else {
    return pe_error(PE_EINVAL,
                    "config: unknown section [%.64s] (server, runtime, state, sessions, limits)",
                    section);
  }
  return pe_error(PE_EINVAL, "config [%s]: unknown key '%.64s'", section, key);
}

#undef BAD

void pe_config_reloadable_apply(pe_srv_config *dst, const pe_srv_config *src) {
  dst->log_level = src->log_level;
  dst->session_ttl_s = src->session_ttl_s;
  dst->max_message = src->max_message;
  dst->max_programs = src->max_programs;
  dst->memory_per_client = src->memory_per_client;
  dst->max_steps_per_request = src->max_steps_per_request;
  dst->max_program_ops = src->max_program_ops;
  dst->max_program_vars = src->max_program_vars;
  dst->memory_per_run = src->memory_per_run;
  dst->memory_runs_total = src->memory_runs_total;
  dst->memory_total = src->memory_total;
  dst->memory_kept_per_program = src->memory_kept_per_program;
  dst->memory_per_request = src->memory_per_request;
  dst->memory_requests_total = src->memory_requests_total;
  dst->checkpoint_on_shutdown = src->checkpoint_on_shutdown;
  dst->checkpoint_interval_s = src->checkpoint_interval_s;
  dst->dedup_entries = src->dedup_entries;
  dst->dedup_bytes = src->dedup_bytes;
  dst->check_finite = src->check_finite;
}

/* The keys a running daemon cannot change, as a table: the reload names
 * the ones whose value differs. */
typedef enum { RK_STR, RK_INT, RK_MODE, RK_BOOL } restart_kind;
static const struct {
  const char *section, *key;
  restart_kind kind;
  size_t off;
} restart_keys[] = {
    {"server", "socket", RK_STR, offsetof(pe_srv_config, socket)},
    {"server", "socket_mode", RK_MODE, offsetof(pe_srv_config, socket_mode)},
    {"server", "socket_group", RK_STR, offsetof(pe_srv_config, socket_group)},
    {"server", "request_threads", RK_INT, offsetof(pe_srv_config, request_threads)},
    {"server", "run_threads", RK_INT, offsetof(pe_srv_config, run_threads)},
    {"runtime", "places", RK_STR, offsetof(pe_srv_config, places)},
    {"runtime", "worker_threads", RK_INT, offsetof(pe_srv_config, worker_threads)},
    {"runtime", "sync", RK_STR, offsetof(pe_srv_config, sync)},
    {"runtime", "flush_denormals", RK_BOOL, offsetof(pe_srv_config, flush_denormals)},
    {"state", "dir", RK_STR, offsetof(pe_srv_config, state_dir)},
    {"state", "shutdown_checkpoint", RK_STR, offsetof(pe_srv_config, shutdown_checkpoint)},
};

/* A restart key's value as text ('quoted' strings). */
static void restart_value(const pe_srv_config *c, int k, char *buf, size_t len) {
  const char *p = (const char *)c + restart_keys[k].off;
  switch (restart_keys[k].kind) {
    case RK_STR: snprintf(buf, len, "'%.200s'", *(char *const *)p); break;
    case RK_INT: snprintf(buf, len, "%d", *(const int *)p); break;
    case RK_MODE: snprintf(buf, len, "%04o", *(const unsigned *)p); break;
    case RK_BOOL: snprintf(buf, len, "%s", *(const bool *)p ? "true" : "false"); break;
  }
}

char *pe_config_restart_changes(const pe_srv_config *cur, const pe_srv_config *next) {
  char out[4096] = "";
  size_t n = 0;
  for (int k = 0; k < (int)(sizeof restart_keys / sizeof restart_keys[0]); k++) {
    char a[256], b[256];
    restart_value(cur, k, a, sizeof a);
    restart_value(next, k, b, sizeof b);
    if (!strcmp(a, b)) continue;
    int w = snprintf(out + n, sizeof out - n, "%s[%s] %s %s -> %s", n ? ", " : "",
                     restart_keys[k].section, restart_keys[k].key, a, b);
    if (w > 0) n += (size_t)w < sizeof out - n ? (size_t)w : sizeof out - n - 1;
  }
  return n ? strdup(out) : NULL;
}
