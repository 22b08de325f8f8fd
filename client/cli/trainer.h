/* pe-client train and eval's trainer: its options, state and result,
 * shared by cmd_train.c (options, set-up, result, the commands) and
 * train_steps.c (the step loop and the evaluation). One thread; everything
 * is released by trainer_free (cmd_train.c). */
#ifndef PE_CLI_TRAINER_H
#define PE_CLI_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "pe_dataset.h"
#include "pe_feed_data.h"
#include "train_log.h"

#define EVAL_BATCH 500

/* The recipe flags; unset: the model's. */
typedef struct recipe_cfg {
  const char *optimizer, *schedule;
  double lr, momentum, weight_decay, clip_norm, min_lr; /* lr .. clip_norm -1: unset */
  long warmup_epochs;
  bool no_decay_1d;
} recipe_cfg;

/* Steps per request when --steps-per-request is not given: the start of
 * a grown request, and the size of all where requests do not grow. */
#define TRAIN_REQUEST_STEPS 16
/* A grown request's steps: enough for TRAIN_REQUEST_MS of steps, at most
 * TRAIN_REQUEST_MAX_STEPS. Why: each request costs about 0.2-0.3 ms of
 * round trip (the socket, the daemon's set-up and reply, the client's
 * answer) while the daemon's workers wait; 16 steps of a 0.4 ms step
 * lose 5 % to it, 100 ms of steps 0.3 %. */
#define TRAIN_REQUEST_MS 100.0
#define TRAIN_REQUEST_MAX_STEPS 256

typedef struct train_cfg {
  const char *model, *name, *places, *data, *feed;
  const char *test_data;    /* --test-data: the test split's file (.npz, .csv) */
  const char *label_column; /* --label-column: a CSV's label (default: the last column) */
  double test_fraction;     /* --test-fraction: rows held out without a test split (-1: 0.1) */
  const char *init_from;    /* --init-from: a file of pe-client export (or a checkpoint) */
  long epochs, batch, steps, seed, limit, eval_every;
  long per_request; /* --steps-per-request; 0 (not given): TRAIN_REQUEST_STEPS, maybe grown */
  /* The run's first epoch in the data order: --start-epoch, else (0) the
   * model's CLI_EPOCHS_DONE + 1 (1 for a fresh model). */
  long start_epoch;
  bool shm, quiet, persistent;
  bool check_nan_inf; /* --check-nan-inf: RunOptions.check_nan_inf */
  cli_graph_opts graph;
  recipe_cfg recipe;
  /* A job across nodes: --job, --world, --rank, --rendezvous,
   * --job-token-file (the token: its first line; else $PE_JOB_TOKEN). */
  const char *job, *rendezvous, *job_token_file;
  long world, rank;
  char job_token[256];
} train_cfg;

/* One trainer's state; everything is released by trainer_free. */
typedef struct trainer {
  const cli_ctx *ctx;
  train_cfg cfg;
  pe_model_spec m;
  const char *ns;
  pe_dataset *images, *test_images; /* Fashion-MNIST's splits, when the data is theirs */
  pe_feed_data *train, *test;       /* the rows of the model's two feeds */
  pe_feed_decl xf, yf;              /* the input and label feeds as the program declares them */
  pe_client *c;
  uint64_t train_h, eval_h;
  pe_client_strategy strategy; /* the training program's, as the daemon compiled it */
  char places[32];             /* the model's, as the daemon reported them */
  char *places_trial;          /* how places = auto chose them, a JSON object (NULL: not so) */
  pe_client_shm shm;           /* shm feeds: pair 0's images and labels, then pair 1's */
  bool use_shm;                /* the batches are in shm */
  long eval_batch;             /* EVAL_BATCH, or less where the socket takes less */
  void *x[2];                  /* two batch buffer pairs (inside the region when use_shm) */
  void *y[2];
  /* The training rows in a region of their own (with use_shm, where one
   * fits): a training request names rows of it (pe_client_tensor.shm_rows)
   * from idx[k], and nobody copies a batch on this side. */
  pe_client_shm rows_shm;
  bool use_rows;
  size_t rows_y_off; /* the labels' offset in rows_shm */
  int64_t *idx[2];   /* each group's row indices (pe_batch_prefetch_start_index) */
  bool initialized;  /* Init ran the startup (maybe only for state the model lacked) */
  bool had_values;   /* the model had values before this command's Init */
  bool counts;       /* the training program declares CLI_EPOCHS_DONE */
  /* Init's added state (the model had values, lacked these), without
   * CLI_EPOCHS_DONE: n_added variables, the first named in added
   * ("a, b, ..."); 0: none. */
  char added[200];
  size_t n_added;
  char **declared; /* the training program's persistables (--init-from takes these) */
  size_t n_declared;
  size_t n_init_from;  /* tensors --init-from set */
  uint64_t recoveries; /* pe_client_recovery_info's count already reported */
  train_log log;       /* the recent training requests, to go back to a step */
  long rewind_to;      /* the step to go back to (run_request's TRAIN_REWIND) */
  /* Requests grown by time (--steps-per-request not given, rows in shared
   * memory): cfg.per_request starts at TRAIN_REQUEST_STEPS and grows by
   * the time of the full requests after the first (train_steps.c). */
  bool grow_requests;
  int full_requests; /* full requests answered so far, while grow_requests */
} trainer;

typedef struct train_result {
  long steps, samples;
  double train_s, eval_s, final_loss, final_acc, test_acc, run_ms, queue_ms;
  double test_loss; /* mean loss over the test split (a model without accuracy, text); NAN: none */
  int64_t test_seen;
  /* Daemon losses survived (pe_client_recovery_info): steps whose fetches
   * were lost (already applied), answered steps rolled back, and steps
   * repeated because of that. */
  long recoveries, steps_unfetched, steps_rolled_back, steps_repeated;
  double final_lr; /* learning_rate after the last epoch (a schedule moves it); NAN: unknown */
  /* --eval-every: the test accuracy after each evaluated epoch (epoch k x
   * eval_every is entry k - 1), and the seconds those evaluations took
   * (not training time). */
  double *epoch_acc;
  long n_epoch_acc;
  double epoch_eval_s;
} train_result;

/* Steps per epoch, as trainer_train takes them. */
/* Training examples per epoch: in a job this node's (pe_batcher_shard). */
static inline int64_t trainer_epoch_rows(const trainer *t) {
  return t->cfg.job ? t->train->n / t->cfg.world : t->train->n;
}

static inline long trainer_steps_per_epoch(const trainer *t) {
  long per_epoch = (long)((trainer_epoch_rows(t) + t->cfg.batch - 1) / t->cfg.batch);
  return t->cfg.steps && t->cfg.steps < per_epoch ? t->cfg.steps : per_epoch;
}

/* Sets the model's int64 [1] variable name to v (SetParams); the code. */
static inline int trainer_set_i64(trainer *t, const char *name, int64_t v) {
  pe_client_tensor x = {
      .name = name, .dtype = PE_B_I64, .ndim = 1, .shape = {1}, .data = &v, .nbytes = sizeof v};
  return pe_client_set_params(t->c, t->ns, &x, 1);
}

/* This command initialised the model's parameters (it had no values):
 * train started afresh, eval evaluated untrained ones. */
static inline bool trainer_fresh(const trainer *t) {
  return t->initialized && !t->had_values;
}

/* "accuracy", or "top-K accuracy" for a model file's `accuracy top=K`, so
 * that a top-5 figure is not read as top-1; buf: at least 32 bytes. */
static inline const char *trainer_acc_label(const trainer *t, char *buf, size_t n) {
  if (t->m.accuracy_top_k <= 1) return "accuracy";
  snprintf(buf, n, "top-%d accuracy", t->m.accuracy_top_k);
  return buf;
}

/* Loads --data (or Fashion-MNIST) into t->train and t->test, checked
 * against the program's feeds (data_load.c). */
int trainer_load_data(trainer *t);

/* The data's losses are also said in bits per character (text). */
static inline bool trainer_bits(const trainer *t) {
  return t->train && t->train->kind == PE_FEED_TEXT;
}

/* A loss as text: "%.4f", but for a regression (no accuracy) "%.4g",
 * since its mean squared error falls far below the 1e-4 that "%.4f"
 * shows as 0; buf: at least 32 bytes. */
static inline const char *trainer_loss_str(const trainer *t, double v, char *buf, size_t n) {
  snprintf(buf, n, t->m.correct[0] ? "%.4f" : "%.4g", v);
  return buf;
}

/* The evaluation measures the mean loss: the model has no accuracy, or
 * the data is text (a language model's figure is its loss). */
static inline bool trainer_eval_loss(const trainer *t) {
  return !t->m.correct[0] || trainer_bits(t);
}

/* The epochs of t->cfg as one run of steps, with progress on stderr; r
 * takes the run's figures (train_steps.c). */
int trainer_train(trainer *t, train_result *r);
/* ", test accuracy 0.8123", or for trainer_eval_loss ", test loss 1.2345"
 * (with bits per character for text), into buf (train_steps.c). */
void trainer_test_figure(const trainer *t, const train_result *r, double acc, char *buf,
                         size_t len);
/* Test accuracy over the test split (*acc of *seen examples, in *secs);
 * r takes the recoveries (train_steps.c). */
int trainer_evaluate(trainer *t, train_result *r, double *acc, int64_t *seen, double *secs);

#endif
