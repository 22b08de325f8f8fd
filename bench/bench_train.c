/* pe-bench train: trains a model from pe_models.h on Fashion-MNIST in-process
 * and evaluates it on all 10,000 test images, with the sequential reference
 * executor or the parallel executor (bench_train_par.c); the loop, the data
 * and the JSON keys are shared, so the numbers compare directly.
 *
 * Sequential flow: builder bytes -> pe_program_decode -> two clones,
 * compiled as the train program (backward + optimizer) and the eval program
 * (for_test) -> one model scope shared by three sequential executors: the
 * train program's startup block (run once: parameters, learning rate,
 * optimizer state), the train step and the eval pass.
 *
 * Inputs are standardised with the training split's pixel mean and std.
 *
 * Reported: samples_per_sec = training samples / training wall time (the
 * step loop only: no start-up, compile or eval); final_loss = the mean loss
 * over the last epoch's steps (weighted by batch size), stated in the JSON as
 * "final_loss_window": "last_epoch".
 *
 * With a backend that has steps_split (parallel) and --prefetch on, every
 * epoch's batches come from a pe_prefetch whose thread reads batch k+1 from
 * the batcher and splits it onto the places while step k runs: the same
 * batches in the same order as without it. --steps-per-run N hands the
 * executor N steps per call (pe_par_exec_run_steps: the pool worker that
 * ends a step starts the next); 0, the default, the whole epoch. */
#include "bench_train.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_places.h"
#include "compiler/pass.h"
#include "core/fpenv.h"
#include "core/omp_policy.h"
#include "core/scope.h"
#include "engine/device.h"
#include "engine/seq_executor.h"
#include "engine/step_graph_key.h"
#include "ir/program.h"
#include "json_out.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "ops/cpu/dnnl_util.h"
#include "out_path.h"
#include "pe_model_file.h"
#include "pe_recipe.h"
#include "roofline.h"

#define EVAL_BATCH 500
#define PROGRESS_EVERY 100 /* steps between progress lines (human mode) */

/* Options as a table: --name VALUE or --name=VALUE; flags take no value;
 * on/off options take an optional "on" or "off" (bare: on). */
typedef enum opt_kind { OPT_STR, OPT_INT, OPT_FLAG, OPT_ONOFF } opt_kind;

typedef struct opt_row {
  const char *name;
  opt_kind kind;
  size_t off;
  long min, max;
  const char *help;
} opt_row;

#define CFG(f) offsetof(train_cfg, f)
static const opt_row opts[] = {
    {"model", OPT_STR, CFG(model), 0, 0, "mlp | cnn | FILE: a model file (required)"},
    {"executor", OPT_STR, CFG(executor), 0, 0,
     "sequential | parallel (default: sequential; parallel on cuda places)"},
    {"places", OPT_STR, CFG(places), 0, 0,
     "cpu:N | sim:N | cuda:0 | auto: the fastest cpu places and strategy of a timed trial "
     "(parallel; sequential: cpu:1)"},
    {"batch", OPT_INT, CFG(batch), 1, 1 << 16, "mini-batch size (mlp 128, cnn 64)"},
    {"epochs", OPT_INT, CFG(epochs), 1, 1000, "passes over the 60,000 training images (1)"},
    {"steps", OPT_INT, CFG(steps), 1, 1L << 40, "cap on steps per epoch (none)"},
    {"seed", OPT_INT, CFG(seed), 0, 1L << 62, "initialisation, dropout and shuffling seed (1)"},
    {"threads", OPT_INT, CFG(threads), 0, 4096,
     "sequential: intra-op threads; parallel: pool workers (0: one per cpu or cuda place, else all "
     "cores)"},
    {"strategy", OPT_STR, CFG(strategy), 0, 0,
     "parallel: auto (default: sharded on cpu/sim, allreduce on cuda) | allreduce | reduce | "
     "sharded"},
    {"fuse", OPT_ONOFF, CFG(fuse), 0, 0,
     "parallel: fuse gradient all-reduces into buckets [on|off]"},
    {"fuse-bucket", OPT_INT, CFG(fuse_bucket), 0, 1L << 40,
     "parallel: fuse bucket bytes (0: 4 MiB default)"},
    {"sync", OPT_STR, CFG(sync), 0, 0, "parallel: cross-stream sync, event (default) | producer"},
    {"dump-graph", OPT_STR, CFG(dump_graph), 0, 0, "parallel: write the train graph's Graphviz"},
    {"timeline", OPT_STR, CFG(timeline), 0, 0, "parallel: write a Chrome trace of every step"},
    {"steps-per-run", OPT_INT, CFG(steps_per_run), 0, 1L << 40,
     "parallel with prefetch: steps per executor call, chained by the pool (0: the epoch)"},
    {"prefetch", OPT_ONOFF, CFG(prefetch), 0, 0,
     "parallel: split the next batch onto the places while a step runs [on|off] (on)"},
    {"compare-sequential", OPT_FLAG, CFG(compare_sequential), 0, 0,
     "parallel: first run the cpu:1 sequential baseline (1 thread) here; report both"},
    {"cuda-graph", OPT_STR, CFG(cuda_graph), 0, 0,
     "capture each step as a CUDA graph and replay it: auto (default: on for cuda places once "
     "verified on a GPU) | on | off"},
    {"conv-algo", OPT_STR, CFG(conv_algo), 0, 0,
     "default (pe's Winograd for 3x3 and 5x5 filters on AVX2, 5x5 on AVX-512, else direct) | "
     "direct | gemm | winograd | auto | time: the fastest per shape"},
    {"conv-layout", OPT_STR, CFG(conv_layout), 0, 0,
     "blocked (default): activations between convolutions and pools in oneDNN's layout | "
     "plain"},
    {"denormals", OPT_STR, CFG(denormals), 0, 0,
     "flush (default): kernel threads flush denormals to zero | keep"},
    {"fuse-ops", OPT_ONOFF, CFG(fuse_ops), 0, 0,
     "conv2d / matmul + bias add + relu, batch_norm + relu, residual add + relu, as one op, "
     "as the daemon does [on|off] (on)"},
    {"roofline", OPT_ONOFF, CFG(roofline), 0, 0,
     "after training, time the step's GEMMs and convolutions alone in oneDNN and report the "
     "fraction of the step they are [on|off] (on; cpu places)"},
    {"check-nan-inf", OPT_FLAG, CFG(check_nan_inf), 0, 0,
     "debug: fail at the first op that writes NaN/Inf, naming it (slower; not cuda)"},
    {"json", OPT_FLAG, CFG(json), 0, 0, "print one JSON line on stdout"},
    {"help", OPT_FLAG, CFG(help), 0, 0, "this text"},
};

void pe_bench_train_usage(FILE *f) {
  fprintf(f, "usage: pe-bench train --model mlp|cnn|FILE [options]\n\noptions:\n");
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    fprintf(f, "  --%-18s %-6s %s\n", opts[i].name,
            opts[i].kind == OPT_FLAG    ? ""
            : opts[i].kind == OPT_INT   ? "N"
            : opts[i].kind == OPT_ONOFF ? "[on]"
                                        : "NAME",
            opts[i].help);
  fprintf(f,
          "\nsamples_per_sec counts training steps only; final_loss is the mean loss of the\n"
          "last epoch; test_accuracy is measured on all 10,000 test images.\n"
          "Data: $PE_FASHION_MNIST_DIR or " PE_FASHION_MNIST_DIR ".\n");
}

static int bad_args(const char *fmt, const char *a, const char *b) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, a, b);
  pe_bench_error("USAGE", "%s", msg);
  fputc('\n', stderr);
  pe_bench_train_usage(stderr);
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
    if (o->kind == OPT_ONOFF) {
      const char *val =
          eq                                                                            ? eq + 1
          : i + 1 < argc && (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "off")) ? argv[++i]
                                                                                        : "on";
      if (strcmp(val, "on") && strcmp(val, "off"))
        return bad_args("option '%s' takes on or off%s", arg, "");
      *(const char **)field = val;
      continue;
    }
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
    if (errno || end == val || *end || v < o->min || v > o->max) {
      char range[64]; /* as pe-client says it */
      snprintf(range, sizeof range, "' is not a number in [%ld, %ld]", o->min, o->max);
      char what[160];
      snprintf(what, sizeof what, "option '--%s': '%s", o->name, val);
      return bad_args("%s%s", what, range);
    }
    *(long *)field = v;
  }
  return 0;
}

/* --- the sequential backend ------------------------------------------------------ */

typedef struct seq_state {
  pe_program *train, *eval;
  pe_scope *scope;
  pe_seq_exec *step, *test;
  /* The model's generator, shared by its startup, step and eval executors
   * as the parallel executor's model shares one: the same dropout masks. */
  pe_rng rng;
} seq_state;

int pe_bench_train_fail(pe_status *st, const char *what) {
  const char *code = pe_code_name(pe_status_code(st));
  pe_bench_error(code, "%s: %s (%s)", what, pe_status_msg(st), code);
  pe_status_free(st);
  return 1;
}
#define fail_st pe_bench_train_fail

static int seq_setup(trainer *t) {
  seq_state *s = calloc(1, sizeof *s);
  if (!s) return fail_st(pe_error(PE_ENOMEM, "sequential executor state"), "setup");
  t->impl = s;
  pe_program *p = NULL;
  pe_status *st = pe_program_decode(t->m.bytes, t->m.len, &p);
  if (st) return fail_st(st, "decode");
  st = pe_program_clone(p, &s->train);
  if (!st) st = pe_program_clone(p, &s->eval);
  pe_program_free(p);
  if (st) return fail_st(st, "clone");
  /* The step fetches the loss and the accuracy only. */
  const char *keep[1] = {t->m.accuracy};
  pe_pass_opts po = {.n_keep = 1, .keep = keep, .fuse_conv_act = train_cfg_fuse_ops(&t->cfg)};
  if ((st = pe_program_compile_opts(s->train, false, &po)))
    return fail_st(st, "compile train program");
  if ((st = pe_program_compile_opts(s->eval, true, &po)))
    return fail_st(st, "compile eval program");
  s->scope = pe_scope_new(NULL);
  if (!s->scope) return fail_st(pe_error(PE_ENOMEM, "model scope"), "setup");
  pe_rng_init(&s->rng, t->cfg.seed ? (uint64_t)t->cfg.seed : 1); /* as pe_model_new */
  pe_exec_opts eo = {.seed = (uint64_t)t->cfg.seed,
                     .threads = (int)t->cfg.threads,
                     .keep_denormals = train_cfg_keep_denormals(&t->cfg),
                     .rng = &s->rng,
                     .check_nan_inf = t->cfg.check_nan_inf};
  t->threads_used = eo.threads > 0 ? eo.threads : pe_cpu_cores(); /* as pe_device_ctx_init */
  t->place_batch = t->cfg.batch;
  t->place_threads = t->threads_used;
  /* The train program's startup block also initialises the optimizer state
   * and learning rate the optimizer pass added. */
  pe_seq_exec *init = NULL;
  if ((st = pe_seq_exec_new(s->train, s->train->startup_block, s->scope, &eo, &init)))
    return fail_st(st, "startup executor");
  st = pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL);
  pe_seq_exec_free(init);
  if (st) return fail_st(st, "startup run");
  if ((st = pe_seq_exec_new(s->train, s->train->main_block, s->scope, &eo, &s->step)))
    return fail_st(st, "train executor");
  if ((st = pe_seq_exec_new(s->eval, s->eval->main_block, s->scope, &eo, &s->test)))
    return fail_st(st, "eval executor");
  return 0;
}

static void seq_teardown(trainer *t) {
  seq_state *s = t->impl;
  if (!s) return;
  pe_seq_exec_free(s->step);
  pe_seq_exec_free(s->test);
  if (s->scope) pe_scope_free(s->scope);
  pe_program_free(s->train);
  pe_program_free(s->eval);
  free(s);
  t->impl = NULL;
}

/* One run of `e` on n examples in t->x / t->y; fetched as asked. */
static pe_status *seq_run(trainer *t, pe_seq_exec *e, int n, const char *const *fetch, int n_fetch,
                          const pe_tensor **out) {
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

static pe_status *seq_step(trainer *t, int n, float *loss, float *acc) {
  seq_state *s = t->impl;
  const char *fetch[2] = {t->m.loss, t->m.accuracy};
  const pe_tensor *out[2];
  pe_status *st = seq_run(t, s->step, n, fetch, 2, out);
  if (st) return st;
  *loss = pe_f32(out[0])[0];
  *acc = pe_f32(out[1])[0];
  return NULL;
}

static pe_status *seq_eval(trainer *t, int n, int64_t *correct) {
  seq_state *s = t->impl;
  const char *fetch[1] = {t->m.correct};
  const pe_tensor *out[1];
  pe_status *st = seq_run(t, s->test, n, fetch, 1, out);
  if (!st) *correct = pe_i64(out[0])[0];
  return st;
}

/* The keys the parallel line has, with the same meaning: one thread runs
 * the ops (the caller's), each kernel on a team of --threads; one place. */
static void seq_json(trainer *t, FILE *f) {
  fprintf(f, ",\"pool_workers\":1,\"intra_op_threads\":%d,\"strategy\":\"single\"",
          t->threads_used);
}

const train_backend pe_train_sequential = {.executor = "sequential",
                                           .setup = seq_setup,
                                           .step = seq_step,
                                           .eval = seq_eval,
                                           .teardown = seq_teardown,
                                           .json_extra = seq_json};

/* --- the training run ----------------------------------------------------------- */

static const train_backend *const backends[] = {&pe_train_sequential, &pe_train_parallel};

typedef struct train_result {
  long steps, samples, test_examples;
  pe_dnnl_reorder_count reorders; /* layout reorders run by the training steps */
  double train_seconds, eval_seconds, final_loss, final_train_acc, test_acc;
} train_result;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int setup(trainer *t) {
  char err[512];
  if (pe_model_resolve(t->cfg.model, &t->m, err, sizeof err)) {
    pe_bench_error("FAILED", "%s", err);
    return 1;
  }
  /* Without an optimizer (a model file without an 'optimizer' line) the
   * steps would compute gradients and change nothing. */
  const char *opt = pe_program_optimizer(t->m.bytes, t->m.len);
  if (opt && !*opt) {
    pe_bench_error("FAILED",
                   "%s: the model has no optimizer, so training would change nothing: give it an "
                   "'optimizer' line (conf/models/README.md)",
                   t->cfg.model);
    return 1;
  }
  if (!t->cfg.batch) t->cfg.batch = t->m.default_batch;
  const char *dir = pe_dataset_default_dir();
  if ((!t->borrowed_data && (pe_dataset_open(dir, "train", &t->train_ds, err, sizeof err) ||
                             pe_dataset_open(dir, "t10k", &t->test_ds, err, sizeof err))) ||
      pe_dataset_check_input(t->train_ds, t->m.image, t->m.image_ndim, t->m.image_dims, err,
                             sizeof err)) {
    pe_bench_error("FAILED", "%s", err);
    return 1;
  }
  /* A batch larger than the data set would be one short batch per epoch
   * reported under the asked size: refused (exit 2). */
  if (t->cfg.batch > t->train_ds->n) {
    pe_bench_error("USAGE", "--batch %ld is larger than the %lld training examples", t->cfg.batch,
                   (long long)t->train_ds->n);
    return 2;
  }
  /* Standardise both splits with the training split's statistics (borrowed
   * splits are already). */
  if (!t->borrowed_data) {
    float mean, std;
    pe_dataset_stats(t->train_ds, &mean, &std);
    pe_dataset_normalize(t->train_ds, mean, std);
    pe_dataset_normalize(t->test_ds, mean, std);
  }
  size_t cap = (size_t)(t->cfg.batch > EVAL_BATCH ? t->cfg.batch : EVAL_BATCH);
  t->x = malloc(cap * (size_t)t->train_ds->dim * sizeof *t->x);
  t->y = malloc(cap * sizeof *t->y);
  if (!t->x || !t->y) return fail_st(pe_error(PE_ENOMEM, "batch buffers"), "setup");
  return t->be->setup(t);
}

static void teardown(trainer *t) {
  if (t->be) t->be->teardown(t);
  if (!t->borrowed_data) {
    pe_dataset_free(t->train_ds);
    pe_dataset_free(t->test_ds);
  }
  pe_model_spec_release(&t->m);
  free(t->x);
  free(t->y);
}

/* The prefetcher's producer (prefetch thread only; the loop does not touch
 * the batcher while a prefetcher runs): claims the next batch of the epoch
 * and sizes the inputs like the feeds of a step, or says the end at the
 * epoch's end or --steps cap. fill_rows then copies the batch's rows, one
 * call per place (on the places' pool workers where the backend says so). */
typedef struct epoch_feed {
  trainer *t;
  pe_batcher *bt;
  long produced, cap; /* cap 0: the whole epoch */
  const int64_t *idx; /* the claimed batch's examples, until the next claim */
} epoch_feed;

static pe_status *produce_batch(void *ctx, pe_tensor *in, int n_in, bool *end) {
  epoch_feed *f = ctx;
  const trainer *t = f->t;
  (void)n_in; /* 2: images, labels */
  int n;
  if ((f->cap && f->produced >= f->cap) || !pe_batcher_claim(f->bt, &f->idx, &n)) {
    *end = true;
    return NULL;
  }
  pe_shape xs = pe_shape_make(t->m.image_ndim, t->m.image_dims), ys = PE_SHAPE(n, 1);
  xs.d[0] = n;
  PE_TRY(pe_tensor_resize(&in[0], PE_F32, &xs, t->m.image));
  PE_TRY(pe_tensor_resize(&in[1], PE_I64, &ys, t->m.label));
  f->produced++;
  return NULL;
}

static pe_status *fill_rows(void *ctx, pe_tensor *in, int n_in, int64_t lo, int64_t hi) {
  epoch_feed *f = ctx;
  (void)n_in;
  pe_dataset_gather(f->t->train_ds, f->idx, (int)lo, (int)hi, pe_f32(&in[0]), pe_i64(&in[1]));
  return NULL;
}

/* One epoch's running sums; account() may run on a pool worker (the
 * parallel backend's steps_split), one step at a time, in step order. */
typedef struct epoch_acc {
  trainer *t;
  train_result *r;
  long ep;
  double loss_sum, acc_sum;
  long samples, steps;
  double tp; /* progress lines: time and samples of the last one */
  long tp_samples;
} epoch_acc;

static void account(void *ctx, int n, float loss, float acc) {
  epoch_acc *a = ctx;
  train_result *r = a->r;
  a->loss_sum += (double)loss * n;
  a->acc_sum += (double)acc * n;
  a->samples += n;
  a->steps++;
  r->steps++;
  r->samples += n;
  if (!a->t->cfg.json && r->steps % PROGRESS_EVERY == 0) {
    double now = now_s();
    fprintf(stderr, "epoch %ld step %ld: loss %.4f, %.0f samples/s\n", a->ep, r->steps, loss,
            (r->samples - a->tp_samples) / (now - a->tp));
    a->tp = now;
    a->tp_samples = r->samples;
  }
}

static int train_step_failed(pe_status *st, const train_result *r) {
  char what[64];
  snprintf(what, sizeof what, "train step %ld", r->steps + 1);
  return fail_st(st, what);
}

/* The epoch's steps on batches a pe_prefetch splits onto the places. */
static int prefetched_steps(trainer *t, epoch_feed *feed, epoch_acc *acc) {
  pe_prefetch_opts po = {
      .n_inputs = 2, .depth = 2, .produce = produce_batch, .fill = fill_rows, .ctx = feed};
  po.n_places = t->be->split_places(t, &po.devices, &po.pool);
  /* Pool workers fill a batch in their idle time, which may come only at
   * the end of a step: a third slot keeps the next batch ready. */
  if (po.pool) po.depth = 3;
  pe_prefetch *pf = NULL;
  pe_status *st = pe_prefetch_start(&po, &pf);
  if (st) return fail_st(st, "input prefetch");
  bool end = false;
  while (!end && !st) st = t->be->steps_split(t, pf, t->cfg.steps_per_run, account, acc, &end);
  pe_prefetch_stop(pf);
  return st ? train_step_failed(st, acc->r) : 0;
}

static int train_loop(trainer *t, train_result *r) {
  pe_batcher *bt = pe_batcher_new(t->train_ds, (int)t->cfg.batch, true, (uint64_t)t->cfg.seed);
  if (!bt) return fail_st(pe_error(PE_ENOMEM, "batcher"), "setup");
  double t0 = now_s();
  pe_dnnl_reorder_count re0 = pe_dnnl_reorders_run();
  epoch_acc acc = {.t = t, .r = r, .tp = t0};
  int rc = 0;
  bool use_pf = t->be->steps_split && t->be->split_places && train_cfg_prefetch(&t->cfg);
  for (long ep = 1; ep <= t->cfg.epochs && !rc; ep++) {
    acc = (epoch_acc){.t = t, .r = r, .ep = ep, .tp = acc.tp, .tp_samples = acc.tp_samples};
    /* One prefetcher per epoch: its producer ends with the epoch, and the
     * batcher is reset below only after the thread stopped. */
    if (use_pf) {
      epoch_feed feed = {t, bt, 0, t->cfg.steps};
      rc = prefetched_steps(t, &feed, &acc);
    } else {
      int n;
      float loss, a;
      while (!rc && !(t->cfg.steps && acc.steps >= t->cfg.steps) &&
             pe_batcher_next(bt, t->x, t->y, &n)) {
        pe_status *st = t->be->step(t, n, &loss, &a);
        if (st)
          rc = train_step_failed(st, r);
        else
          account(&acc, n, loss, a);
      }
    }
    if (t->cfg.steps) pe_batcher_reset(bt); /* a capped epoch: start the next one fresh */
    if (acc.samples) {
      r->final_loss = acc.loss_sum / acc.samples;
      r->final_train_acc = acc.acc_sum / acc.samples;
    }
    if (!t->cfg.json && !rc)
      fprintf(stderr,
              "epoch %ld done: %ld steps, mean loss %.4f, train accuracy %.4f, %.0f samples/s\n",
              ep, acc.steps, r->final_loss, r->final_train_acc, r->samples / (now_s() - t0));
  }
  if (!rc && t->be->finish) {
    pe_status *st = t->be->finish(t);
    if (st) rc = train_step_failed(st, r);
  }
  r->train_seconds = now_s() - t0;
  pe_dnnl_reorder_count re1 = pe_dnnl_reorders_run();
  r->reorders = (pe_dnnl_reorder_count){re1.runs - re0.runs, re1.bytes - re0.bytes};
  pe_batcher_free(bt);
  return rc;
}

struct pe_bench_stepper {
  trainer t;
};

int pe_bench_stepper_open(const train_cfg *cfg, const pe_bench_stepper *data_of,
                          pe_bench_stepper **out) {
  *out = NULL;
  pe_bench_stepper *sp = calloc(1, sizeof *sp);
  if (!sp) return fail_st(pe_error(PE_ENOMEM, "places trial"), "setup");
  trainer *t = &sp->t;
  *t = (trainer){.cfg = *cfg, .be = &pe_train_parallel};
  if (data_of) {
    t->train_ds = data_of->t.train_ds;
    t->test_ds = data_of->t.test_ds;
    t->borrowed_data = true;
  }
  t->cfg.json = true; /* no progress lines */
  t->cfg.epochs = 1;
  t->cfg.timeline = t->cfg.dump_graph = NULL;
  int rc = setup(t);
  long done;
  double seconds;
  /* The warm-up: first allocations, primitive creation. */
  if (!rc) rc = pe_bench_stepper_run(sp, 1, &done, &seconds);
  if (rc) {
    pe_bench_stepper_close(sp);
    return rc;
  }
  *out = sp;
  return 0;
}

int pe_bench_stepper_run(pe_bench_stepper *sp, long steps, long *done, double *seconds) {
  sp->t.cfg.steps = steps;
  train_result r = {0};
  int rc = train_loop(&sp->t, &r);
  *done = r.steps;
  *seconds = r.train_seconds;
  return rc;
}

void pe_bench_stepper_close(pe_bench_stepper *sp) {
  if (!sp) return;
  teardown(&sp->t);
  free(sp);
}

static int evaluate(trainer *t, train_result *r) {
  pe_batcher *bt = pe_batcher_new(t->test_ds, EVAL_BATCH, false, 0);
  if (!bt) return fail_st(pe_error(PE_ENOMEM, "batcher"), "setup");
  double t0 = now_s();
  int64_t correct = 0, seen = 0;
  int n, rc = 0;
  while (pe_batcher_next(bt, t->x, t->y, &n)) {
    int64_t c = 0;
    pe_status *st = t->be->eval(t, n, &c);
    if (st) {
      rc = fail_st(st, "eval");
      break;
    }
    correct += c;
    seen += n;
  }
  r->eval_seconds = now_s() - t0;
  r->test_acc = seen ? (double)correct / (double)seen : 0;
  r->test_examples = (long)seen;
  pe_batcher_free(bt);
  return rc;
}

/* Keys of the JSON line besides the loop's and the backend's. "threads"
 * (--threads as resolved: intra_op_threads for the sequential executor,
 * pool_workers for the parallel one) stays for scripts written against it;
 * pool_workers and intra_op_threads mean the same on both (json_extra). */
static void json_run_keys(const trainer *t, const train_result *r) {
  /* Whether steps ran as captured CUDA graphs, and why not. */
  pe_cuda_graph_mode mode = PE_CUDA_GRAPH_AUTO;
  if (t->cfg.cuda_graph) pe_cuda_graph_mode_parse(t->cfg.cuda_graph, &mode);
  pe_place_kind kind = PE_PLACE_CPU;
  int n_places;
  pe_status *st = pe_places_parse(t->cfg.places, &kind, &n_places);
  pe_status_free(st);
  const char *why;
  bool on =
      pe_cuda_graph_decide(mode, kind, n_places, pe_device_kind_ops(PE_PLACE_CUDA) != NULL, &why);
  printf(",\"cuda_graph\":%s,\"cuda_graph_reason\":", on ? "true" : "false");
  cli_json_str(stdout, on ? "" : why);
  /* Per training step, all places together (oneDNN layout reorders around
   * the convolutions, docs/ops.md "Convolution layouts"). */
  double steps = r->steps > 0 ? (double)r->steps : 1;
  printf(",\"layout_reorders_per_step\":%.1f,\"layout_reorder_mb_per_step\":%.2f",
         (double)r->reorders.runs / steps, (double)r->reorders.bytes / steps / 1e6);
  printf(",\"test_examples\":%ld,\"omp_wait_policy\":", r->test_examples);
  const char *omp = pe_omp_policy_value();
  if (omp)
    cli_json_str(stdout, omp);
  else
    printf("null");
}

/* The roofline of t's training step (roofline.h), after the run: one
 * place's share of the batch on one place's team. *measured stays false
 * where it does not apply (cuda or sim places, no step). */
#define ROOF_WARMUP 2
#define ROOF_REPEATS 5
#define ROOF_PEAK_TRIES 20      /* the FMA peak's runs, the fastest kept */
#define ROOF_PEAK_SECONDS 0.001 /* each: within another tenant's time slice */
static int roofline_measure(const trainer *t, const train_result *r, pe_roof_totals *out,
                            bool *measured) {
  *measured = false;
  if (!train_cfg_roofline(&t->cfg) || t->place_threads < 1 || r->steps < 1) return 0;
  pe_roof_list l;
  pe_status *st = pe_roof_collect_model(t->m.bytes, t->m.len, t->m.accuracy,
                                        train_cfg_fuse_ops(&t->cfg), t->place_batch, &l);
  if (!st) st = pe_roof_time(&l, t->place_threads, ROOF_WARMUP, ROOF_REPEATS, out);
  pe_roof_list_free(&l);
  if (st) return fail_st(st, "--roofline");
  pe_fma_peak_measure(t->place_threads, ROOF_PEAK_TRIES, ROOF_PEAK_SECONDS, &out->peak);
  *measured = true;
  return 0;
}

/* Set up, train, evaluate and tear down one trainer. */
static int run_one(trainer *t, train_result *r) {
  int rc = setup(t);
  if (!rc && !t->cfg.json)
    fprintf(stderr, "pe-bench train: model %s, batch %ld, %ld epoch(s), executor %s on %s\n",
            t->cfg.model, t->cfg.batch, t->cfg.epochs, t->cfg.executor, t->cfg.places);
  if (!rc) rc = train_loop(t, r);
  if (!rc) rc = evaluate(t, r);
  pe_status *st = !rc && t->be->write_outputs ? t->be->write_outputs(t) : NULL;
  if (st) rc = fail_st(st, "output");
  return rc; /* the caller tears down (after printing) */
}

int pe_bench_train(int argc, char **argv) {
  trainer t = {.cfg = {.epochs = 1, .seed = 1}};
  int rc = parse_args(argc, argv, &t.cfg);
  if (rc) return rc;
  if (t.cfg.help) {
    pe_bench_train_usage(stdout);
    return 0;
  }
  if (!t.cfg.model) return bad_args("--model is required (%s)%s", pe_model_spec_names(), "");
  /* Only the parallel executor runs on cuda places, so they imply it. */
  if (!t.cfg.executor)
    t.cfg.executor = t.cfg.places && !strncmp(t.cfg.places, "cuda", 4) ? "parallel" : "sequential";
  for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
    if (!strcmp(t.cfg.executor, backends[i]->executor)) t.be = backends[i];
  if (!t.be)
    return bad_args("unknown executor '%s' (known: sequential, parallel)%s", t.cfg.executor, "");
  bool parallel = t.be == &pe_train_parallel;
  if (!t.cfg.places) t.cfg.places = parallel ? "cpu:2" : "cpu:1";
  if (!parallel && strcmp(t.cfg.places, "cpu:1"))
    return bad_args("places '%s' not supported: the sequential executor runs on cpu:1%s",
                    t.cfg.places, "");
  if (!parallel && (t.cfg.strategy || t.cfg.sync || t.cfg.fuse || t.cfg.fuse_bucket ||
                    t.cfg.dump_graph || t.cfg.timeline || t.cfg.prefetch))
    return bad_args(
        "--strategy, --sync, --fuse, --fuse-bucket, --dump-graph, --timeline and "
        "--prefetch need --executor parallel%s%s",
        "", "");
  if (t.cfg.compare_sequential && !parallel)
    return bad_args("--compare-sequential needs --executor parallel%s%s", "", "");
  pe_cuda_graph_mode cg;
  if (t.cfg.cuda_graph && !pe_cuda_graph_mode_parse(t.cfg.cuda_graph, &cg))
    return bad_args("--cuda-graph '%s': expected auto, on or off%s", t.cfg.cuda_graph, "");
  if (t.cfg.denormals && strcmp(t.cfg.denormals, "flush") && strcmp(t.cfg.denormals, "keep"))
    return bad_args("--denormals '%s': expected flush or keep%s", t.cfg.denormals, "");
  int conv_mode = PE_CONV_ALGO_DEFAULT;
  if (t.cfg.conv_algo && !pe_conv_algo_parse(t.cfg.conv_algo, &conv_mode))
    return bad_args("--conv-algo '%s': expected default, time, direct, gemm, winograd or auto%s",
                    t.cfg.conv_algo, "");
  pe_conv_algo_set_mode(conv_mode);
  int layout_mode = PE_CONV_LAYOUT_BLOCKED;
  if (t.cfg.conv_layout && !pe_conv_layout_parse(t.cfg.conv_layout, &layout_mode))
    return bad_args("--conv-layout '%s': expected blocked or plain%s", t.cfg.conv_layout, "");
  pe_conv_layout_set_mode(layout_mode);
  /* More threads than cores only contend: said, not refused. */
  if (t.cfg.threads > pe_cpu_cores())
    fprintf(stderr,
            "pe-bench train: warning: --threads %ld is more than the %d core(s): they share "
            "the cores and run slower\n",
            t.cfg.threads, pe_cpu_cores());
  /* Files written after training: a path that cannot be written fails
   * now, not after the run. */
  const char *outs[][2] = {{"--timeline", t.cfg.timeline}, {"--dump-graph", t.cfg.dump_graph}};
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
    char err[1024];
    if (outs[i][1] && cli_out_path_check(outs[i][1], err, sizeof err)) {
      pe_bench_error("FAILED", "%s %s", outs[i][0], err);
      return 1;
    }
  }
  /* The executors set it on the threads that run kernels; the main thread
   * too, before it starts any thread (its OpenMP team, the prefetcher), so
   * that every thread of the process follows --denormals. */
  pe_fpenv_flush_denormals(!train_cfg_keep_denormals(&t.cfg));
  /* --places auto: the places and strategy a trial times fastest. */
  bench_places bp = {0};
  bool auto_places = parallel && !strcmp(t.cfg.places, "auto");
  if (auto_places && (rc = pe_bench_places_auto(&t.cfg, &bp))) return rc;
  /* The baseline first, in this process, on the same batches (same seed). */
  train_result base = {0};
  if (t.cfg.compare_sequential) {
    trainer b = {.cfg = t.cfg, .be = &pe_train_sequential};
    b.cfg.executor = "sequential";
    b.cfg.places = "cpu:1";
    /* cpu:1 is one place on one core: the baseline runs its kernels on one
     * thread (an all-core sequential run is `--executor sequential`). */
    b.cfg.threads = 1;
    rc = run_one(&b, &base);
    teardown(&b);
    if (rc) return rc;
  }
  train_result r = {0};
  rc = run_one(&t, &r);
  pe_roof_totals roof = {0};
  bool roof_on = false;
  if (!rc) rc = roofline_measure(&t, &r, &roof, &roof_on);
  double step_ms = r.steps > 0 ? r.train_seconds / (double)r.steps * 1e3 : 0;
  if (!rc) {
    double sps = r.train_seconds > 0 ? r.samples / r.train_seconds : 0;
    if (t.cfg.json) {
      printf("{\"bench\":\"train\",\"ok\":true,\"model\":");
      cli_json_str(stdout, t.cfg.model);
      printf(
          ",\"executor\":\"%s\",\"places\":\"%s\","
          "\"batch\":%ld,\"epochs\":%ld,\"steps\":%ld,\"samples\":%ld,\"seed\":%ld,"
          "\"threads\":%ld,\"denormals\":\"%s\",\"fuse_ops\":%s,\"conv_algo\":\"%s\","
          "\"conv_layout\":\"%s\",\"samples_per_sec\":%.1f,"
          "\"train_seconds\":%.3f,"
          "\"eval_seconds\":%.3f,\"test_accuracy\":%.4f,\"final_loss\":",
          t.cfg.executor, t.cfg.places, t.cfg.batch, t.cfg.epochs, r.steps, r.samples, t.cfg.seed,
          (long)t.threads_used, train_cfg_keep_denormals(&t.cfg) ? "keep" : "flush",
          train_cfg_fuse_ops(&t.cfg) ? "true" : "false",
          t.cfg.conv_algo ? t.cfg.conv_algo : "default",
          pe_conv_layout_name(pe_conv_layout_get_mode()), sps, r.train_seconds, r.eval_seconds,
          r.test_acc);
      /* A diverged run's loss: null (json_out.h), and said so. */
      cli_json_num(stdout, "%.5f", r.final_loss);
      printf(
          ",\"final_loss_finite\":%s,\"final_loss_window\":\"last_epoch\","
          "\"final_train_accuracy\":",
          isfinite(r.final_loss) ? "true" : "false");
      cli_json_num(stdout, "%.4f", r.final_train_acc);
      if (t.be->json_extra) t.be->json_extra(&t, stdout);
      if (auto_places) pe_bench_places_json(&bp, t.cfg.batch, stdout);
      json_run_keys(&t, &r);
      if (roof_on) pe_roof_json(stdout, &roof, step_ms, t.place_threads, t.place_batch);
      if (t.cfg.compare_sequential) {
        double bsps = base.train_seconds > 0 ? base.samples / base.train_seconds : 0;
        printf(
            ",\"baseline\":{\"executor\":\"sequential\",\"places\":\"cpu:1\",\"threads\":1,"
            "\"intra_op_threads\":1,\"pool_workers\":1,"
            "\"samples_per_sec\":%.1f,\"train_seconds\":%.3f,\"test_accuracy\":%.4f,"
            "\"final_loss\":",
            bsps, base.train_seconds, base.test_acc);
        cli_json_num(stdout, "%.5f", base.final_loss);
        printf("},\"speedup_vs_sequential\":%.3f", bsps > 0 ? sps / bsps : 0);
      }
      printf("}\n");
    } else {
      printf(
          "%s: %ld steps in %.2f s (%.0f samples/s), last-epoch loss %.4f, "
          "test accuracy %.4f\n",
          t.cfg.model, r.steps, r.train_seconds, sps, r.final_loss, r.test_acc);
      if (roof_on) {
        double ms = roof.gemm_ms + roof.conv_ms, flop = roof.gemm_gflop + roof.conv_gflop;
        printf("roofline: GEMMs %.2f ms + convolutions %.2f ms of a %.2f ms step (%.2f)\n",
               roof.gemm_ms, roof.conv_ms, step_ms, step_ms > 0 ? ms / step_ms : 0);
        if (roof.peak.gflops > 0 && ms > 0 && step_ms > 0)
          printf(
              "FMA peak (%s, %d thread%s): %.1f GFLOPS; the kernels alone reach %.2f of it, "
              "the step %.2f\n",
              roof.peak.isa, roof.peak.threads, roof.peak.threads == 1 ? "" : "s", roof.peak.gflops,
              flop / (ms * 1e-3) / roof.peak.gflops, flop / (step_ms * 1e-3) / roof.peak.gflops);
      }
    }
  }
  teardown(&t);
  return rc;
}
