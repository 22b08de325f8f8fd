/* pe_runtime (parallel/executor.h): the pool, the dependency engine on it and the
 * devices, opened on first use.
 *
 * Intra-op budget. Each pool worker binds, at start, an OpenMP team of
 * cores / workers (>= 1); the executor re-binds the place's budget (the
 * device's ctx) around each kernel it runs on a worker, and sim stream
 * threads bind their device's budget themselves. A cpu place's budget is
 * cores / max(places, workers): every worker may run a kernel of the place
 * at the same time, so workers x team <= cores whatever runs. (cores /
 * places alone gave cpu:1 on a 2-worker pool two 2-thread teams on 2 cores:
 * measured, the MLP at about half the speed of a 1-worker pool; likely
 * libgomp's throttled spinning once it manages more threads than cores,
 * not checked.) A pool of one worker per cpu or cuda place (pe_runtime_default_workers,
 * what the daemon and pe-bench use unless told otherwise) gives each place
 * cores / places; more workers trade intra-op for inter-op parallelism
 * (several clients' models at once). A sim place's budget is
 * cores / places: its kernels run on its own stream thread, which emulates
 * an accelerator, not on the pool.
 *
 * Denormals. Unless opts->keep_denormals, every pool worker flushes
 * denormals to zero (core/fpenv.h: on the MLP a dead unit's momentum decays
 * into denormals and its update ran 17x slower). Set at worker start, before
 * the worker's first parallel region, so the OpenMP team libgomp creates
 * from the worker inherits it; sim devices get the same setting through
 * pe_device_opts.keep_denormals. */
#include <stdlib.h>

#include "core/fpenv.h"
#include "engine/parallel/internal.h"

static void worker_start(int worker, void *ctx) {
  (void)worker;
  pe_runtime *rt = ctx;
  pe_fpenv_flush_denormals(!rt->keep_denormals);
  pe_device_ctx_bind(&rt->worker_ctx);
}

pe_status *pe_runtime_new(const pe_runtime_opts *opts, pe_runtime **out) {
  *out = NULL;
  pe_runtime *rt = calloc(1, sizeof(*rt));
  if (!rt) return pe_error(PE_ENOMEM, "runtime: out of memory");
  int online = pe_cpu_cores();
  if (online < 1) online = 1;
  int threads = opts && opts->threads > 0 ? opts->threads : online;
  rt->cores = opts && opts->cores > 0 ? opts->cores : online;
  rt->keep_denormals = opts && opts->keep_denormals;
  rt->sim_device_memory = opts && opts->sim_device_memory;
  pthread_mutex_init(&rt->dev_mu, NULL);
  pthread_mutex_init(&rt->coll_mu, NULL);
  int per_worker = rt->cores / threads;
  pe_status *st =
      pe_device_ctx_init(&rt->worker_ctx, pe_cpu_place(), per_worker > 0 ? per_worker : 1);
  if (!st) rt->worker_ctx_init = true;
  /* Room to grow to one worker per core (pe_runtime_serve_places). */
  pe_pool_opts po = {worker_start, NULL, rt, opts ? opts->spin_us : 0, online};
  if (!st) st = pe_pool_new(threads, &po, &rt->pool);
  if (!st) st = pe_engine_new(rt->pool, &rt->eng);
  if (st) {
    pe_runtime_free(rt);
    return pe_status_wrap(st, "runtime");
  }
  *out = rt;
  return NULL;
}

/* cuda: one worker per GPU as well. Its nodes only enqueue work, one at a
 * time per stream (the stream's launch lock), so more workers hand tasks
 * between threads and queue on that lock: resnet on one H200, pe-bench,
 * 26,308 samples/s with 1 worker, 23,673 with 2, 21,907 with 4, 13,169 with
 * 16 (one per core); the CNN 41,010 with 2 against 34,352
 * with 16. sim places keep every core: their kernels run on their stream
 * threads, and the pool is what emulates the host side. */
int pe_runtime_default_workers(pe_place_kind kind, int n_places) {
  int cores = pe_cpu_cores();
  if ((kind != PE_PLACE_CPU && kind != PE_PLACE_CUDA) || n_places < 1) return cores;
  return n_places < cores ? n_places : cores;
}

pe_status *pe_runtime_serve_places(pe_runtime *rt, pe_place_kind kind, int n_places) {
  /* Only cpu kernels run on the pool's workers (sim and cuda ones on their
   * streams), so only cpu places wait for a worker each. */
  if (kind != PE_PLACE_CPU || n_places <= pe_pool_threads(rt->pool)) return NULL;
  int cores = pe_cpu_cores();
  if (cores < 1) cores = 1;
  int want = n_places < cores ? n_places : cores;
  pe_status *why = pe_pool_grow(rt->pool, want);
  int have = pe_pool_threads(rt->pool);
  if (have >= n_places) {
    pe_status_free(why);
    return NULL;
  }
  pe_status *st = pe_error(PE_EEXHAUSTED,
                           "%s:%d: the worker pool has %d workers (%d online cores%s%s), so at "
                           "most %d of the %d places run at once",
                           pe_place_kind_name(kind), n_places, have, cores, why ? "; " : "",
                           why ? pe_status_msg(why) : "", have, n_places);
  pe_status_free(why);
  return st;
}

void pe_runtime_free(pe_runtime *rt) {
  if (!rt) return;
  if (rt->eng) {
    pe_status_free(pe_engine_wait_all(rt->eng));
    pe_engine_free(rt->eng);
  }
  pe_pool_free(rt->pool);
  for (int k = 0; k < PE_PLACE_KINDS; k++)
    for (int p = 0; p < PE_MAX_PLACES; p++) pe_device_close(rt->dev[k][p]);
  if (rt->worker_ctx_init) pe_device_ctx_destroy(&rt->worker_ctx);
  pthread_mutex_destroy(&rt->dev_mu);
  pthread_mutex_destroy(&rt->coll_mu);
  free(rt);
}

pe_pool *pe_runtime_pool(pe_runtime *rt) {
  return rt->pool;
}
pe_engine *pe_runtime_engine(pe_runtime *rt) {
  return rt->eng;
}

pe_status *pe_runtime_device(pe_runtime *rt, pe_place place, int n_places_hint, pe_device **out) {
  *out = NULL;
  if ((int)place.kind < 0 || (int)place.kind >= PE_PLACE_KINDS || place.id < 0 ||
      place.id >= PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "runtime: place %s:%d out of range", pe_place_kind_name(place.kind),
                    place.id);
  pthread_mutex_lock(&rt->dev_mu);
  pe_device **slot = &rt->dev[place.kind][place.id];
  pe_status *st = NULL;
  if (!*slot) {
    int share = n_places_hint > 0 ? n_places_hint : 1;
    int workers = pe_pool_threads(rt->pool);
    if (place.kind == PE_PLACE_CPU && share < workers) share = workers;
    pe_device_opts o = {.threads = rt->cores / share > 0 ? rt->cores / share : 1,
                        .keep_denormals = rt->keep_denormals,
                        .device_memory = rt->sim_device_memory && place.kind == PE_PLACE_SIM};
    st = pe_device_open(place, &o, slot);
  }
  *out = *slot;
  pthread_mutex_unlock(&rt->dev_mu);
  return st;
}
