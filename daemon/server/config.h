/* pe-executord configuration: embedded defaults, then the INI file
 * (libinih), then command-line overrides, each layer through the same
 * setter, so a key means the same thing everywhere. conf/pe-executord.conf
 * documents every key.
 *
 * Reloadable on SIGHUP (pe_config_reloadable_apply): log level, session TTL,
 * max message, max programs, memory per client, max steps per request,
 * max program ops and vars, memory per run, runs total and total, memory
 * per request and of all requests, checkpoint_on_shutdown,
 * checkpoint interval, reply cache sizes, check_finite.
 * Everything else (socket, places, worker threads, state dir, ...:
 * pe_config_restart_changes) needs a restart. A reload builds the config
 * the way the start did (pe_config_build), so the command line still wins
 * over the file.
 *
 * Ownership: a pe_srv_config owns its strings; pe_config_free releases them.
 * Not thread-safe: the main thread builds it; request threads read the
 * reloadable fields through the server's copy under its lock. */
#ifndef PE_SERVER_CONFIG_H
#define PE_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/log.h"
#include "core/status.h"

typedef struct pe_srv_config {
  /* [server] */
  char *socket;         /* nanomsg address, "ipc:///run/pe-executord/pe-executord.sock" */
  unsigned socket_mode; /* chmod of an ipc socket after bind (0660) */
  char *socket_group;   /* chgrp of an ipc socket ("" : leave as is) */
  int request_threads;  /* the work lane's request threads (lanes.h) */
  int run_threads;      /* the run lane's; 0: as many as request_threads */
  pe_log_level log_level;
  /* [runtime] */
  char *places;       /* "auto" | "cpu:N" | "sim:N" | "cuda:N" */
  int worker_threads; /* compute pool workers; 0: online cores */
  char *sync;         /* "event" | "producer" */
  /* Kernel threads flush denormals to zero (core/fpenv.h). */
  bool flush_denormals;
  /* A training run stops at a non-finite loss (run/finite.h); reloadable. */
  bool check_finite;
  /* [state] */
  char *state_dir; /* checkpoints live under it */
  bool checkpoint_on_shutdown;
  char *shutdown_checkpoint; /* name used for persistent models on SIGTERM */
  /* Seconds between autosaves of the persistent models (0: off). */
  double checkpoint_interval_s;
  /* [sessions] */
  double session_ttl_s; /* idle client reclaimed after this; 0: never */
  /* [limits] */
  int64_t max_message;       /* NN_RCVMAXSIZE, bytes */
  int max_programs;          /* registered programs, all clients */
  int64_t memory_per_client; /* parameter bytes of a client's models; 0: unlimited */
  int max_steps_per_request; /* RunRequest steps or batches; more is refused */
  int max_program_ops;       /* ops of a registered program, all blocks */
  int max_program_vars;      /* its variables, all blocks */
  int64_t memory_per_run;    /* a run step's planned temporaries, bytes; 0: unlimited */
  int64_t memory_runs_total; /* those of all runs in flight together; 0: unlimited */
  /* The daemon's budget for models and runs together (run/budget.h); 0: unlimited. */
  int64_t memory_total;
  int64_t memory_kept_per_program; /* temporaries a program keeps between runs; 0: none */
  /* What decoding one request may allocate (decode_budget.h); 0: twice
   * max_message plus 16M. */
  int64_t memory_per_request;
  int64_t memory_requests_total; /* all decoded requests together; 0: unlimited */
  int dedup_entries;             /* replies kept for resends */
  int64_t dedup_bytes;
} pe_srv_config;

/* The embedded defaults (socket from $XDG_RUNTIME_DIR, or /run as root). */
pe_status *pe_config_defaults(pe_srv_config *c);
void pe_config_free(pe_srv_config *c);
/* Set one key; errors name section, key and value. */
pe_status *pe_config_set(pe_srv_config *c, const char *section, const char *key, const char *value);
/* Read an INI file on top of c; errors name the file and the line. */
pe_status *pe_config_load_file(pe_srv_config *c, const char *path);
/* The same from a string (tests, embedded defaults); `what` names it in errors. */
pe_status *pe_config_load_string(pe_srv_config *c, const char *text, const char *what);
/* Cross-key checks after all layers (e.g. places parse). */
pe_status *pe_config_check(const pe_srv_config *c);
/* Copy the reloadable fields of src into dst. */
void pe_config_reloadable_apply(pe_srv_config *dst, const pe_srv_config *src);

/* One command-line option: a key set after the file. Strings borrowed
 * (argv and literals, which outlive the daemon's config). */
typedef struct pe_config_override {
  const char *section, *key, *value;
} pe_config_override;

/* All layers: defaults, the file at path (NULL: none), the overrides
 * (errors say "command line"), pe_config_check. At start and on SIGHUP.
 * On error c holds nothing to free. */
pe_status *pe_config_build(pe_srv_config *c, const char *path, const pe_config_override *ov,
                           int n_ov);
/* The keys that need a restart and differ between cur and next, each with
 * both values ("[runtime] places 'auto' -> 'cpu:2'", comma-separated;
 * malloc'd), or NULL when none differs. */
char *pe_config_restart_changes(const pe_srv_config *cur, const pe_srv_config *next);

/* "64M", "1G", "4096" -> bytes. */
bool pe_config_parse_size(const char *s, int64_t *out);
/* The default socket address for this user (malloc'd). */
char *pe_config_default_socket(void);

#endif
