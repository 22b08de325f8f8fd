/* pe-executord configuration: embedded defaults, then the INI file
 * (libinih), then command-line overrides, each layer through the same
 * setter, so a key means the same thing everywhere.
 *
 * One table (config_keys.c, pe_config_keys) holds every key: its section,
 * name, type and bounds, default, whether a SIGHUP reload applies it, its
 * field in pe_srv_config and a line of documentation. The defaults, the
 * setter, the reload (pe_config_reloadable_apply) and the restart warning
 * (pe_config_restart_changes) all read it; `pe-executord --config-keys`
 * prints it, and tests/install/test_man_pages.sh checks
 * conf/pe-executord.conf and pe-executord.conf(5) against that. A reload
 * builds the config the way the start did (pe_config_build), so the command
 * line still wins over the file.
 *
 * Ownership: a pe_srv_config owns its strings; pe_config_free releases them.
 * Not thread-safe: the main thread builds it; request threads read the
 * reloadable fields through the server's copy under its lock. */
#ifndef PE_SERVER_CONFIG_H
#define PE_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
  char *cuda_graph;   /* "auto" | "on" | "off" (engine/step_graph_key.h) */
  char *conv_layout;  /* "blocked" | "plain" (ops/cpu/dnnl_act_layout.h) */
  char *conv_algo; /* "default" | "time" | "direct" | "gemm" | "winograd" | "auto" (conv_algo.h) */
  /* Kernel threads flush denormals to zero (core/fpenv.h). */
  bool flush_denormals;
  /* A training run stops at a non-finite loss (run/finite.h); reloadable. */
  bool check_finite;
  /* places = auto on cpu: a register of a new model times candidate places
   * and strategies (server/places_trial.h); reloadable, read under cfg_mu. */
  bool places_trial;
  int places_trial_steps; /* timed steps per candidate, after one warm-up */
  double places_trial_s;  /* the trial's budget: no candidate starts after it */
  int places_trial_batch; /* samples per step when the register gives none */
  /* [state] */
  char *state_dir; /* checkpoints live under it */
  bool checkpoint_on_shutdown;
  char *shutdown_checkpoint; /* name used for persistent models on SIGTERM */
  /* Seconds between autosaves of the persistent models (0: off). */
  double checkpoint_interval_s;
  /* [job] jobs across nodes (server/job/) */
  double job_timeout_s; /* rendezvous and each exchange; 0: 30 */
  char *job_host;       /* address the job's links listen on; "": the hostname's */
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
  /* [metrics] */
  char *metrics_listen; /* "address:port" of the Prometheus endpoint; "": off */
} pe_srv_config;

/* A key's type: how its value is written and which C type its field has. */
typedef enum pe_config_type {
  PE_CFG_BOOL,    /* bool: true, yes, on, 1 / false, no, off, 0 */
  PE_CFG_INT,     /* int in min..max */
  PE_CFG_SIZE,    /* int64_t bytes in min..max; K, M, G suffixes (powers of 1024) */
  PE_CFG_MEMORY,  /* int64_t: a size, or N% (1..100) of the host's memory (host_memory.h) */
  PE_CFG_SECONDS, /* double >= min, fractions allowed */
  PE_CFG_STRING,  /* char * (owned), accepted by the key's check */
  PE_CFG_ENUM,    /* an enum: the index of one of choices (any case) */
  PE_CFG_MODE,    /* unsigned: an octal file mode up to max */
} pe_config_type;

/* One key of the table. */
typedef struct pe_config_key {
  const char *section, *key;
  pe_config_type type;
  int64_t min, max; /* INT, SIZE; SECONDS uses min, MODE max */
  /* The default in the file's syntax; NULL: compute_default gives it
   * (malloc'd; it depends on the user and the environment). */
  const char *def;
  char *(*compute_default)(void);
  bool reloadable;            /* SIGHUP applies it; else a change needs a restart */
  size_t offset;              /* of its field in pe_srv_config */
  const char *const *choices; /* ENUM: the names, NULL-terminated */
  /* STRING: whether value is acceptable; if not, why (in why). */
  bool (*check)(const char *value, char *why, size_t why_len);
  /* Something to warn about once c holds a value read from a file, or NULL. */
  const char *(*warn)(const pe_srv_config *c);
  const char *note; /* what a special value means ("0: unlimited"), or NULL */
  const char *doc;  /* one line */
} pe_config_key;

/* The table, in the order conf/pe-executord.conf documents the keys. */
const pe_config_key *pe_config_keys(size_t *n);
/* The key [section] key; NULL when there is none. */
const pe_config_key *pe_config_key_find(const char *section, const char *key);
/* "int[1..256]", "size[4K..2G-1]", "enum[error|warn|info|debug]", ... */
void pe_config_key_type(const pe_config_key *k, char *buf, size_t len);
/* The key's value in c as text, strings 'quoted' when quote. */
void pe_config_key_value(const pe_config_key *k, const pe_srv_config *c, bool quote, char *buf,
                         size_t len);
/* One line per key, tab-separated: section, key, type, default,
 * "reload" or "restart", doc. */
pe_status *pe_config_print_keys(FILE *f);

/* The embedded defaults (socket from $XDG_RUNTIME_DIR, or /run as root). */
pe_status *pe_config_defaults(pe_srv_config *c);
void pe_config_free(pe_srv_config *c);
/* Set one key; errors name section, key, value and the bound or syntax
 * expected. On error c is unchanged. */
pe_status *pe_config_set(pe_srv_config *c, const char *section, const char *key, const char *value);
/* Read an INI file on top of c; errors name the file and the line. */
pe_status *pe_config_load_file(pe_srv_config *c, const char *path);
/* The same from a string (tests, embedded defaults); `what` names it in errors. */
pe_status *pe_config_load_string(pe_srv_config *c, const char *text, const char *what);
/* After all layers: every string key holds a value its check accepts (the
 * socket and state dir come from the environment, not the setter). */
pe_status *pe_config_check(const pe_srv_config *c);
/* Copy the fields of the reloadable keys of src into dst. */
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
