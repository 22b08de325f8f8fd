/* train and eval: Fashion-MNIST, or the user's own data (--data FILE,
 * data_load.c), through the daemon.
 *
 * train registers the model's training and evaluation programs under one
 * model name (they share the parameters), initialises them, runs the
 * mini-batches (--steps-per-request of them per request, 16 by default:
 * the daemon runs them back to back, RunRequest.batches; the same steps as
 * one request each) with a progress bar on stderr, then evaluates test
 * accuracy. The loop mirrors pe-bench train (bench/bench_train.c): inputs
 * standardised with the training split's statistics, shuffled batches from
 * the seed, samples_per_sec = training samples / training wall time (the
 * step loop only), final_loss = mean loss over the last epoch's steps
 * (weighted by batch size), test accuracy over the test split with batches
 * of 500. The batches travel through a shared-memory region (--feed shm;
 * the default on an ipc:// socket, where the daemon is local) or in the
 * requests, through the socket (--feed socket). eval runs only the evaluation part on the
 * parameters the model has (after train, or load).
 *
 * The recipe flags (--optimizer, --lr, --momentum, --weight-decay,
 * --no-decay-1d, --clip-norm, --lr-schedule with --warmup-epochs and
 * --min-lr) change the
 * model's optimizer before it is registered (pe_recipe.h); a schedule is
 * stretched over the run: its warmup and decay are counted in this run's
 * steps (epochs x steps per epoch), so it ends at --min-lr on the last step,
 * and the model's step counter starts at 0 (a model trained before has one).
 *
 * This file has the options, the set-up (model, data, registers, the
 * feeds' buffers), the result and the commands; train_steps.c the step
 * loop and the evaluation; trainer.h the state they share. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"
#include "interrupt.h"
#include "pe_builder.h"
#include "pe_model_file.h"
#include "pe_recipe.h"
#include "trainer.h"

#define TRAIN_LOG_REQUESTS 4097 /* libpeclient remembers 4096 answered runs; + the lost one */

/* What train and eval both take: the model, where it runs, the data. */
// clang-format off
#define TRAIN_EVAL_OPTS                                                                          \
  {"model", CLI_STR, offsetof(train_cfg, model), 0, 0, "mlp | cnn | FILE (required)"},           \
  {"model-name", CLI_STR, offsetof(train_cfg, name), 0, 0,                                       \
   "parameter namespace (default: the model's name)"},                                           \
  {"places", CLI_STR, offsetof(train_cfg, places), 0, 0, "cpu:N, sim:N, cuda:0 (the model's, else the daemon's)"},     \
  {"limit", CLI_INT, offsetof(train_cfg, limit), 1, 1L << 30,                                    \
   "use only the first N examples of each split"},                                               \
  {"seed", CLI_INT, offsetof(train_cfg, seed), 0, 1L << 62, "init and shuffle seed (1)"},        \
  {"data", CLI_STR, offsetof(train_cfg, data), 0, 0,                                             \
   "Fashion-MNIST directory, or FILE.npz | FILE.csv | FILE.txt"},                                \
  {"test-data", CLI_STR, offsetof(train_cfg, test_data), 0, 0,                                   \
   "the test split of --data FILE (.npz, .csv; else its test/ arrays or --test-fraction)"},      \
  {"test-fraction", CLI_FLOAT, offsetof(train_cfg, test_fraction), 0, 1,                         \
   "rows of --data FILE held out for the test (0.1) when it has no test split"},                 \
  {"label-column", CLI_STR, offsetof(train_cfg, label_column), 0, 0,                             \
   "the CSV label column, or columns A,B,... of a wide target (the last)"},                     \
  {"feed", CLI_STR, offsetof(train_cfg, feed), 0, 0,                                             \
   "auto (shm on an ipc:// socket, else socket) | shm | socket"},                                \
  {"shm", CLI_FLAG, offsetof(train_cfg, shm), 0, 0, "the same as --feed shm"},                   \
  {"persistent", CLI_FLAG, offsetof(train_cfg, persistent), 0, 0,                                \
   "the model outlives this client"},                                                            \
  {"quiet", CLI_FLAG, offsetof(train_cfg, quiet), 0, 0, "no progress on stderr"},                \
  CLI_GRAPH_OPTS(train_cfg, graph)
// clang-format on

/* eval takes no training option: one would change nothing (a usage error
 * names it, with eval's list). */
static const cli_opt eval_opts[] = {TRAIN_EVAL_OPTS};

static const cli_opt train_opts[] = {
    TRAIN_EVAL_OPTS,
    {"check-nan-inf", CLI_FLAG, offsetof(train_cfg, check_nan_inf), 0, 0,
     "debug: fail at the first op that writes NaN/Inf, naming it (slower; cpu/sim)"},
    {"epochs", CLI_INT, offsetof(train_cfg, epochs), 1, 1000, "passes over the training set (1)"},
    {"init-from", CLI_STR, offsetof(train_cfg, init_from), 0, 0,
     "start from a file of pe-client export: the variables this program has, learning_rate "
     "excepted"},
    {"start-epoch", CLI_INT, offsetof(train_cfg, start_epoch), 1, 1000000,
     "the first epoch's number and shuffle order (the model's epochs done + 1; a fresh model 1)"},
    {"batch", CLI_INT, offsetof(train_cfg, batch), 1, 1 << 16, "batch size (mlp 128, cnn 64)"},
    {"steps", CLI_INT, offsetof(train_cfg, steps), 1, 1L << 40, "cap on steps per epoch"},
    {"steps-per-request", CLI_INT, offsetof(train_cfg, per_request), 1, 1024,
     "mini-batches per request, run back to back by the daemon (16, grown to about 100 ms of "
     "steps, at most 256, where the training rows are in shared memory)"},
    {"eval-every", CLI_INT, offsetof(train_cfg, eval_every), 0, 1000,
     "test accuracy after every N epochs too (0: at the end only)"},
    {"optimizer", CLI_STR, offsetof(train_cfg, recipe.optimizer), 0, 0,
     "sgd | momentum | adam | adamw (the model's)"},
    {"lr", CLI_FLOAT, offsetof(train_cfg, recipe.lr), 0, 1000000, "learning rate (the model's)"},
    {"momentum", CLI_FLOAT, offsetof(train_cfg, recipe.momentum), 0, 1,
     "momentum's mu (the model's; 0: plain sgd)"},
    {"weight-decay", CLI_FLOAT, offsetof(train_cfg, recipe.weight_decay), 0, 1,
     "L2 (adamw: decoupled) coefficient (the model's)"},
    {"clip-norm", CLI_FLOAT, offsetof(train_cfg, recipe.clip_norm), 0, 1000000,
     "clip gradients to this global norm (the model's; 0: none)"},
    {"no-decay-1d", CLI_FLAG, offsetof(train_cfg, recipe.no_decay_1d), 0, 0,
     "no weight decay on biases and norm scale/shift"},
    {"lr-schedule", CLI_STR, offsetof(train_cfg, recipe.schedule), 0, 0,
     "constant | cosine | linear, over this run (the model's)"},
    {"warmup-epochs", CLI_INT, offsetof(train_cfg, recipe.warmup_epochs), 0, 1000,
     "linear warmup before the schedule (0)"},
    {"min-lr", CLI_FLOAT, offsetof(train_cfg, recipe.min_lr), 0, 1000000,
     "the rate of the run's last step, for cosine and linear (0)"},
    {"job", CLI_STR, offsetof(train_cfg, job), 0, 0,
     "train as one node of a job across nodes (docs/multinode.md): the job's name"},
    {"world", CLI_INT, offsetof(train_cfg, world), 2, 4096, "--job: nodes in the job"},
    {"rank", CLI_INT, offsetof(train_cfg, rank), 0, 4095,
     "--job: this node, 0 .. world-1; it trains every world-th example of each epoch's order"},
    {"rendezvous", CLI_STR, offsetof(train_cfg, rendezvous), 0, 0,
     "--job: rank 0's daemon's HOST:PORT"},
    {"job-token-file", CLI_STR, offsetof(train_cfg, job_token_file), 0, 0,
     "--job: a file whose first line is the job's secret (else $PE_JOB_TOKEN)"},
};

/* rc: the command's exit status so far (cli_end). */
static void trainer_free(trainer *t, int rc) {
  if (t->rows_shm.base) pe_client_shm_close(t->c, &t->rows_shm);
  for (int k = 0; k < 2; k++) free(t->idx[k]);
  if (t->shm.base)
    pe_client_shm_close(t->c, &t->shm);
  else
    for (int k = 0; k < 2; k++) {
      free(t->x[k]);
      free(t->y[k]);
    }
  /* Its session ends now: its programs and a non-persistent model are
   * freed, and the next trainer of the model starts afresh. (From here a
   * signal no longer sends a close of its own.) */
  cli_interrupt_watch(NULL);
  cli_end(t->ctx, t->c, rc);
  train_log_free(&t->log);
  free(t->places_trial);
  for (size_t i = 0; i < t->n_declared; i++) free(t->declared[i]);
  free(t->declared);
  pe_feed_data_free(t->train);
  pe_feed_data_free(t->test);
  pe_dataset_free(t->images);
  pe_dataset_free(t->test_images);
  pe_model_spec_release(&t->m);
}

/* The layout of a batch buffer pair for max(batch x per_request,
 * EVAL_BATCH) examples: *cap examples, *xbytes of images then the labels;
 * returns the pair's bytes. */
static size_t pair_layout(const trainer *t, size_t *xbytes, size_t *cap) {
  long rows = t->cfg.batch * t->cfg.per_request;
  *cap = (size_t)(rows > EVAL_BATCH ? rows : EVAL_BATCH);
  *xbytes = (*cap * t->train->x.row_bytes + 7) / 8 * 8; /* the labels 8-aligned */
  return *xbytes + *cap * t->train->y.row_bytes;
}

/* memcpy of n bytes from src, which the caller frees afterwards: each
 * copied chunk's whole pages of src are handed back to the kernel at once,
 * so that the process never holds both copies of a large training set
 * (they read as zeros from then on). */
static void copy_releasing(char *dst, char *src, size_t n) {
  const size_t chunk = (size_t)8 << 20;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t released = ((uintptr_t)src + page - 1) / page * page; /* first whole page */
  for (size_t off = 0; off < n; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    memcpy(dst + off, src + off, k);
    uintptr_t end = ((uintptr_t)src + off + k) / page * page;
    if (end > released) {
      madvise((void *)released, end - released, MADV_DONTNEED);
      released = end;
    }
  }
}

/* The training rows into a region of their own, for feeds by row index:
 * the client then copies nothing per batch, and the daemon's workers copy
 * each batch's rows in their idle time, as in process (pe-bench), instead
 * of a client thread taking a core at each request. The private arrays are
 * freed where they are this trainer's own and the region holds them whole.
 * Where /dev/shm has no room the batches are copied into the pair region as
 * before. */
static void alloc_rows(trainer *t, size_t cap) {
  pe_feed_array *x = &t->train->x, *y = &t->train->y;
  int64_t n = t->train->n; /* the rows the batcher walks (--limit: fewer) */
  size_t xbytes = ((size_t)n * x->row_bytes + 7) / 8 * 8;
  int code = pe_client_shm_create(t->c, xbytes + (size_t)n * y->row_bytes, &t->rows_shm);
  if (!code) {
    t->idx[0] = malloc(cap * sizeof(int64_t));
    t->idx[1] = malloc(cap * sizeof(int64_t));
  }
  if (code || !t->idx[0] || !t->idx[1]) {
    if (!t->cfg.quiet)
      fprintf(stderr,
              "pe-client %s: the training set is not in shared memory (%s); each batch "
              "is copied into it\n",
              t->ctx->cmd, code ? pe_client_error(t->c) : "out of memory");
    return;
  }
  char *base = t->rows_shm.base;
  /* Fashion-MNIST's rows are its data set's (borrowed); once the region
   * holds both arrays whole nothing reads the data set's copy, nor an
   * array of the trainer's own that the region replaces: those are
   * released as they are copied. */
  bool of_images = t->images && x->data == (void *)t->images->images &&
                   y->data == (void *)t->images->labels && n == x->dims[0] && n == y->dims[0];
  if (n == x->dims[0] && (!x->borrowed || of_images))
    copy_releasing(base, x->data, (size_t)n * x->row_bytes);
  else
    memcpy(base, x->data, (size_t)n * x->row_bytes);
  memcpy(base + xbytes, y->data, (size_t)n * y->row_bytes);
  pe_feed_array *a[2] = {x, y};
  void *at[2] = {base, base + xbytes};
  for (int i = 0; i < 2 && n == a[i]->dims[0]; i++) { /* whole: the region stands in */
    if (!a[i]->borrowed) free(a[i]->data);
    a[i]->data = at[i];
    a[i]->borrowed = true;
  }
  if (of_images) {
    pe_dataset_free(t->images);
    t->images = NULL;
  }
  t->rows_y_off = xbytes;
  t->use_rows = true;
}

/* The two batch buffer pairs: in one shared-memory region when asked
 * (--feed shm) or by default on a local (ipc://) daemon, where it saves
 * the copies through the socket, and for training the training rows as
 * well (alloc_rows); else, or when the default cannot set a region up, on
 * the heap, the batches then travel in the requests. */
static int alloc_batches(trainer *t, bool training) {
  bool given = t->cfg.per_request > 0;
  if (!given) t->cfg.per_request = TRAIN_REQUEST_STEPS;
  size_t xbytes, cap, pair = pair_layout(t, &xbytes, &cap);
  t->eval_batch = EVAL_BATCH;
  bool want = !strcmp(t->cfg.feed, "shm") ||
              (!strcmp(t->cfg.feed, "auto") && !strncmp(pe_client_address(t->c), "ipc://", 6));
  if (want) {
    pe_client_shm_unlink_on_signals(); /* Ctrl-C or kill leaves no region in /dev/shm */
    int code = pe_client_shm_create(t->c, 2 * pair, &t->shm);
    if (code && strcmp(t->cfg.feed, "auto")) return cli_fail(t->ctx, t->c, code);
    if (code && !t->cfg.quiet)
      fprintf(stderr, "pe-client %s: no shared-memory feeds (%s); feeding through the socket\n",
              t->ctx->cmd, pe_client_error(t->c));
    if (!code) {
      t->use_shm = true;
      for (int k = 0; k < 2; k++) {
        t->x[k] = (float *)((char *)t->shm.base + k * pair);
        t->y[k] = (char *)t->x[k] + xbytes;
      }
      if (training) alloc_rows(t, cap);
      /* Only row indices grow with the requests: a copied batch's buffers
       * are sized once, here. */
      t->grow_requests = !given && t->use_rows;
      return CLI_OK;
    }
  }
  /* Through the socket a group's rows travel in the request: keep it under
   * the largest message the connection takes (with room for the rest);
   * the registers' replies said the daemon's, when it is smaller. */
  size_t row = t->train->x.row_bytes + t->train->y.row_bytes;
  long fit_rows = (long)(pe_client_max_message(t->c) / 10 * 9 / row);
  long fit = fit_rows / t->cfg.batch;
  if (t->cfg.per_request > fit) t->cfg.per_request = fit > 1 ? fit : 1;
  if (fit_rows < EVAL_BATCH) t->eval_batch = fit_rows > 1 ? fit_rows : 1;
  pair_layout(t, &xbytes, &cap);
  for (int k = 0; k < 2; k++) {
    t->x[k] = malloc(xbytes);
    t->y[k] = malloc(cap * t->train->y.row_bytes);
    if (!t->x[k] || !t->y[k])
      return cli_error(t->ctx, "out of memory for %zu-example batches", cap);
  }
  return CLI_OK;
}

static bool recipe_set(const recipe_cfg *c) {
  return c->optimizer || c->schedule || c->lr >= 0 || c->momentum >= 0 || c->weight_decay >= 0 ||
         c->clip_norm >= 0 || c->no_decay_1d || c->warmup_epochs || c->min_lr != 0;
}

/* The recipe flags' usage, before anything is loaded. */
static int check_recipe_flags(const cli_ctx *ctx, const recipe_cfg *c) {
  if (c->optimizer && !pe_optimizer_kind(c->optimizer))
    return cli_usage(ctx, "--optimizer '%s' unknown (known: " PE_OPTIMIZER_KINDS ")", c->optimizer);
  if (c->schedule && strcmp(c->schedule, "constant") && strcmp(c->schedule, "cosine") &&
      strcmp(c->schedule, "linear"))
    return cli_usage(ctx,
                     "--lr-schedule '%s': constant, cosine or linear (other kinds: a model file's "
                     "schedule line)",
                     c->schedule);
  if (c->lr == 0)
    return cli_usage(ctx, "--lr 0: the learning rate must be > 0 (without --lr: the model's)");
  if ((c->warmup_epochs || c->min_lr) && !c->schedule)
    return cli_usage(ctx, "--warmup-epochs and --min-lr need --lr-schedule");
  return CLI_OK;
}

/* Training needs an optimizer: without one (a model file without an
 * 'optimizer' line: the builder records the loss only) the steps compute
 * gradients and change nothing. The recipe flags may add one. */
static int check_optimizer(trainer *t) {
  const recipe_cfg *c = &t->cfg.recipe;
  if (t->m.optimizer[0]) return CLI_OK;
  if (!c->optimizer)
    return cli_error(t->ctx,
                     "%s: the model has no optimizer, so training would change nothing: give it "
                     "an 'optimizer' line (conf/models/README.md) or pass --optimizer and --lr",
                     t->cfg.model);
  if (c->lr < 0)
    return cli_usage(t->ctx, "%s: the model has no optimizer: --optimizer %s needs --lr",
                     t->cfg.model, c->optimizer);
  return CLI_OK;
}

/* The recipe flags as a recipe, the schedule's step counts left to
 * fill_schedule. */
static pe_train_recipe recipe_of(const recipe_cfg *c) {
  return (pe_train_recipe){.optimizer = c->optimizer,
                           .lr = (float)c->lr,
                           .momentum = (float)c->momentum,
                           .weight_decay = (float)c->weight_decay,
                           .grad_clip_norm = (float)c->clip_norm,
                           .no_decay_1d = c->no_decay_1d,
                           .schedule = c->schedule,
                           .min_lr = (float)c->min_lr};
}

/* The schedule's step counts, known once the data and the batch are. A
 * cosine or linear schedule spans the run: T = the steps after the
 * warmup, minus one, so the last step (t = T) runs at --min-lr, as
 * PyTorch's CosineAnnealingLR / LinearLR do with T_max / total_iters one
 * less than the steps they are stepped over. */
static int fill_schedule(trainer *t, pe_train_recipe *r) {
  const recipe_cfg *c = &t->cfg.recipe;
  if (!c->schedule) return CLI_OK;
  long total = trainer_steps_per_epoch(t) * t->cfg.epochs,
       warmup = trainer_steps_per_epoch(t) * c->warmup_epochs;
  if (warmup >= total)
    return cli_usage(t->ctx, "--warmup-epochs %ld leaves nothing of %ld epoch(s) to schedule",
                     c->warmup_epochs, t->cfg.epochs);
  long decay = total - warmup > 1 ? total - warmup - 1 : 1;
  r->warmup_steps = warmup;
  r->decay_steps = strcmp(c->schedule, "constant") ? decay : 0;
  return CLI_OK;
}

typedef struct setup_step {
  trainer *t;
  bool eval_only;
  int rc;
} setup_step;

/* A node of a job trains its part of each epoch (pe_batcher_shard):
 * every node needs one example at least. */
static int check_shard(trainer *t) {
  if (trainer_epoch_rows(t) < 1)
    return cli_usage(t->ctx, "--job %s: %lld training examples leave rank %ld of %ld none",
                     t->cfg.job, (long long)t->train->n, t->cfg.rank, t->cfg.world);
  return CLI_OK;
}

/* pe_model_opts.prepare: what needs the model (its optimizer, input and
 * default batch) before its program is packed: the optimizer check, the
 * data, and the recipe's step counts. t->m is the model being filled. */
static int before_pack(const pe_model_spec *m, pe_train_recipe *r, void *arg) {
  setup_step *s = arg;
  trainer *t = s->t;
  if (!t->cfg.batch) t->cfg.batch = m->default_batch;
  t->ns = t->cfg.name ? t->cfg.name : m->name;
  int rc = CLI_OK;
  if (!s->eval_only) rc = check_optimizer(t);
  if (!rc) rc = trainer_load_data(t); /* m is t->m: its feeds are declared already */
  if (!rc && !s->eval_only && t->cfg.job) rc = check_shard(t);
  /* It would be one short batch per epoch, reported under the asked size. */
  if (!rc && !s->eval_only && t->cfg.batch > trainer_epoch_rows(t))
    rc = cli_usage(t->ctx, "--batch %ld is larger than the %lld training examples%s%s",
                   t->cfg.batch, (long long)trainer_epoch_rows(t),
                   t->cfg.job ? " of this node" : "", t->cfg.limit ? " (--limit)" : "");
  if (!rc && r) rc = fill_schedule(t, r);
  s->rc = rc;
  return rc != CLI_OK;
}

/* The model with the recipe flags applied (training) and the epoch count
 * declared (a program with an optimizer), packed once. */
static int load_model(trainer *t, bool eval_only) {
  pe_train_recipe recipe = recipe_of(&t->cfg.recipe);
  setup_step s = {.t = t, .eval_only = eval_only, .rc = CLI_OK};
  pe_model_opts o = {.recipe = !eval_only && recipe_set(&t->cfg.recipe) ? &recipe : NULL,
                     .counter = CLI_EPOCHS_DONE,
                     .prepare = before_pack,
                     .arg = &s};
  char err[1024];
  if (!pe_model_resolve_opts(t->cfg.model, &o, &t->m, err, sizeof err)) return CLI_OK;
  if (s.rc != CLI_OK) return s.rc; /* before_pack said why */
  return cli_error(t->ctx, "%s", err);
}

/* The training program's persistables, for --init-from (the register
 * reply's list lasts until the next request). */
static int keep_declared(trainer *t, const pe_client_program *prog) {
  t->declared = calloc(prog->n_params ? prog->n_params : 1, sizeof *t->declared);
  if (!t->declared) return cli_error(t->ctx, "out of memory");
  for (size_t i = 0; i < prog->n_params; i++, t->n_declared++)
    if (!(t->declared[i] = strdup(prog->params[i].name))) return cli_error(t->ctx, "out of memory");
  return CLI_OK;
}

/* --init-from takes a variable the training program has, except
 * learning_rate: the run's rate is the program's (the flag's, the model
 * file's), and the epoch count: the run starts at epoch 1 (--start-epoch
 * aside). Another model's optimizer state is left out that way too. */
static bool init_from_takes(const char *name, void *arg) {
  const trainer *t = arg;
  if (!strcmp(name, "learning_rate") || !strcmp(name, CLI_EPOCHS_DONE)) return false;
  for (size_t i = 0; i < t->n_declared; i++)
    if (!strcmp(t->declared[i], name)) return true;
  return false;
}

/* --init-from: the file's values over what Init left (fresh or kept). */
static int init_from(trainer *t) {
  size_t skipped;
  uint64_t bytes;
  int rc = cli_params_import(t->ctx, t->c, t->ns, t->cfg.init_from, init_from_takes, t,
                             &t->n_init_from, &skipped, &bytes);
  if (!rc && !t->cfg.quiet)
    fprintf(stderr,
            "pe-client %s: model '%s' starts from %s: %zu tensors set (%llu bytes), %zu of the "
            "file's left out (not this program's, or its learning_rate)\n",
            t->ctx->cmd, t->ns, t->cfg.init_from, t->n_init_from, (unsigned long long)bytes,
            skipped);
  return rc;
}

/* The run's first epoch, when --start-epoch did not say: the model's epoch
 * count + 1; 1 with --init-from (another model's values start a run) or
 * a count that cannot be read. */
static int find_start_epoch(trainer *t) {
  if (t->cfg.start_epoch) return CLI_OK;
  t->cfg.start_epoch = 1;
  if (!t->counts || t->cfg.init_from) return CLI_OK;
  const char *name = CLI_EPOCHS_DONE;
  const pe_client_tensor *v = NULL;
  size_t n = 0;
  int code = pe_client_get_params(t->c, t->ns, &name, 1, &v, &n);
  if (code) return cli_fail(t->ctx, t->c, code);
  int64_t done;
  if (n == 1 && v[0].dtype == PE_B_I64 && v[0].nbytes == sizeof done) {
    memcpy(&done, v[0].data, sizeof done);
    if (done > 0 && done < 1000000) t->cfg.start_epoch = (long)done + 1;
  }
  return CLI_OK;
}

#define ADDED_SHOWN 6 /* names the notice lists; the count says the rest */

/* Init's added state, for the notice: its names but the epoch count's, the
 * first ADDED_SHOWN (as many as fit) as "a, b, ..." in t->added. */
static void note_added(trainer *t) {
  const char *const *names;
  size_t n = pe_client_init_added(t->c, &names), len = 0, shown = 0;
  t->n_added = 0;
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(names[i], CLI_EPOCHS_DONE)) continue;
    size_t room = sizeof t->added - len;
    if (shown < ADDED_SHOWN && strlen(names[i]) + 8 < room) /* + ", ..." */
      len += (size_t)snprintf(t->added + len, room, "%s%s", shown++ ? ", " : "", names[i]);
    t->n_added++;
  }
  if (shown < t->n_added) snprintf(t->added + len, sizeof t->added - len, ", ...");
}

/* tr as a JSON object into t->places_trial (kept: the reply's strings go
 * with the next request); not present: none. */
static int keep_places_trial(trainer *t, const pe_client_places_trial *tr) {
  if (!tr->present || t->places_trial) return CLI_OK;
  if (!t->cfg.quiet) {
    fputs("pe-client train: ", stderr);
    cli_print_places_trial(stderr, tr);
  }
  size_t len = 0;
  FILE *f = open_memstream(&t->places_trial, &len);
  if (!f) return cli_error(t->ctx, "out of memory for the places trial");
  cli_json_places_trial(f, tr);
  return fclose(f) ? cli_error(t->ctx, "out of memory for the places trial") : CLI_OK;
}

/* Load model and data, connect, register (train unless eval_only) + eval,
 * initialise. */
static int trainer_setup(trainer *t, bool eval_only) {
  int rc = load_model(t, eval_only);
  if (rc) return rc;
  /* The training program counts the model's epochs (load_model declared
   * the count in a program with an optimizer, which training has). */
  if (!eval_only) t->counts = t->m.optimizer[0] != 0;
  /* A run that a daemon restart rolled back is repeated here, in order:
   * libpeclient does not send the lost request on top of older
   * parameters (ROLLED_BACK). */
  if (!(t->c = cli_connect_with(t->ctx, (pe_client_opts){.fail_on_rollback = true}, &rc)))
    return rc;
  cli_interrupt_watch(t->c); /* Ctrl-C, kill: the session ends before the process does */
  if (!train_log_init(&t->log, TRAIN_LOG_REQUESTS))
    return cli_error(t->ctx, "out of memory for the request log");
  pe_client_program prog;
  cli_reg r = {.ns = t->ns,
               .places = t->cfg.places,
               .seed = t->cfg.seed,
               .batch = t->cfg.batch,
               .persistent = t->cfg.persistent,
               .graph = &t->cfg.graph};
  if (!eval_only) {
    if (t->cfg.job) {
      r.job = t->cfg.job;
      r.world = (int)t->cfg.world;
      r.rank = (int)t->cfg.rank;
      r.rendezvous = t->cfg.rendezvous;
      r.job_token = t->cfg.job_token;
    }
    rc = cli_register(t->ctx, t->c, &t->m, &r, &prog);
    r.job = NULL; /* the evaluation program runs on each node alone */
    if (rc) return rc;
    t->had_values = prog.has_values;
    t->train_h = prog.handle;
    if ((rc = keep_places_trial(t, &prog.places_trial))) return rc;
    if (t->cfg.init_from && (rc = keep_declared(t, &prog))) return rc;
    t->strategy = prog.strategy;
  }
  r.for_test = true;
  if ((rc = cli_register(t->ctx, t->c, &t->m, &r, &prog))) return rc;
  t->eval_h = prog.handle;
  if ((rc = keep_places_trial(t, &prog.places_trial))) return rc;
  if (eval_only) {
    t->strategy = prog.strategy;
    t->had_values = prog.has_values;
  }
  snprintf(t->places, sizeof t->places, "%s", prog.places);
  /* Init through the training program: its startup block also creates the
   * optimizer state. No-op when the model's parameters exist. */
  int code = pe_client_init(t->c, eval_only ? t->eval_h : t->train_h, false, &t->initialized);
  if (code) return cli_fail(t->ctx, t->c, code);
  if (t->initialized && t->had_values) note_added(t);
  if (!eval_only && (rc = find_start_epoch(t))) return rc;
  /* eval of a name without values (never trained, loaded or restored; a
   * typo?) evaluates freshly initialised parameters: said, exit 0 (the
   * evaluation is what was asked; --json has fresh_parameters). */
  if (eval_only && trainer_fresh(t))
    fprintf(stderr,
            "pe-client %s: warning: model '%s' had no parameters (not trained, loaded or "
            "restored under that name): evaluating freshly initialised ones\n",
            t->ctx->cmd, t->ns);
  /* Values it did not initialise: a persistent model's, or another live
   * client's training the same name (both then train one model). */
  if (!eval_only && !trainer_fresh(t) && !t->cfg.quiet)
    fprintf(stderr,
            "pe-client %s: model '%s' already has values (%s): training continues from them at "
            "epoch %ld (--start-epoch N sets the epoch; pe-client drop-model --model %s starts it "
            "afresh)\n",
            t->ctx->cmd, t->ns,
            t->cfg.persistent ? "persistent, restored or trained before"
                              : "another client is using it, or it is persistent",
            t->cfg.start_epoch, t->ns);
  if (!eval_only && !trainer_fresh(t) && !t->cfg.quiet && t->n_added)
    fprintf(stderr,
            "pe-client %s: model '%s' lacked state this program adds (another optimizer's, a "
            "schedule's counter): initialised %zu new variable%s: %s\n",
            t->ctx->cmd, t->ns, t->n_added, t->n_added == 1 ? "" : "s", t->added);
  if (!eval_only && t->cfg.init_from && (rc = init_from(t))) return rc;
  /* --lr-schedule spans this run: a model trained before keeps its step
   * counter (model state), which would start the schedule part-way. */
  if (!eval_only && t->cfg.recipe.schedule && (code = trainer_set_i64(t, PE_LR_STEP_COUNTER, 0)))
    return cli_fail(t->ctx, t->c, code);
  return alloc_batches(t, !eval_only);
}

/* The strategy as the daemon compiled it; "single" on one place, where
 * there is nothing to share (cpu:1 compiles as sharded, which shards
 * nothing). places: "kind:N", where cuda:0 is one GPU. */
static const char *strategy_label(const trainer *t) {
  const char *colon = strchr(t->places, ':');
  if (colon && strtol(colon + 1, NULL, 10) <= 1) return "single";
  return pe_client_strategy_name(t->strategy);
}

static void print_result(const trainer *t, const train_result *r, bool trained) {
  double sps = r->train_s > 0 ? r->samples / r->train_s : 0;
  char th[24], eh[24];
  cli_handle_str(t->train_h, th);
  cli_handle_str(t->eval_h, eh);
  if (t->ctx->json) {
    cli_json_begin(t->ctx);
    printf(",\"model\":");
    cli_json_str(stdout, t->ns);
    printf(",\"places\":");
    cli_json_str(stdout, t->places);
    printf(",\"strategy\":");
    cli_json_str(stdout, strategy_label(t));
    printf(",\"socket\":");
    cli_json_str(stdout, pe_client_address(t->c));
    if (t->places_trial) printf(",\"places_trial\":%s", t->places_trial);
    if (trained) {
      printf(
          ",\"batch\":%ld,\"epochs\":%ld,\"start_epoch\":%ld,\"steps\":%ld,\"samples\":%ld,"
          "\"seed\":%ld,\"shm\":%s,\"shm_rows\":%s,\"steps_per_request\":%ld,\"samples_per_sec\":%."
          "1f,\"train_"
          "seconds\":%.3f,"
          "\"run_ms_total\":%.1f,\"queue_ms_total\":%.1f,\"final_loss\":",
          t->cfg.batch, t->cfg.epochs, t->cfg.start_epoch, r->steps, r->samples, t->cfg.seed,
          t->use_shm ? "true" : "false", t->use_rows ? "true" : "false", t->cfg.per_request, sps,
          r->train_s, r->run_ms, r->queue_ms);
      /* A diverged run's loss (NaN, inf): null, and said so. A regression's
       * in six significant digits: its error falls far below 1e-5. */
      cli_json_num(stdout, t->m.correct[0] ? "%.5f" : "%.6g", r->final_loss);
      printf(
          ",\"final_loss_finite\":%s,\"final_loss_window\":\"last_epoch\","
          "\"final_train_accuracy\":",
          isfinite(r->final_loss) ? "true" : "false");
      cli_json_num(stdout, "%.4f", t->m.accuracy[0] ? r->final_acc : NAN); /* null: none */
      printf(",\"train_handle\":\"%s\"", th);
      printf(
          ",\"recoveries\":%ld,\"steps_unfetched\":%ld,\"steps_rolled_back\":%ld,"
          "\"steps_repeated\":%ld",
          r->recoveries, r->steps_unfetched, r->steps_rolled_back, r->steps_repeated);
      if (isfinite(r->final_lr)) printf(",\"final_learning_rate\":%.6g", r->final_lr);
    }
    if (trained && t->cfg.eval_every) {
      printf(",\"eval_every\":%ld,\"test_accuracy_by_epoch\":[", t->cfg.eval_every);
      for (long i = 0; i < r->n_epoch_acc; i++) {
        if (i) putchar(',');
        cli_json_num(stdout, "%.4f", r->epoch_acc[i]);
      }
      printf("]");
    }
    /* fresh_parameters: this command initialised them (train: it started
     * afresh; eval: it evaluated untrained ones). initialized is the same,
     * kept for scripts that read it. added_state: the model had values and
     * Init added what this program lacked in it (another optimizer's
     * state): the parameters are the trained ones. */
    const char *fresh = trainer_fresh(t) && !t->n_init_from ? "true" : "false";
    if (t->cfg.init_from) {
      printf(",\"init_from\":");
      cli_json_str(stdout, t->cfg.init_from);
      printf(",\"init_from_tensors\":%zu", t->n_init_from);
    }
    printf(
        ",\"eval_handle\":\"%s\",\"fresh_parameters\":%s,\"initialized\":%s,"
        "\"added_state\":%s,\"test_examples\":%lld,\"eval_seconds\":%.3f,\"test_accuracy\":",
        eh, fresh, fresh, t->n_added ? "true" : "false", (long long)r->test_seen, r->eval_s);
    cli_json_num(stdout, "%.4f", t->m.correct[0] ? r->test_acc : NAN); /* null: no accuracy */
    if (trainer_eval_loss(t)) {
      printf(",\"test_loss\":");
      cli_json_num(stdout, t->m.correct[0] ? "%.5f" : "%.6g", r->test_loss);
    }
    if (trainer_bits(t)) {
      printf(",\"test_bits_per_char\":");
      cli_json_num(stdout, "%.4f", r->test_loss / M_LN2);
      if (trained) {
        printf(",\"final_bits_per_char\":");
        cli_json_num(stdout, "%.4f", r->final_loss / M_LN2);
      }
    }
    if (t->m.accuracy_top_k > 1) printf(",\"accuracy_top_k\":%d", t->m.accuracy_top_k);
    printf("}\n");
  } else if (trained) {
    /* Steps whose fetches a daemon restart lost (their updates stand):
     * the mean leaves them out, said here as --json's steps_unfetched. */
    char lost[96] = "";
    if (r->steps_unfetched)
      snprintf(lost, sizeof lost, " (without %ld step(s) whose losses a daemon restart lost)",
               r->steps_unfetched);
    char test[96], bits[48] = "";
    trainer_test_figure(t, r, r->test_acc, test, sizeof test);
    if (trainer_bits(t)) snprintf(bits, sizeof bits, " (%.3f bits/char)", r->final_loss / M_LN2);
    char loss[32];
    printf("%s: %ld steps in %.2f s (%.0f samples/s through %s), last-epoch loss %s%s%s%s\n", t->ns,
           r->steps, r->train_s, sps, pe_client_address(t->c),
           trainer_loss_str(t, r->final_loss, loss, sizeof loss), bits, lost, test);
  } else {
    char test[96];
    trainer_test_figure(t, r, r->test_acc, test, sizeof test);
    printf("%s:%s on %lld examples (%.2f s)%s\n", t->ns, test + 1, (long long)r->test_seen,
           r->eval_s,
           trainer_fresh(t) ? "; the parameters were freshly initialised, not trained" : "");
  }
}

/* eval given one of train's own options: name it (cli_parse would call it
 * unknown). */
static int refuse_training_opts(const cli_ctx *ctx, int argc, char **argv) {
  const size_t n_eval = sizeof eval_opts / sizeof eval_opts[0];
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "--", 2)) continue;
    size_t len = strcspn(argv[i] + 2, "=");
    for (size_t k = n_eval; k < sizeof train_opts / sizeof train_opts[0]; k++)
      if (strlen(train_opts[k].name) == len && !strncmp(train_opts[k].name, argv[i] + 2, len))
        return cli_usage(ctx,
                         "--%s is a training option: eval runs the model's parameters as they "
                         "are (pe-client train takes it)",
                         train_opts[k].name);
  }
  return CLI_OK;
}

/* --job needs --world, --rank < world, --rendezvous and a token; the
 * others need --job. */
static int check_job_flags(cli_ctx *ctx, train_cfg *c) {
  if (!c->job) {
    if (c->world || c->rank || c->rendezvous || c->job_token_file)
      return cli_usage(ctx, "--world, --rank, --rendezvous and --job-token-file go with --job");
    return CLI_OK;
  }
  if (!c->world || !c->rendezvous)
    return cli_usage(ctx, "--job %s needs --world N and --rendezvous HOST:PORT", c->job);
  if (c->rank >= c->world)
    return cli_usage(ctx, "--job %s: --rank %ld is outside 0..%ld", c->job, c->rank, c->world - 1);
  const char *env = getenv("PE_JOB_TOKEN");
  if (c->job_token_file) {
    FILE *f = fopen(c->job_token_file, "r");
    if (!f) return cli_error(ctx, "--job-token-file %s: %s", c->job_token_file, strerror(errno));
    bool got = fgets(c->job_token, sizeof c->job_token, f) != NULL;
    fclose(f);
    c->job_token[strcspn(c->job_token, "\r\n")] = 0;
    if (!got || !c->job_token[0])
      return cli_error(ctx, "--job-token-file %s: its first line is empty", c->job_token_file);
  } else if (env && *env) {
    snprintf(c->job_token, sizeof c->job_token, "%s", env);
  } else {
    return cli_usage(ctx, "--job %s needs the job's token: --job-token-file FILE or $PE_JOB_TOKEN",
                     c->job);
  }
  return CLI_OK;
}

static int train_or_eval(cli_ctx *ctx, int argc, char **argv, bool eval_only) {
  trainer t = {.ctx = ctx,
               .cfg = {.epochs = 1,
                       .seed = 1,
                       .test_fraction = -1,
                       .recipe = {.lr = -1, .momentum = -1, .weight_decay = -1, .clip_norm = -1}}};
  bool help;
  int rc = eval_only ? refuse_training_opts(ctx, argc, argv) : CLI_OK;
  if (rc) return rc;
  rc = eval_only ? cli_parse(ctx, eval_opts, sizeof eval_opts / sizeof eval_opts[0], argc, argv,
                             &t.cfg, &help)
                 : cli_parse(ctx, train_opts, sizeof train_opts / sizeof train_opts[0], argc, argv,
                             &t.cfg, &help);
  if (rc || help) return rc;
  if (t.cfg.shm && t.cfg.feed && strcmp(t.cfg.feed, "shm"))
    return cli_usage(ctx, "--shm and --feed %s contradict each other", t.cfg.feed);
  if (t.cfg.shm) t.cfg.feed = "shm";
  if (!t.cfg.feed) t.cfg.feed = "auto";
  if (strcmp(t.cfg.feed, "auto") && strcmp(t.cfg.feed, "shm") && strcmp(t.cfg.feed, "socket"))
    return cli_usage(ctx, "--feed '%s' unknown (auto, shm, socket)", t.cfg.feed);
  if (!t.cfg.model) return cli_usage(ctx, "--model is required (%s | FILE)", pe_model_spec_names());
  if ((rc = check_recipe_flags(ctx, &t.cfg.recipe))) return rc;
  if ((rc = check_job_flags(ctx, &t.cfg))) return rc;
  cli_interrupt_install(ctx);
  train_result r = {.final_lr = NAN, .test_loss = NAN};
  if (t.cfg.eval_every && !(r.epoch_acc = calloc((size_t)t.cfg.epochs, sizeof *r.epoch_acc))) {
    trainer_free(&t, CLI_FAIL);
    return cli_error(ctx, "out of memory");
  }
  rc = trainer_setup(&t, eval_only);
  if (!rc && !t.cfg.quiet && !eval_only)
    fprintf(stderr,
            "pe-client train: model %s (%s), batch %ld, %ld epoch(s), %lld examples, via %s%s\n",
            t.ns, t.cfg.model, t.cfg.batch, t.cfg.epochs, (long long)t.train->n,
            pe_client_address(t.c), t.use_shm ? " (shared-memory feeds)" : "");
  if (!rc && !eval_only) rc = trainer_train(&t, &r);
  if (!rc) rc = trainer_evaluate(&t, &r, &r.test_acc, &r.test_seen, &r.eval_s);
  if (!rc) print_result(&t, &r, !eval_only);
  free(r.epoch_acc);
  trainer_free(&t, rc);
  return rc;
}

static int cmd_train(cli_ctx *ctx, int argc, char **argv) {
  return train_or_eval(ctx, argc, argv, false);
}

static int cmd_eval(cli_ctx *ctx, int argc, char **argv) {
  return train_or_eval(ctx, argc, argv, true);
}

const cli_cmd cli_cmds_train[] = {
    {"train", "--model M [--epochs N] [--batch N] [--places P]",
     "train on Fashion-MNIST or --data FILE, evaluate", cmd_train},
    {"eval", "--model M [--model-name NAME]", "test accuracy with the model's parameters",
     cmd_eval},
    {NULL, NULL, NULL, NULL},
};
