/* pe-client internals: the command table, option tables, and helpers the
 * command files share (connect, model resolution, JSON output).
 *
 * Every command is a row {name, group summary, handler}; every command's
 * options are rows {name, kind, offset into the command's struct, bounds,
 * help}. Adding a command is a row and a handler. */
#ifndef PE_CLI_H
#define PE_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "json_out.h"
#include "pe_client.h"
#include "pe_models.h"

/* Exit statuses. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2, CLI_UNREACHABLE = 3 };

/* Global options (accepted before or after the command). */
typedef struct cli_ctx {
  const char *socket; /* --socket, else $PE_SOCKET, else the default */
  bool json;          /* one JSON object on stdout (the last line) */
  long timeout_ms;    /* --timeout; 0: library default */
  const char *cmd;    /* the command's name, for messages */
} cli_ctx;

typedef enum cli_opt_kind { CLI_STR, CLI_INT, CLI_FLAG, CLI_FLOAT } cli_opt_kind;

typedef struct cli_opt {
  const char *name;
  cli_opt_kind kind;
  size_t off;    /* into the command's option struct: const char *, long, bool or double */
  long min, max; /* CLI_INT and CLI_FLOAT: the accepted range */
  const char *help;
} cli_opt;

typedef struct cli_cmd {
  const char *name;
  const char *args; /* usage summary */
  const char *help;
  int (*fn)(cli_ctx *ctx, int argc, char **argv);
} cli_cmd;

/* The command rows of each group (one file per group). */
extern const cli_cmd cli_cmds_daemon[]; /* ping, status, deregister */
extern const cli_cmd cli_cmds_state[];  /* register, save, load, drop-model */
extern const cli_cmd cli_cmds_run[];    /* run, trace */
extern const cli_cmd cli_cmds_train[];  /* train, eval */
extern const cli_cmd cli_cmds_params[]; /* export, import */

/* Set model's variables from the file at path (cmd_params.c): those that
 * take(name, arg) accepts (take NULL: all), in one set_params; *n_set and
 * *n_skipped count them, *bytes their values. Prints the error. */
int cli_params_import(const cli_ctx *ctx, pe_client *c, const char *model, const char *path,
                      bool (*take)(const char *name, void *arg), void *arg, size_t *n_set,
                      size_t *n_skipped, uint64_t *bytes);

/* Parse argv[1..] against opts into cfg. Prints a usage message (and the
 * table) on stderr and returns CLI_USAGE on bad input; *help is set for
 * --help (the table on stdout, CLI_OK). */
int cli_parse(const cli_ctx *ctx, const cli_opt *opts, size_t n_opts, int argc, char **argv,
              void *cfg, bool *help);
void cli_print_opts(FILE *f, const cli_ctx *ctx, const cli_opt *opts, size_t n_opts);

/* Connect per ctx; on failure print the error and return NULL
 * (*rc = CLI_UNREACHABLE). */
pe_client *cli_connect(const cli_ctx *ctx, int *rc);
/* The same with options (address and timeout still come from ctx). */
pe_client *cli_connect_with(const cli_ctx *ctx, pe_client_opts o, int *rc);
/* For register, run and trace, whose programs are meant for the commands
 * after them: the session outlives the process (opts.outlive_process) and
 * lasts until the daemon's session TTL. */
pe_client *cli_connect_lasting(const cli_ctx *ctx, int *rc);
/* What their --help says about it. */
extern const char cli_lasting_note[];
/* The command is done with the daemon: end its session (pe_client_close,
 * at most 5 s) and free c (may be NULL). The daemon then drops what the
 * session registered at once instead of after its TTL, and does not count
 * it among its clients. Skipped when rc is CLI_UNREACHABLE (no wait on a
 * daemon that does not answer). A failed close only warns: the TTL ends
 * the session. register, run and trace only free (cli_connect_lasting). */
void cli_end(const cli_ctx *ctx, pe_client *c, int rc);
/* Errors: each prints "pe-client CMD: <message>" on stderr and returns the
 * exit status; the command's first error is also what the --json failure
 * line says (cli_finish). */
/* A failed library call: "<error> (CODE)", CLI_UNREACHABLE for a timeout,
 * no connection or a daemon that shut down, else CLI_FAIL. */
int cli_fail(const cli_ctx *ctx, pe_client *c, int code);
/* The same after "what: " (the step, the part of the command). */
int cli_fail_at(const cli_ctx *ctx, pe_client *c, int code, const char *what);
/* Anything else that failed: CLI_FAIL. */
int cli_error(const cli_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Bad usage (options, their values, their combination): CLI_USAGE. */
int cli_usage(const cli_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --json: a command's object starts {"cmd":"NAME","ok":true (the command
 * prints the rest). */
void cli_json_begin(const cli_ctx *ctx);
/* After the command (main): with --json and rc not CLI_OK, the failure
 * line {"cmd":"NAME","ok":false,"error":"...","code":"..."}; code is the
 * daemon's or libpeclient's code name, USAGE or FAILED. */
void cli_finish(const cli_ctx *ctx, int rc);

/* The epochs a model has been trained by pe-client train (int64 [1]): a
 * persistable every training program of pe-client declares (0 from its
 * startup), which train sets at each epoch's end, so the next train
 * continues the data order. The model keeps it (checkpoints, the restart,
 * export and import). */
#define CLI_EPOCHS_DONE "trainer.epochs_done"

/* mlp | cnn (built in) | a model file (a path, or any name that is an
 * existing file); a training program (one with an optimizer) declares
 * CLI_EPOCHS_DONE. Prints the error and returns -1 on failure. */
int cli_model_load(const cli_ctx *ctx, const char *spec, pe_model_spec *out);

/* Register m under model namespace ns: the training program, or with
 * for_test the evaluation program. The fetch names a trainer uses are kept
 * fetchable. Prints the error on failure (returns the exit status). */
/* How the daemon compiles the program across its places (the register
 * options of pe_client_register_args); NULL/0 fields: the daemon's. Commands
 * that register embed one and list CLI_GRAPH_OPTS in their option table. */
typedef struct cli_graph_opts {
  const char *strategy, *sync;
  const char *cuda_graph; /* --cuda-graph auto|on|off (the daemon's) */
  bool fuse;
  long fuse_bucket;
  const char *keep;  /* --keep A,B: more names kept fetchable (CLI_KEEP_OPTS) */
  bool no_op_fusion; /* --no-op-fusion */
} cli_graph_opts;

#define CLI_GRAPH_OPTS(T, f)                                                                       \
  {"strategy", CLI_STR, offsetof(T, f.strategy), 0, 0, "auto (default)|allreduce|reduce|sharded"}, \
      {"sync", CLI_STR, offsetof(T, f.sync), 0, 0, "event | producer (daemon's)"},                 \
      {"cuda-graph", CLI_STR, offsetof(T, f.cuda_graph), 0, 0, "auto | on | off (daemon's)"},      \
      {"fuse", CLI_FLAG, offsetof(T, f.fuse), 0, 0, "fuse gradient all-reduces into buckets"}, {   \
    "fuse-bucket", CLI_INT, offsetof(T, f.fuse_bucket), 1, 1L << 40, "bucket bytes (4 MiB)"        \
  }

/* register, run and trace: what lets a fetch see a builder intermediate
 * (fc_0.tmp_0) that op fusion or buffer reuse would otherwise remove. */
// clang-format off
#define CLI_KEEP_OPTS(T, f)                                                                      \
  {"keep", CLI_STR, offsetof(T, f.keep), 0, 0,                                                   \
   "NAME[,NAME]: also keep these fetchable (not fused away, buffer not reused)"},                \
  {"no-op-fusion", CLI_FLAG, offsetof(T, f.no_op_fusion), 0, 0,                                  \
   "keep conv2d / matmul + bias add + relu as separate ops"}
// clang-format on

typedef struct cli_reg {
  const char *ns, *places;
  long seed;
  long batch; /* the batch fed (places = auto's trial times it); 0: unknown */
  bool for_test, persistent;
  const cli_graph_opts *graph; /* NULL: the daemon's defaults */
  /* A job across nodes (pe_client_register_args.job...); job NULL: none. */
  const char *job, *rendezvous, *job_token;
  int world, rank;
} cli_reg;
int cli_register(const cli_ctx *ctx, pe_client *c, const pe_model_spec *m, const cli_reg *r,
                 pe_client_program *out);
/* How places = auto chose a model's places, as a JSON object onto f:
 * places, strategy, fused, remembered, batch, trial_seconds, candidates
 * (places, strategy, fused, step_ms: null when not measured, error). */
void cli_json_places_trial(FILE *f, const pe_client_places_trial *t);
/* The same, one line of text ("places: cpu:2 sharded, timed: ...") onto f. */
void cli_print_places_trial(FILE *f, const pe_client_places_trial *t);

/* Fashion-MNIST, standardised with the training split's mean/std (as
 * pe-bench does); limit > 0 keeps the first `limit` examples of each split.
 * test may be NULL (training split only). m's image input must take the
 * images (pe_dataset_check_input). Prints the error on failure. */
struct pe_dataset;
int cli_data_load(const cli_ctx *ctx, const pe_model_spec *m, const char *dir, long limit,
                  struct pe_dataset **train, struct pe_dataset **test);

/* --data FILE rather than a Fashion-MNIST directory: a name ending in
 * .npz, .csv or .txt (data_load.c). */
bool cli_data_is_file(const char *data);
/* The rows of the user's file as m's input and label feeds (*xf, *yf as
 * the program declares them): an .npz's arrays named after the feeds, a
 * CSV's columns (label_column NULL: the last), a text file's training
 * windows; limit > 0 keeps the first `limit` rows. Prints the error (the
 * file, the array or column, both shapes; model names the model in a
 * feed's error) on failure. */
struct pe_feed_decl;
struct pe_feed_data;
int cli_data_file_rows(const cli_ctx *ctx, const pe_model_spec *m, const char *model,
                       const char *path, const char *label_column, long limit,
                       struct pe_feed_decl *xf, struct pe_feed_decl *yf, struct pe_feed_data **out);

/* The image feed [n, dims of m...] and label feed [n, 1] over x and y. */
void cli_batch_feeds(const pe_model_spec *m, int n, const float *x, const int64_t *y,
                     pe_client_tensor feeds[2]);

/* "0x%016llx" handle text and its parse (hex or decimal). */
void cli_handle_str(uint64_t h, char buf[24]);
int cli_handle_parse(const char *s, uint64_t *out);

double cli_now(void); /* monotonic seconds */

#endif
