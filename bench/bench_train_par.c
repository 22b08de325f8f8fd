/* pe-bench train, parallel backend: the same training loop as the
 * sequential one (bench_train.c), run by the parallel executor on N places.
 *
 * Flow: one pe_runtime (pool, engine, devices) and one pe_model on the
 * places of --places; the train program compiled by pe_graph_compile
 * (data_parallel, ssa, [fuse_allreduce], memory_plan; --dump-graph writes
 * its Graphviz) and bound to the model; its startup graph (init on place 0,
 * broadcast) run once; the eval program compiled for_test on the same
 * places and bound to the same model, so it reads the trained parameters.
 *
 * Eval fetches the accuracy, not the count of correct predictions: a
 * non-per-sample fetch is the places' mean weighted by n_p / N, which is
 * right for a mean and wrong for a count, so correct = round(accuracy * n).
 *
 * Input prefetch (--prefetch on, the default): the training loop's
 * pe_prefetch splits batch k+1 onto the places' devices while step k runs,
 * and par_step_split binds the parts (pe_par_exec_run_split: no copy). On
 * cpu places the rows of each place are copied from the data set by that
 * place's pool worker (pe_prefetch_opts.pool), not by the prefetch thread.
 *
 * Extra JSON keys: prefetch, strategy, fuse, fuse_bucket_bytes, sync, pool_threads,
 * graph_nodes, memory_plan {planned_bytes, unplanned_bytes} (the main
 * graph's temporaries for the per-place batch ceil(batch / places)), and
 * timeline_spans / timeline_dropped with --timeline. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_train.h"
#include "compiler/pass.h"
#include "engine/parallel/executor.h"
#include "engine/prefetch_steps.h"
#include "ir/program.h"
#include "json_out.h"

typedef struct par_state {
  pe_place_kind kind;
  int n_places;
  pe_graph_strategy strategy;
  pe_sync_strategy sync;
  bool fuse;
  pe_runtime *rt;
  pe_model *model;
  pe_par_exec *step, *test;
  pe_timeline *tl;
  pe_device **devices; /* the places' devices (the runtime's), for the prefetcher */
  pe_tensor out[2];
  int64_t planned, unplanned;
  int graph_nodes;
} par_state;

/* Compile a clone of p (train or for_test) for the state's places. The
 * startup graph is returned when want_startup, else freed. */
static pe_status *par_compile(trainer *t, par_state *s, const pe_program *p, bool for_test,
                              pe_graph **main_out, pe_graph **startup_out) {
  pe_program *prog;
  pe_status *st = pe_program_clone(p, &prog);
  if (st) return st;
  const char *keep[1] = {t->m.accuracy};
  pe_pass_opts o = {.place_kind = s->kind,
                    .n_places = s->n_places,
                    .strategy = s->strategy,
                    .fuse = s->fuse && !for_test,
                    .fuse_bucket_bytes = t->cfg.fuse_bucket,
                    .dump_path = for_test ? NULL : t->cfg.dump_graph,
                    .n_keep = 1,
                    .keep = keep,
                    .batch_hint = (t->cfg.batch + s->n_places - 1) / s->n_places,
                    .fuse_conv_act = train_cfg_fuse_ops(&t->cfg)};
  pe_ir ir = {.prog = prog, .opts = &o};
  st = pe_graph_compile(&ir, for_test);
  if (!st) {
    *main_out = ir.graph;
    ir.graph = NULL;
    if (startup_out) {
      *startup_out = ir.startup;
      ir.startup = NULL;
    }
  }
  pe_ir_destroy(&ir);
  pe_program_free(prog); /* the graphs own clones */
  return st;
}

static int par_setup(trainer *t) {
  par_state *s = calloc(1, sizeof *s);
  if (!s) return pe_bench_train_fail(pe_error(PE_ENOMEM, "parallel executor state"), "setup");
  t->impl = s;
  pe_tensor_init(&s->out[0]);
  pe_tensor_init(&s->out[1]);
  pe_status *st = pe_places_parse(t->cfg.places, &s->kind, &s->n_places);
  if (st) return pe_bench_train_fail(st, "--places");
  if ((st = pe_model_check_places(s->kind, s->n_places))) /* e.g. cuda:2: not yet, and why */
    return pe_bench_train_fail(st, "--places");
  const char *strategy = t->cfg.strategy ? t->cfg.strategy : "auto";
  if (!strcmp(strategy, "auto"))
    s->strategy = pe_strategy_auto(s->kind, NULL); /* the built-in models do not clip */
  else if (!strcmp(strategy, "allreduce"))
    s->strategy = PE_STRATEGY_ALLREDUCE;
  else if (!strcmp(strategy, "reduce"))
    s->strategy = PE_STRATEGY_REDUCE;
  else if (!strcmp(strategy, "sharded"))
    s->strategy = PE_STRATEGY_SHARDED;
  else
    return pe_bench_train_fail(
        pe_error(PE_EINVAL, "strategy '%s' (known: auto, allreduce, reduce, sharded)", strategy),
        "--strategy");
  const char *sync = t->cfg.sync ? t->cfg.sync : "event";
  if (!strcmp(sync, "event"))
    s->sync = PE_SYNC_WAIT_EVENT;
  else if (!strcmp(sync, "producer"))
    s->sync = PE_SYNC_WAIT_PRODUCER;
  else
    return pe_bench_train_fail(pe_error(PE_EINVAL, "sync '%s' (known: event, producer)", sync),
                               "--sync");
  s->fuse = t->cfg.fuse && !strcmp(t->cfg.fuse, "on");

  pe_program *p = NULL;
  pe_graph *g_train = NULL, *g_init = NULL, *g_eval = NULL;
  if ((st = pe_program_decode(t->m.bytes, t->m.len, &p))) return pe_bench_train_fail(st, "decode");
  st = par_compile(t, s, p, false, &g_train, &g_init);
  if (st) {
    pe_program_free(p);
    return pe_bench_train_fail(st, "compile train graph");
  }
  st = par_compile(t, s, p, true, &g_eval, NULL);
  pe_program_free(p);
  if (st) {
    pe_graph_free(g_train);
    pe_graph_free(g_init);
    return pe_bench_train_fail(st, "compile eval graph");
  }
  s->graph_nodes = g_train->n_nodes;
  pe_graph_memory_bytes(g_train, (t->cfg.batch + s->n_places - 1) / s->n_places, &s->planned,
                        &s->unplanned);

  int workers =
      t->cfg.threads > 0 ? (int)t->cfg.threads : pe_runtime_default_workers(s->kind, s->n_places);
  t->threads_used = workers;
  pe_runtime_opts ro = {.threads = workers, .keep_denormals = train_cfg_keep_denormals(&t->cfg)};
  if ((st = pe_runtime_new(&ro, &s->rt)) ||
      (st = pe_model_new(s->rt, s->kind, s->n_places, (uint64_t)t->cfg.seed, &s->model))) {
    pe_graph_free(g_train);
    pe_graph_free(g_init);
    pe_graph_free(g_eval);
    return pe_bench_train_fail(st, "runtime");
  }
  /* The model opened the places' devices; the prefetcher allocates and
   * copies its parts on the same ones. */
  s->devices = calloc((size_t)s->n_places, sizeof *s->devices);
  if (!s->devices) st = pe_error(PE_ENOMEM, "parallel executor: %d device slots", s->n_places);
  for (int p = 0; !st && p < s->n_places; p++)
    st = pe_runtime_device(s->rt, (pe_place){s->kind, p}, s->n_places, &s->devices[p]);
  if (st) {
    pe_graph_free(g_train);
    pe_graph_free(g_init);
    pe_graph_free(g_eval);
    return pe_bench_train_fail(st, "devices");
  }
  /* The roofline times oneDNN's cpu kernels: cpu places only. */
  t->place_batch = (t->cfg.batch + s->n_places - 1) / s->n_places;
  t->place_threads =
      s->kind == PE_PLACE_CPU
          ? pe_stream_ctx(pe_device_stream(s->devices[0], PE_STREAM_COMPUTE))->threads
          : 0;
  pe_par_exec *init = NULL;
  st = pe_par_exec_new(s->model, g_init, &init); /* takes g_init, also on failure */
  if (!st) {
    pe_run_opts opts = {.sync = s->sync};
    st = pe_par_exec_run(init, NULL, 0, NULL, 0, NULL, &opts, NULL);
  }
  pe_par_exec_free(init);
  if (st) {
    pe_graph_free(g_train);
    pe_graph_free(g_eval);
    return pe_bench_train_fail(st, "startup run");
  }
  st = pe_par_exec_new(s->model, g_train, &s->step);
  if (st) {
    pe_graph_free(g_eval);
    return pe_bench_train_fail(st, "train executor");
  }
  pe_cuda_graph_mode mode = PE_CUDA_GRAPH_AUTO;
  if (t->cfg.cuda_graph) pe_cuda_graph_mode_parse(t->cfg.cuda_graph, &mode);
  if ((st = pe_par_exec_set_cuda_graph(s->step, mode)))
    return pe_bench_train_fail(st, "train executor: cuda_graph");
  if ((st = pe_par_exec_new(s->model, g_eval, &s->test)))
    return pe_bench_train_fail(st, "eval executor");
  if (t->cfg.timeline) {
    /* 64 lanes (pool workers, sim stream threads) of 128k spans, allocated
     * per lane when claimed: an MLP epoch on cpu:2 records ~15k spans per
     * lane; longer runs drop spans and say so (timeline_dropped). */
    if ((st = pe_timeline_new(64, (size_t)1 << 17, &s->tl)))
      return pe_bench_train_fail(st, "timeline");
  }
  return 0;
}

/* --timeline: the steps' and evaluations' spans, written once the run is
 * done (a failure fails the run). */
static pe_status *par_write_outputs(trainer *t) {
  par_state *s = t->impl;
  if (!s || !s->tl) return NULL;
  return pe_status_wrap(pe_timeline_write(s->tl, t->cfg.timeline), "--timeline");
}

static void par_teardown(trainer *t) {
  par_state *s = t->impl;
  if (!s) return;
  pe_timeline_free(s->tl);
  pe_par_exec_free(s->step);
  pe_par_exec_free(s->test);
  pe_model_free(s->model);
  pe_runtime_free(s->rt);
  free(s->devices);
  pe_tensor_release(&s->out[0]);
  pe_tensor_release(&s->out[1]);
  free(s);
  t->impl = NULL;
}

static pe_status *par_run(trainer *t, pe_par_exec *e, int n, const char *const *fetch,
                          int n_fetch) {
  par_state *s = t->impl;
  pe_shape xs = pe_shape_make(t->m.image_ndim, t->m.image_dims), ys = PE_SHAPE(n, 1);
  xs.d[0] = n;
  pe_tensor xt, yt;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_view(&xt, PE_F32, &xs, t->x);
  pe_tensor_view(&yt, PE_I64, &ys, t->y);
  pe_feed feeds[2] = {{t->m.image, &xt}, {t->m.label, &yt}};
  pe_run_opts opts = {.sync = s->sync, .timeline = s->tl, .check_nan_inf = t->cfg.check_nan_inf};
  return pe_par_exec_run(e, feeds, 2, fetch, n_fetch, s->out, &opts, NULL);
}

static pe_status *par_step(trainer *t, int n, float *loss, float *acc) {
  par_state *s = t->impl;
  const char *fetch[2] = {t->m.loss, t->m.accuracy};
  pe_status *st = par_run(t, s->step, n, fetch, 2);
  if (st) return st;
  *loss = pe_f32(&s->out[0])[0];
  *acc = pe_f32(&s->out[1])[0];
  return NULL;
}

static pe_status *par_finish(trainer *t) {
  par_state *s = t->impl;
  return pe_par_exec_sync(s->step);
}

static int par_split_places(trainer *t, pe_device ***devices, pe_pool **fill_pool) {
  par_state *s = t->impl;
  *devices = s->devices;
  /* On cpu places each place's rows are copied by the pool worker that runs
   * the place's ops, in its idle time and into its cache, instead of by the
   * prefetch thread taking one place's core at the start of every step. On
   * sim and cuda the prefetcher copies the parts to the devices anyway. */
  *fill_pool = s->kind == PE_PLACE_CPU ? pe_runtime_pool(s->rt) : NULL;
  return s->n_places;
}

/* Each prefetched step's loss and accuracy go to the training loop's sink
 * (on the thread that ends the step: the caller's or a pool worker). */
typedef struct step_sink {
  train_sink sink;
  void *ctx;
} step_sink;

static pe_status *split_done(void *ctx, int64_t step, int64_t samples, const pe_tensor *fetched,
                             int n_fetch) {
  step_sink *k = ctx;
  (void)step;
  (void)n_fetch; /* 2: loss, accuracy */
  k->sink(k->ctx, (int)samples, pe_f32(&fetched[0])[0], pe_f32(&fetched[1])[0]);
  return NULL;
}

static pe_status *par_steps_split(trainer *t, pe_prefetch *pf, long max, train_sink sink,
                                  void *sink_ctx, bool *end) {
  par_state *s = t->impl;
  step_sink k = {sink, sink_ctx};
  const char *names[2] = {t->m.image, t->m.label};
  pe_prefetch_steps ps = {.pf = pf,
                          .n_places = s->n_places,
                          .n_inputs = 2,
                          .names = names,
                          .max = max,
                          .done = split_done,
                          .ctx = &k};
  const char *fetch[2] = {t->m.loss, t->m.accuracy};
  pe_run_opts opts = {.sync = s->sync, .timeline = s->tl, .check_nan_inf = t->cfg.check_nan_inf};
  pe_status *st = pe_prefetch_run_steps(s->step, &ps, fetch, 2, s->out, &opts, NULL);
  *end = ps.end;
  return st;
}

static pe_status *par_eval(trainer *t, int n, int64_t *correct) {
  par_state *s = t->impl;
  const char *fetch[1] = {t->m.accuracy};
  pe_status *st = par_run(t, s->test, n, fetch, 1);
  if (!st) *correct = llround((double)pe_f32(&s->out[0])[0] * n);
  return st;
}

static void par_json(trainer *t, FILE *f) {
  par_state *s = t->impl;
  fprintf(f, ",\"prefetch\":%s", train_cfg_prefetch(&t->cfg) ? "true" : "false");
  if (train_cfg_prefetch(&t->cfg)) fprintf(f, ",\"steps_per_run\":%ld", t->cfg.steps_per_run);
  /* What the runtime chose: inter-op workers and each place's OpenMP team. */
  fprintf(f, ",\"pool_workers\":%d,\"intra_op_threads\":%d",
          pe_pool_threads(pe_runtime_pool(s->rt)),
          pe_stream_ctx(pe_device_stream(s->devices[0], PE_STREAM_COMPUTE))->threads);
  fprintf(f,
          ",\"strategy\":\"%s\",\"fuse\":%s,\"fuse_bucket_bytes\":%lld,\"sync\":\"%s\","
          "\"graph_nodes\":%d,\"memory_plan\":{\"planned_bytes\":%lld,\"unplanned_bytes\":%lld}",
          s->n_places == 1 ? "single" : pe_strategy_name(s->strategy), s->fuse ? "true" : "false",
          (long long)(t->cfg.fuse_bucket ? t->cfg.fuse_bucket : PE_FUSE_BUCKET_BYTES_DEFAULT),
          s->sync == PE_SYNC_WAIT_PRODUCER ? "producer" : "event", s->graph_nodes,
          (long long)s->planned, (long long)s->unplanned);
  /* What the train executor's captured steps did (cuda_graph above is
   * the mode's decision). */
  const char *why = "";
  pe_step_graph_stats gs;
  bool replayed = pe_par_exec_cuda_graph(s->step, &why, &gs);
  fprintf(f,
          ",\"cuda_graph_steps\":{\"replayed\":%s,\"captures\":%lld,\"replays\":%lld,"
          "\"fallbacks\":%lld,\"invalidations\":%lld,\"reason\":",
          replayed ? "true" : "false", (long long)gs.captures, (long long)gs.replays,
          (long long)gs.fallbacks, (long long)gs.invalidations);
  cli_json_str(f, why);
  fprintf(f, "}");
  if (s->tl) {
    fprintf(f, ",\"timeline\":");
    cli_json_str(f, t->cfg.timeline);
    fprintf(f, ",\"timeline_spans\":%llu,\"timeline_dropped\":%llu",
            (unsigned long long)pe_timeline_spans(s->tl),
            (unsigned long long)pe_timeline_dropped(s->tl));
  }
}

const train_backend pe_train_parallel = {.executor = "parallel",
                                         .setup = par_setup,
                                         .step = par_step,
                                         .eval = par_eval,
                                         .finish = par_finish,
                                         .write_outputs = par_write_outputs,
                                         .teardown = par_teardown,
                                         .json_extra = par_json,
                                         .split_places = par_split_places,
                                         .steps_split = par_steps_split};
