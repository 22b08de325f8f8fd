/* pe-bench train: trains a model from pe_models.h on Fashion-MNIST in-process
 * and evaluates it on all 10,000 test images.
 *
 * Flow: builder bytes -> pe_program_decode -> two clones, compiled as the
 * train program (backward + optimizer) and the eval program (for_test) ->
 * one model scope shared by three sequential executors: the train program's
 * startup block (run once: parameters, learning rate, optimizer state), the
 * train step and the eval pass.
 *
 * Inputs are standardised with the training split's pixel mean and std.
 *
 * Reported: samples_per_sec = training samples / training wall time (the
 * step loop only: no start-up, compile or eval); final_loss = the mean loss
 * over the last epoch's steps (weighted by batch size), stated in the JSON as
 * "final_loss_window": "last_epoch". */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "compiler/pass.h"
#include "compiler/program.h"
#include "core/scope.h"
#include "engine/seq_executor.h"
#include "pe_dataset.h"
#include "pe_models.h"

#define EVAL_BATCH 500
#define PROGRESS_EVERY 100 /* steps between progress lines (human mode) */

typedef struct train_cfg {
  const char *model, *executor, *places;
  long batch, epochs, steps, seed, threads;
  bool json, help;
} train_cfg;

/* Options as a table: --name VALUE or --name=VALUE; flags take no value. */
typedef enum opt_kind { OPT_STR, OPT_INT, OPT_FLAG } opt_kind;

typedef struct opt_row {
  const char *name;
  opt_kind kind;
  size_t off;
  long min, max;
  const char *help;
} opt_row;

#define CFG(f) offsetof(train_cfg, f)
static const opt_row opts[] = {
    {"model", OPT_STR, CFG(model), 0, 0, "mlp | cnn (required)"},
    {"executor", OPT_STR, CFG(executor), 0, 0, "sequential (default; others are not built yet)"},
    {"places", OPT_STR, CFG(places), 0, 0, "cpu:1 (default)"},
    {"batch", OPT_INT, CFG(batch), 1, 1 << 16, "mini-batch size (mlp 128, cnn 64)"},
    {"epochs", OPT_INT, CFG(epochs), 1, 1000, "passes over the 60,000 training images (1)"},
    {"steps", OPT_INT, CFG(steps), 1, 1L << 40, "cap on steps per epoch (none)"},
    {"seed", OPT_INT, CFG(seed), 0, 1L << 62, "initialisation, dropout and shuffling seed (1)"},
    {"threads", OPT_INT, CFG(threads), 0, 4096, "intra-op threads (0: all cores)"},
    {"json", OPT_FLAG, CFG(json), 0, 0, "print one JSON line on stdout"},
    {"help", OPT_FLAG, CFG(help), 0, 0, "this text"},
};

void pe_bench_train_usage(void) {
  fprintf(stderr, "usage: pe-bench train --model mlp|cnn [options]\n\noptions:\n");
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    fprintf(stderr, "  --%-9s %-6s %s\n", opts[i].name,
            opts[i].kind == OPT_FLAG  ? ""
            : opts[i].kind == OPT_INT ? "N"
                                      : "NAME",
            opts[i].help);
  fprintf(stderr,
          "\nsamples_per_sec counts training steps only; final_loss is the mean loss of the\n"
          "last epoch; test_accuracy is measured on all 10,000 test images.\n"
          "Data: $PE_FASHION_MNIST_DIR or " PE_FASHION_MNIST_DIR ".\n");
}

static int bad_args(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "pe-bench train: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n\n");
  pe_bench_train_usage();
  return 2;
}

static int parse_args(int argc, char **argv, train_cfg *c) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2) != 0) return bad_args("unexpected argument '%s'%s", arg, "");
    const char *eq = strchr(arg + 2, '=');
    size_t nlen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    const opt_row *o = NULL;
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
      if (strlen(opts[k].name) == nlen && !strncmp(opts[k].name, arg + 2, nlen)) o = &opts[k];
    if (!o) return bad_args("unknown option '%s'%s", arg, "");
    char *field = (char *)c + o->off;
    if (o->kind == OPT_FLAG) {
      if (eq) return bad_args("option '%s' takes no value%s", arg, "");
      *(bool *)field = true;
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!val) return bad_args("option '%s' needs a value%s", arg, "");
    if (o->kind == OPT_STR) {
      *(const char **)field = val;
      continue;
    }
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < o->min || v > o->max)
      return bad_args("option '--%s': bad number '%s'", o->name, val);
    *(long *)field = v;
  }
  return 0;
}

/* --- the training run ----------------------------------------------------------- */

typedef struct trainer {
  train_cfg cfg;
  pe_model m;
  pe_program *train, *eval;
  pe_scope *scope;
  pe_seq_exec *step, *test;
  pe_dataset *train_ds, *test_ds;
  float *x;
  int64_t *y;
} trainer;

typedef struct train_result {
  long steps, samples;
  double train_seconds, eval_seconds, final_loss, final_train_acc, test_acc;
} train_result;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail_st(pe_status *st, const char *what) {
  fprintf(stderr, "pe-bench train: %s: %s (%s)\n", what, pe_status_msg(st),
          pe_code_name(pe_status_code(st)));
  pe_status_free(st);
  return 1;
}

static int setup(trainer *t) {
  char err[512];
  if (pe_model_build(t->cfg.model, &t->m, err, sizeof err)) {
    fprintf(stderr, "pe-bench train: %s\n", err);
    return 1;
  }
  if (!t->cfg.batch) t->cfg.batch = t->m.default_batch;
  const char *dir = pe_dataset_default_dir();
  if (pe_dataset_open(dir, "train", &t->train_ds, err, sizeof err) ||
      pe_dataset_open(dir, "t10k", &t->test_ds, err, sizeof err)) {
    fprintf(stderr, "pe-bench train: %s\n", err);
    return 1;
  }
  /* Standardise both splits with the training split's statistics. */
  float mean, std;
  pe_dataset_stats(t->train_ds, &mean, &std);
  pe_dataset_normalize(t->train_ds, mean, std);
  pe_dataset_normalize(t->test_ds, mean, std);
  pe_program *p = NULL;
  pe_status *st = pe_program_decode(t->m.bytes, t->m.len, &p);
  if (st) return fail_st(st, "decode");
  st = pe_program_clone(p, &t->train);
  if (!st) st = pe_program_clone(p, &t->eval);
  pe_program_free(p);
  if (st) return fail_st(st, "clone");
  if ((st = pe_program_compile(t->train, false))) return fail_st(st, "compile train program");
  if ((st = pe_program_compile(t->eval, true))) return fail_st(st, "compile eval program");
  t->scope = pe_scope_new(NULL);
  if (!t->scope) return fail_st(pe_error(PE_ENOMEM, "model scope"), "setup");
  pe_exec_opts eo = {.seed = (uint64_t)t->cfg.seed, .threads = (int)t->cfg.threads};
  /* The train program's startup block also initialises the optimizer state
   * and learning rate the optimizer pass added. */
  pe_seq_exec *init = NULL;
  if ((st = pe_seq_exec_new(t->train, t->train->startup_block, t->scope, &eo, &init)))
    return fail_st(st, "startup executor");
  st = pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL);
  pe_seq_exec_free(init);
  if (st) return fail_st(st, "startup run");
  if ((st = pe_seq_exec_new(t->train, t->train->main_block, t->scope, &eo, &t->step)))
    return fail_st(st, "train executor");
  if ((st = pe_seq_exec_new(t->eval, t->eval->main_block, t->scope, &eo, &t->test)))
    return fail_st(st, "eval executor");
  size_t cap = (size_t)(t->cfg.batch > EVAL_BATCH ? t->cfg.batch : EVAL_BATCH);
  t->x = malloc(cap * (size_t)t->train_ds->dim * sizeof *t->x);
  t->y = malloc(cap * sizeof *t->y);
  if (!t->x || !t->y) return fail_st(pe_error(PE_ENOMEM, "batch buffers"), "setup");
  return 0;
}

static void teardown(trainer *t) {
  pe_seq_exec_free(t->step);
  pe_seq_exec_free(t->test);
  if (t->scope) pe_scope_free(t->scope);
  pe_program_free(t->train);
  pe_program_free(t->eval);
  pe_dataset_free(t->train_ds);
  pe_dataset_free(t->test_ds);
  pe_model_release(&t->m);
  free(t->x);
  free(t->y);
}

/* One run of `e` on n examples in t->x / t->y; fetched as asked. */
static pe_status *run_batch(trainer *t, pe_seq_exec *e, int n, const char *const *fetch,
                            int n_fetch, const pe_tensor **out) {
  pe_shape xs = pe_shape_make(t->m.image_ndim, t->m.image_dims), ys = PE_SHAPE(n, 1);
  xs.d[0] = n;
  pe_tensor xt, yt;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_view(&xt, PE_F32, &xs, t->x);
  pe_tensor_view(&yt, PE_I64, &ys, t->y);
  pe_feed feeds[2] = {{t->m.image, &xt}, {t->m.label, &yt}};
  return pe_seq_exec_run(e, feeds, 2, fetch, n_fetch, out);
}

static int train_loop(trainer *t, train_result *r) {
  pe_batcher *bt = pe_batcher_new(t->train_ds, (int)t->cfg.batch, true, (uint64_t)t->cfg.seed);
  if (!bt) return fail_st(pe_error(PE_ENOMEM, "batcher"), "setup");
  const char *fetch[2] = {t->m.loss, t->m.accuracy};
  const pe_tensor *out[2];
  double t0 = now_s(), tp = t0;
  long tp_samples = 0;
  int rc = 0;
  for (long ep = 1; ep <= t->cfg.epochs && !rc; ep++) {
    double loss_sum = 0, acc_sum = 0;
    long ep_samples = 0, ep_steps = 0;
    int n;
    while ((t->cfg.steps == 0 || ep_steps < t->cfg.steps) && pe_batcher_next(bt, t->x, t->y, &n)) {
      pe_status *st = run_batch(t, t->step, n, fetch, 2, out);
      if (st) {
        char what[64];
        snprintf(what, sizeof what, "train step %ld", r->steps + 1);
        rc = fail_st(st, what);
        break;
      }
      loss_sum += (double)pe_f32(out[0])[0] * n;
      acc_sum += (double)pe_f32(out[1])[0] * n;
      ep_samples += n;
      ep_steps++;
      r->steps++;
      r->samples += n;
      if (!t->cfg.json && r->steps % PROGRESS_EVERY == 0) {
        double now = now_s();
        fprintf(stderr, "epoch %ld step %ld: loss %.4f, %.0f samples/s\n", ep, r->steps,
                pe_f32(out[0])[0], (r->samples - tp_samples) / (now - tp));
        tp = now;
        tp_samples = r->samples;
      }
    }
    if (t->cfg.steps) pe_batcher_reset(bt); /* a capped epoch: start the next one fresh */
    if (ep_samples) {
      r->final_loss = loss_sum / ep_samples;
      r->final_train_acc = acc_sum / ep_samples;
    }
    if (!t->cfg.json && !rc)
      fprintf(stderr,
              "epoch %ld done: %ld steps, mean loss %.4f, train accuracy %.4f, %.0f samples/s\n",
              ep, ep_steps, r->final_loss, r->final_train_acc, r->samples / (now_s() - t0));
  }
  r->train_seconds = now_s() - t0;
  pe_batcher_free(bt);
  return rc;
}

static int evaluate(trainer *t, train_result *r) {
  pe_batcher *bt = pe_batcher_new(t->test_ds, EVAL_BATCH, false, 0);
  if (!bt) return fail_st(pe_error(PE_ENOMEM, "batcher"), "setup");
  const char *fetch[1] = {t->m.correct};
  const pe_tensor *out[1];
  double t0 = now_s();
  int64_t correct = 0, seen = 0;
  int n, rc = 0;
  while (pe_batcher_next(bt, t->x, t->y, &n)) {
    pe_status *st = run_batch(t, t->test, n, fetch, 1, out);
    if (st) {
      rc = fail_st(st, "eval");
      break;
    }
    correct += pe_i64(out[0])[0];
    seen += n;
  }
  r->eval_seconds = now_s() - t0;
  r->test_acc = seen ? (double)correct / (double)seen : 0;
  pe_batcher_free(bt);
  return rc;
}

int pe_bench_train(int argc, char **argv) {
  trainer t = {.cfg = {.executor = "sequential", .places = "cpu:1", .epochs = 1, .seed = 1}};
  int rc = parse_args(argc, argv, &t.cfg);
  if (rc) return rc;
  if (t.cfg.help) {
    pe_bench_train_usage();
    return 0;
  }
  if (!t.cfg.model) return bad_args("--model is required (%s)%s", pe_model_names(), "");
  if (strcmp(t.cfg.model, "mlp") && strcmp(t.cfg.model, "cnn"))
    return bad_args("unknown model '%s' (known: %s)", t.cfg.model, pe_model_names());
  if (strcmp(t.cfg.executor, "sequential"))
    return bad_args("executor '%s' is not built yet (available: sequential)%s", t.cfg.executor, "");
  if (strcmp(t.cfg.places, "cpu:1"))
    return bad_args("places '%s' not supported: the sequential executor runs on cpu:1%s",
                    t.cfg.places, "");
  train_result r = {0};
  rc = setup(&t);
  if (!rc && !t.cfg.json)
    fprintf(stderr, "pe-bench train: model %s, batch %ld, %ld epoch(s), executor %s on %s\n",
            t.cfg.model, t.cfg.batch, t.cfg.epochs, t.cfg.executor, t.cfg.places);
  if (!rc) rc = train_loop(&t, &r);
  if (!rc) rc = evaluate(&t, &r);
  if (!rc) {
    double sps = r.train_seconds > 0 ? r.samples / r.train_seconds : 0;
    if (t.cfg.json)
      printf(
          "{\"bench\":\"train\",\"model\":\"%s\",\"executor\":\"%s\",\"places\":\"%s\","
          "\"batch\":%ld,\"epochs\":%ld,\"steps\":%ld,\"samples\":%ld,\"seed\":%ld,"
          "\"threads\":%ld,\"samples_per_sec\":%.1f,\"train_seconds\":%.3f,"
          "\"eval_seconds\":%.3f,\"test_accuracy\":%.4f,\"final_loss\":%.5f,"
          "\"final_loss_window\":\"last_epoch\",\"final_train_accuracy\":%.4f}\n",
          t.cfg.model, t.cfg.executor, t.cfg.places, t.cfg.batch, t.cfg.epochs, r.steps, r.samples,
          t.cfg.seed, t.cfg.threads, sps, r.train_seconds, r.eval_seconds, r.test_acc, r.final_loss,
          r.final_train_acc);
    else
      printf(
          "%s: %ld steps in %.2f s (%.0f samples/s), last-epoch loss %.4f, "
          "test accuracy %.4f\n",
          t.cfg.model, r.steps, r.train_seconds, sps, r.final_loss, r.test_acc);
  }
  teardown(&t);
  return rc;
}
