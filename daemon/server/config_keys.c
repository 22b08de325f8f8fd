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
#include "engine/step_graph_key.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "server/config.h"
#include "server/host_memory.h"
#include "server/places_choice.h"

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

/* Seconds: a finite number >= lo (fractions allowed). */
static bool parse_seconds(const char *s, double lo, double *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v) || v < lo) return false;
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

/* --- the string keys' checks ----------------------------------------------------- */

static bool check_address(const char *v, char *why, size_t n) {
  if (strstr(v, "://")) return true;
  snprintf(why, n, "expected a nanomsg address like ipc:///path or tcp://host:port");
  return false;
}

/* Checked here, so that the error names the file and line (the socket's
 * chgrp at start looks it up again). */
static bool check_group(const char *v, char *why, size_t n) {
  if (!*v || getgrnam(v)) return true;
  snprintf(why, n, "no such group (getent group lists them)");
  return false;
}

static bool check_places(const char *v, char *why, size_t n) {
  if (!strcmp(v, "auto")) return true;
  pe_place_kind kind;
  int count;
  pe_status *st = pe_places_parse(v, &kind, &count);
  if (!st) return true;
  snprintf(why, n, "%s", pe_status_msg(st));
  pe_status_free(st);
  return false;
}

static bool check_sync(const char *v, char *why, size_t n) {
  pe_sync_strategy s;
  if (pe_sync_strategy_parse(v, &s)) return true;
  snprintf(why, n, "expected event or producer");
  return false;
}

static bool check_cuda_graph(const char *v, char *why, size_t n) {
  pe_cuda_graph_mode m;
  if (pe_cuda_graph_mode_parse(v, &m)) return true;
  snprintf(why, n, "expected auto, on or off");
  return false;
}

static bool check_conv_algo(const char *v, char *why, size_t n) {
  int mode;
  if (pe_conv_algo_parse(v, &mode)) return true;
  snprintf(why, n, "expected default, time, direct, gemm, winograd or auto");
  return false;
}

static bool check_conv_layout(const char *v, char *why, size_t n) {
  int mode;
  if (pe_conv_layout_parse(v, &mode)) return true;
  snprintf(why, n, "expected blocked or plain");
  return false;
}

static bool check_absolute(const char *v, char *why, size_t n) {
  if (v[0] == '/') return true;
  snprintf(why, n, "expected an absolute path");
  return false;
}

static bool check_checkpoint_name(const char *v, char *why, size_t n) {
  static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
  size_t len = strlen(v);
  if (len >= 1 && len <= 64 && v[0] != '.' && strspn(v, ok) == len) return true;
  snprintf(why, n, "expected a checkpoint name [A-Za-z0-9._-]{1,64} not starting with '.'");
  return false;
}

/* "host:port" with a port in 1..65535 (the last ':' ends the host, so
 * "[::1]:9464" works); "" is off. */
static bool check_listen(const char *v, char *why, size_t n) {
  if (!*v) return true;
  const char *colon = strrchr(v, ':');
  int port;
  if (colon && colon != v && parse_int(colon + 1, 1, 65535, &port)) return true;
  snprintf(why, n, "expected address:port like 127.0.0.1:9464, the port in 1..65535 (empty: off)");
  return false;
}

/* A socket that others may write to lets every user on the host connect:
 * register programs, run them, read and overwrite parameters. */
static const char *warn_world_socket(const pe_srv_config *c) {
  if (!(c->socket_mode & 0002)) return NULL;
  return "lets every user on this host connect to the daemon and use or change any model; give "
         "trainers a group instead (socket_mode = 0660, socket_group)";
}

/* --- the table ------------------------------------------------------------------- */

static const char *const log_levels[] = {"error", "warn", "info", "debug", NULL};
_Static_assert(sizeof(pe_log_level) == sizeof(int), "an enum key's field is read as an int");

/* The field's offset, refused at compile time when its C type is not the
 * key type's. */
#define FIELD(f, T) _Generic(((pe_srv_config *)0)->f, T : offsetof(pe_srv_config, f))
#define RELOAD true
#define RESTART false
#define BOOL_KEY(sec, name, f, dflt, when, text)                                             \
  {                                                                                          \
    .section = sec, .key = name, .type = PE_CFG_BOOL, .offset = FIELD(f, bool), .def = dflt, \
    .reloadable = when, .doc = text                                                          \
  }
#define INT_KEY(sec, name, f, lo, hi, dflt, when, zero, text)                            \
  {                                                                                      \
    .section = sec, .key = name, .type = PE_CFG_INT, .offset = FIELD(f, int), .min = lo, \
    .max = hi, .def = dflt, .reloadable = when, .note = zero, .doc = text                \
  }
#define SIZE_KEY(sec, name, f, lo, hi, dflt, when, zero, text)                                \
  {                                                                                           \
    .section = sec, .key = name, .type = PE_CFG_SIZE, .offset = FIELD(f, int64_t), .min = lo, \
    .max = hi, .def = dflt, .reloadable = when, .note = zero, .doc = text                     \
  }
#define MEMORY_KEY(sec, name, f, dflt, when, zero, text)                                       \
  {                                                                                            \
    .section = sec, .key = name, .type = PE_CFG_MEMORY, .offset = FIELD(f, int64_t), .min = 0, \
    .max = INT64_MAX, .def = dflt, .reloadable = when, .note = zero, .doc = text               \
  }
#define SECONDS_KEY(sec, name, f, dflt, when, zero, text)                                      \
  {                                                                                            \
    .section = sec, .key = name, .type = PE_CFG_SECONDS, .offset = FIELD(f, double), .min = 0, \
    .def = dflt, .reloadable = when, .note = zero, .doc = text                                 \
  }
#define STRING_KEY(sec, name, f, dflt, when, test, text)                                         \
  {                                                                                              \
    .section = sec, .key = name, .type = PE_CFG_STRING, .offset = FIELD(f, char *), .def = dflt, \
    .reloadable = when, .check = test, .doc = text                                               \
  }

static const pe_config_key keys[] = {
    {.section = "server",
     .key = "socket",
     .type = PE_CFG_STRING,
     .offset = FIELD(socket, char *),
     .compute_default = pe_config_default_socket,
     .reloadable = RESTART,
     .check = check_address,
     .doc = "nanomsg address of the daemon's socket (ipc:///path or tcp://host:port)"},
    {.section = "server",
     .key = "socket_mode",
     .type = PE_CFG_MODE,
     .offset = FIELD(socket_mode, unsigned),
     .max = 0777,
     .def = "0660",
     .reloadable = RESTART,
     .warn = warn_world_socket,
     .doc = "permissions of an ipc:// socket file (octal)"},
    STRING_KEY("server", "socket_group", socket_group, "", RESTART, check_group,
               "group of the socket file (empty: the daemon's group)"),
    INT_KEY("server", "request_threads", request_threads, 1, 256, "8", RESTART, NULL,
            "threads that handle the work requests (register, init, params, save, load)"),
    INT_KEY("server", "run_threads", run_threads, 0, 256, "0", RESTART,
            "0: as many as request_threads", "threads that handle Run requests"),
    {.section = "server",
     .key = "log_level",
     .type = PE_CFG_ENUM,
     .offset = FIELD(log_level, pe_log_level),
     .choices = log_levels,
     .def = "info",
     .reloadable = RELOAD,
     .doc = "the least severe messages logged"},
    STRING_KEY("runtime", "places", places, "auto", RESTART, check_places,
               "where models live by default: auto, cpu:N, sim:N or cuda:N"),
    INT_KEY("runtime", "worker_threads", worker_threads, 0, 1024, "0", RESTART,
            "0: one per cpu or cuda place, else online cores", "compute pool workers"),
    STRING_KEY("runtime", "sync", sync, "event", RESTART, check_sync,
               "cross-stream synchronisation: event or producer"),
    STRING_KEY("runtime", "cuda_graph", cuda_graph, "auto", RESTART, check_cuda_graph,
               "capture steps on cuda places as CUDA graphs: auto (once verified on a GPU), on "
               "or off"),
    STRING_KEY("runtime", "conv_algo", conv_algo, "default", RESTART, check_conv_algo,
               "convolution algorithm: default (pe's Winograd for 3x3 and 5x5 filters on AVX2, 5x5 "
               "on AVX-512, else direct), direct, gemm, winograd, auto, or time (the fastest "
               "per shape)"),
    STRING_KEY("runtime", "conv_layout", conv_layout, "blocked", RESTART, check_conv_layout,
               "activations between convolutions and pools: blocked (oneDNN's layout, no "
               "reorders between them) or plain"),
    BOOL_KEY("runtime", "flush_denormals", flush_denormals, "true", RESTART,
             "kernel threads flush denormal floats to zero"),
    BOOL_KEY("runtime", "check_finite", check_finite, "true", RELOAD,
             "a training run stops at the first step whose loss is NaN or Inf"),
    BOOL_KEY("runtime", "places_trial", places_trial, "true", RELOAD,
             "with places = auto on cpu, a new model's places and gradient strategy are the "
             "fastest of a timed trial (false: cpu:1)"),
    INT_KEY("runtime", "places_trial_steps", places_trial_steps, 1, 1000, "20", RELOAD, NULL,
            "steps the trial times per candidate, in two passes of half (the smaller median "
            "counts), each after a warm-up step"),
    SECONDS_KEY("runtime", "places_trial_time", places_trial_s, "20", RELOAD, "0: no bound",
                "seconds after which the trial starts no further candidate"),
    INT_KEY("runtime", "places_trial_batch", places_trial_batch, 1, PE_PLACES_TRIAL_MAX_BATCH, "64",
            RELOAD, NULL, "samples per trial step when the client does not say its batch"),
    {.section = "state",
     .key = "dir",
     .type = PE_CFG_STRING,
     .offset = FIELD(state_dir, char *),
     .compute_default = default_state_dir,
     .reloadable = RESTART,
     .check = check_absolute,
     .doc = "where checkpoints live (an absolute path; one daemon per dir)"},
    BOOL_KEY("state", "checkpoint_on_shutdown", checkpoint_on_shutdown, "true", RELOAD,
             "on SIGTERM and SIGINT, checkpoint every persistent model"),
    STRING_KEY("state", "shutdown_checkpoint", shutdown_checkpoint, "shutdown", RESTART,
               check_checkpoint_name,
               "that checkpoint's name; a model registered after a restart starts from it"),
    SECONDS_KEY("state", "checkpoint_interval", checkpoint_interval_s, "300", RELOAD,
                "0: no periodic checkpoints", "seconds between autosaves of the persistent models"),
    SECONDS_KEY("job", "timeout", job_timeout_s, "30", RELOAD, "0: 30",
                "seconds a job across nodes waits for its peers (rendezvous, each exchange of "
                "gradients) before it fails naming the peer"),
    STRING_KEY("job", "host", job_host, "", RESTART, NULL,
               "address this daemon's links to a job's peers listen on; empty: the address "
               "of this machine's hostname"),
    SECONDS_KEY("sessions", "ttl", session_ttl_s, "600", RELOAD, "0: sessions never expire",
                "seconds a client may stay silent before its session is dropped"),
    SIZE_KEY("limits", "max_message", max_message, 4096, INT32_MAX, "64M", RELOAD, NULL,
             "largest request the socket accepts and largest reply the daemon sends"),
    INT_KEY("limits", "max_programs", max_programs, 1, 1 << 20, "256", RELOAD, NULL,
            "programs registered at once, all clients together"),
    SIZE_KEY("limits", "memory_per_client", memory_per_client, 0, INT64_MAX, "0", RELOAD,
             "0: unlimited", "parameter bytes of the models a client has programs in"),
    INT_KEY("limits", "max_steps_per_request", max_steps_per_request, 1, INT32_MAX, "1000000",
            RELOAD, NULL, "steps (or batches) one run request may ask for"),
    INT_KEY("limits", "max_program_ops", max_program_ops, 1, INT32_MAX, "100000", RELOAD, NULL,
            "ops of one registered program, all blocks"),
    INT_KEY("limits", "max_program_vars", max_program_vars, 1, INT32_MAX, "200000", RELOAD, NULL,
            "variables of one registered program, all blocks"),
    MEMORY_KEY("limits", "memory_per_run", memory_per_run, "50%", RELOAD, "0: unlimited",
               "temporary memory of one run step"),
    MEMORY_KEY("limits", "memory_runs_total", memory_runs_total, "75%", RELOAD, "0: unlimited",
               "the temporaries of all runs in flight together"),
    MEMORY_KEY("limits", "memory_total", memory_total, "75%", RELOAD, "0: unlimited",
               "the daemon's budget for models and runs together"),
    MEMORY_KEY("limits", "memory_kept_per_program", memory_kept_per_program, "256M", RELOAD,
               "0: keep none", "temporaries a program keeps between requests"),
    SIZE_KEY("limits", "memory_per_request", memory_per_request, 0, INT64_MAX, "0", RELOAD,
             "0: twice max_message plus 16M", "what decoding one request may allocate"),
    MEMORY_KEY("limits", "memory_requests_total", memory_requests_total, "25%", RELOAD,
               "0: unlimited", "what all requests being decoded or handled may allocate"),
    INT_KEY("limits", "dedup_entries", dedup_entries, 1, 1 << 24, "4096", RELOAD, NULL,
            "replies kept for resent requests"),
    SIZE_KEY("limits", "dedup_bytes", dedup_bytes, 4096, INT64_MAX, "256M", RELOAD, NULL,
             "bytes of the replies kept for resent requests"),
    STRING_KEY("metrics", "listen", metrics_listen, "", RESTART, check_listen,
               "address:port of the Prometheus metrics endpoint (e.g. 127.0.0.1:9464); empty: "
               "off"),
};

#define N_KEYS (sizeof keys / sizeof keys[0])

const pe_config_key *pe_config_keys(size_t *n) {
  *n = N_KEYS;
  return keys;
}

const pe_config_key *pe_config_key_find(const char *section, const char *key) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (!strcmp(keys[i].section, section) && !strcmp(keys[i].key, key)) return &keys[i];
  return NULL;
}

/* --- values ---------------------------------------------------------------------- */

/* A key's value, parsed but not yet stored (a bad value leaves c as it was). */
typedef union value {
  bool b;
  int i;
  int64_t z;
  double d;
  unsigned u;
  char *s;
} value;

static void *field(const pe_config_key *k, pe_srv_config *c) {
  return (char *)c + k->offset;
}
static const void *cfield(const pe_config_key *k, const pe_srv_config *c) {
  return (const char *)c + k->offset;
}

/* The size of the field of a key of type t. */
static size_t field_size(pe_config_type t) {
  switch (t) {
    case PE_CFG_BOOL: return sizeof(bool);
    case PE_CFG_INT:
    case PE_CFG_ENUM: return sizeof(int);
    case PE_CFG_SIZE:
    case PE_CFG_MEMORY: return sizeof(int64_t);
    case PE_CFG_SECONDS: return sizeof(double);
    case PE_CFG_MODE: return sizeof(unsigned);
    case PE_CFG_STRING: return sizeof(char *);
  }
  return 0;
}

/* 4096 -> "4K", 2147483647 -> "2G-1", 1000 -> "1000". */
static void format_size(int64_t v, char *buf, size_t len) {
  static const struct {
    int64_t unit;
    char suffix;
  } units[] = {{1LL << 30, 'G'}, {1LL << 20, 'M'}, {1LL << 10, 'K'}};
  for (int i = 0; i < 3; i++)
    if (v > 0 && v % units[i].unit == 0) {
      snprintf(buf, len, "%lld%c", (long long)(v / units[i].unit), units[i].suffix);
      return;
    }
  for (int i = 0; i < 3; i++)
    if (v < INT64_MAX && (v + 1) % units[i].unit == 0) {
      snprintf(buf, len, "%lld%c-1", (long long)((v + 1) / units[i].unit), units[i].suffix);
      return;
    }
  snprintf(buf, len, "%lld", (long long)v);
}

/* "LO..HI", "LO.." (no upper bound) or "" (none at all) for an INT or SIZE key. */
static void format_range(const pe_config_key *k, char *buf, size_t len) {
  char lo[32], hi[32];
  bool size = k->type == PE_CFG_SIZE;
  if (size) {
    format_size(k->min, lo, sizeof lo);
    format_size(k->max, hi, sizeof hi);
  } else {
    snprintf(lo, sizeof lo, "%lld", (long long)k->min);
    snprintf(hi, sizeof hi, "%lld", (long long)k->max);
  }
  if (size && k->max == INT64_MAX)
    snprintf(buf, len, k->min ? "%s.." : "", lo);
  else
    snprintf(buf, len, "%s..%s", lo, hi);
}

void pe_config_key_type(const pe_config_key *k, char *buf, size_t len) {
  char range[80];
  switch (k->type) {
    case PE_CFG_BOOL: snprintf(buf, len, "bool"); break;
    case PE_CFG_INT:
    case PE_CFG_SIZE:
      format_range(k, range, sizeof range);
      snprintf(buf, len, *range ? "%s[%s]" : "%s", k->type == PE_CFG_INT ? "int" : "size", range);
      break;
    case PE_CFG_MEMORY: snprintf(buf, len, "size-or-percent"); break;
    case PE_CFG_SECONDS: snprintf(buf, len, "seconds[%lld..]", (long long)k->min); break;
    case PE_CFG_STRING: snprintf(buf, len, "string"); break;
    case PE_CFG_MODE: snprintf(buf, len, "octal-mode[..%04llo]", (long long)k->max); break;
    case PE_CFG_ENUM: {
      size_t n = (size_t)snprintf(buf, len, "enum[");
      for (int i = 0; k->choices[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "|" : "", k->choices[i]);
      if (n < len) snprintf(buf + n, len - n, "]");
      break;
    }
  }
}

/* What a value of k looks like, for the error that refuses one. */
static void expected(const pe_config_key *k, char *buf, size_t len) {
  char lo[32], hi[32];
  const char *aside = NULL; /* a note on the syntax, before the key's own */
  size_t n = 0;
  switch (k->type) {
    case PE_CFG_BOOL: n = (size_t)snprintf(buf, len, "expected true or false"); break;
    case PE_CFG_INT:
      n = (size_t)snprintf(buf, len, "expected an integer in %lld..%lld", (long long)k->min,
                           (long long)k->max);
      break;
    case PE_CFG_SIZE:
      format_size(k->min, lo, sizeof lo);
      format_size(k->max, hi, sizeof hi);
      if (k->max != INT64_MAX)
        n = (size_t)snprintf(buf, len, "expected a size in %s..%s", lo, hi);
      else if (k->min)
        n = (size_t)snprintf(buf, len, "expected a size >= %s", lo);
      else
        n = (size_t)snprintf(buf, len, "expected a size");
      aside = "suffixes K, M, G";
      break;
    case PE_CFG_MEMORY:
      n = (size_t)snprintf(buf, len,
                           "expected a size, or a share of the host's memory in 1%%..100%% like "
                           "50%%");
      aside = "suffixes K, M, G";
      break;
    case PE_CFG_SECONDS:
      n = (size_t)snprintf(buf, len, "expected seconds >= %lld", (long long)k->min);
      break;
    case PE_CFG_MODE:
      n = (size_t)snprintf(buf, len, "expected an octal mode like 0660, at most %04llo",
                           (long long)k->max);
      break;
    case PE_CFG_ENUM:
      n = (size_t)snprintf(buf, len, "expected");
      for (int i = 0; k->choices[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s",
                              i == 0              ? " "
                              : k->choices[i + 1] ? ", "
                                                  : " or ",
                              k->choices[i]);
      break;
    case PE_CFG_STRING: n = (size_t)snprintf(buf, len, "not accepted"); break;
  }
  if (n < len && (aside || k->note))
    snprintf(buf + n, len - n, " (%s%s%s)", aside ? aside : "", aside && k->note ? "; " : "",
             k->note ? k->note : "");
}

/* Parse text as k's value into v; false with why when it is not one. */
static bool parse_value(const pe_config_key *k, const char *text, value *v, char *why,
                        size_t why_len) {
  bool ok = false;
  switch (k->type) {
    case PE_CFG_BOOL: ok = parse_bool(text, &v->b); break;
    case PE_CFG_INT: ok = parse_int(text, (long)k->min, (long)k->max, &v->i); break;
    case PE_CFG_SIZE:
      ok = pe_config_parse_size(text, &v->z) && v->z >= k->min && v->z <= k->max;
      break;
    case PE_CFG_MEMORY: ok = parse_memory(text, &v->z); break;
    case PE_CFG_SECONDS: ok = parse_seconds(text, (double)k->min, &v->d); break;
    case PE_CFG_MODE: {
      char *end;
      errno = 0;
      unsigned long m = strtoul(text, &end, 8);
      ok = !errno && !*end && *text && m <= (unsigned long)k->max;
      v->u = (unsigned)m;
      break;
    }
    case PE_CFG_ENUM:
      for (int i = 0; k->choices[i] && !ok; i++)
        if (!strcasecmp(text, k->choices[i])) {
          v->i = i;
          ok = true;
        }
      break;
    case PE_CFG_STRING:
      if (k->check && !k->check(text, why, why_len)) return false;
      if (!(v->s = strdup(text))) {
        snprintf(why, why_len, "out of memory");
        return false;
      }
      return true;
  }
  if (!ok) expected(k, why, why_len);
  return ok;
}

/* Store v into k's field of c (a string's old value is freed, v's taken). */
static void store(const pe_config_key *k, pe_srv_config *c, value v) {
  void *p = field(k, c);
  switch (k->type) {
    case PE_CFG_BOOL: *(bool *)p = v.b; break;
    case PE_CFG_INT:
    case PE_CFG_ENUM: *(int *)p = v.i; break;
    case PE_CFG_SIZE:
    case PE_CFG_MEMORY: *(int64_t *)p = v.z; break;
    case PE_CFG_SECONDS: *(double *)p = v.d; break;
    case PE_CFG_MODE: *(unsigned *)p = v.u; break;
    case PE_CFG_STRING:
      free(*(char **)p);
      *(char **)p = v.s;
      break;
  }
}

void pe_config_key_value(const pe_config_key *k, const pe_srv_config *c, bool quote, char *buf,
                         size_t len) {
  const void *p = cfield(k, c);
  switch (k->type) {
    case PE_CFG_BOOL: snprintf(buf, len, "%s", *(const bool *)p ? "true" : "false"); break;
    case PE_CFG_INT: snprintf(buf, len, "%d", *(const int *)p); break;
    case PE_CFG_SIZE:
    case PE_CFG_MEMORY: snprintf(buf, len, "%lld", (long long)*(const int64_t *)p); break;
    case PE_CFG_SECONDS: snprintf(buf, len, "%.17g", *(const double *)p); break;
    case PE_CFG_MODE: snprintf(buf, len, "%04o", *(const unsigned *)p); break;
    case PE_CFG_ENUM: {
      int i = *(const int *)p, n = 0;
      while (k->choices[n]) n++;
      snprintf(buf, len, "%s", i >= 0 && i < n ? k->choices[i] : "?");
      break;
    }
    case PE_CFG_STRING: {
      const char *s = *(char *const *)p;
      snprintf(buf, len, quote ? "'%.200s'" : "%.200s", s ? s : "");
      break;
    }
  }
}

/* --- the configuration ------------------------------------------------------------- */

#define BAD(k, v, why) \
  pe_error(PE_EINVAL, "config [%s] %s = '%.200s': %s", (k)->section, (k)->key, v, why)

/* The sections, for the error naming an unknown one. */
static pe_status *unknown_section(const char *section) {
  char list[256] = "";
  size_t n = 0;
  for (size_t i = 0; i < N_KEYS && n < sizeof list; i++)
    if (i == 0 || strcmp(keys[i].section, keys[i - 1].section))
      n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", keys[i].section);
  return pe_error(PE_EINVAL, "config: unknown section [%.64s] (%s)", section, list);
}

pe_status *pe_config_set(pe_srv_config *c, const char *section, const char *key,
                         const char *value) {
  const pe_config_key *k = pe_config_key_find(section, key);
  if (!k) {
    for (size_t i = 0; i < N_KEYS; i++)
      if (!strcmp(keys[i].section, section))
        return pe_error(PE_EINVAL, "config [%s]: unknown key '%.64s'", section, key);
    return unknown_section(section);
  }
  union value v;
  char why[256];
  if (!parse_value(k, value, &v, why, sizeof why)) return BAD(k, value, why);
  store(k, c, v);
  return NULL;
}

pe_status *pe_config_defaults(pe_srv_config *c) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < N_KEYS; i++) {
    const pe_config_key *k = &keys[i];
    pe_status *st = NULL;
    if (k->def) {
      st = pe_status_wrap(pe_config_set(c, k->section, k->key, k->def), "embedded defaults");
    } else {
      /* Not through the setter: a file may still replace a value the
       * environment made unusable (pe_config_check tells). */
      value v = {.s = k->compute_default()};
      if (v.s)
        store(k, c, v);
      else
        st = pe_error(PE_ENOMEM, "config: out of memory for defaults");
    }
    if (st) {
      pe_config_free(c);
      return st;
    }
  }
  return NULL;
}

void pe_config_free(pe_srv_config *c) {
  if (!c) return;
  for (size_t i = 0; i < N_KEYS; i++)
    if (keys[i].type == PE_CFG_STRING) free(*(char **)field(&keys[i], c));
  memset(c, 0, sizeof *c);
}

pe_status *pe_config_check(const pe_srv_config *c) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const pe_config_key *k = &keys[i];
    if (k->type != PE_CFG_STRING) continue;
    const char *s = *(char *const *)cfield(k, c);
    char why[256];
    if (!s) return pe_error(PE_EINVAL, "config [%s] %s: not set", k->section, k->key);
    if (k->check && !k->check(s, why, sizeof why)) return BAD(k, s, why);
  }
  return NULL;
}

void pe_config_reloadable_apply(pe_srv_config *dst, const pe_srv_config *src) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const pe_config_key *k = &keys[i];
    if (!k->reloadable) continue;
    value v;
    if (k->type == PE_CFG_STRING) {
      if (!(v.s = strdup(*(char *const *)cfield(k, src)))) {
        PE_LOGW("SIGHUP: out of memory for [%s] %s; it keeps its value", k->section, k->key);
        continue;
      }
      store(k, dst, v);
    } else {
      memcpy(field(k, dst), cfield(k, src), field_size(k->type));
    }
  }
}

char *pe_config_restart_changes(const pe_srv_config *cur, const pe_srv_config *next) {
  char out[4096] = "";
  size_t n = 0;
  for (size_t i = 0; i < N_KEYS; i++) {
    const pe_config_key *k = &keys[i];
    if (k->reloadable) continue;
    char a[256], b[256];
    pe_config_key_value(k, cur, true, a, sizeof a);
    pe_config_key_value(k, next, true, b, sizeof b);
    if (!strcmp(a, b)) continue;
    int w = snprintf(out + n, sizeof out - n, "%s[%s] %s %s -> %s", n ? ", " : "", k->section,
                     k->key, a, b);
    if (w > 0) n += (size_t)w < sizeof out - n ? (size_t)w : sizeof out - n - 1;
  }
  return n ? strdup(out) : NULL;
}

pe_status *pe_config_print_keys(FILE *f) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const pe_config_key *k = &keys[i];
    char type[128];
    pe_config_key_type(k, type, sizeof type);
    char *computed = k->def ? NULL : k->compute_default();
    if (!k->def && !computed) return pe_error(PE_ENOMEM, "config: out of memory for defaults");
    fprintf(f, "%s\t%s\t%s\t%s\t%s\t%s", k->section, k->key, type, k->def ? k->def : computed,
            k->reloadable ? "reload" : "restart", k->doc);
    if (k->note) fprintf(f, " (%s)", k->note);
    fputc('\n', f);
    free(computed);
  }
  return NULL;
}
