/* pe_srv_run_batches (run/batches.h).
 *
 * The prefetcher's input i is feed i: its producer sizes the inputs to one
 * mini-batch (rows = dim 0 / batches) and its fill copies a place's rows of
 * that mini-batch out of the request's tensor. On cpu places the fills run
 * on the pool's workers, in their idle time (pe_prefetch_opts.pool); on
 * device places the prefetcher's thread fills and copies onto the devices.
 * One batch is produced at a time (prefetch.h), so `cur` names the batch
 * that fill is copying. A feed in shared memory is read from its pinned
 * range (rb->pins): one copy, region to the places' rows, instead of a
 * private copy of the whole feed before the first step; a feed with row
 * indices (rb->rows) is copied row by row from the indexed rows. */
#include "server/run/batches.h"

#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "engine/prefetch_steps.h"
#include "server/run/cancel.h"
#include "server/run/finite.h"

typedef struct batch_src {
  const pe_run_batches *rb;
  const pe_srv_program *p;
  int64_t rows;      /* per mini-batch */
  uint32_t produced; /* batches sized so far */
  uint32_t cur;      /* the batch being filled */
  /* Steps that ended (step_done called), each applied to the model: also
   * the one whose step_done stops the run (a cancel, a timeout), which the
   * engine's count leaves out. */
  uint32_t ended;
  pe_tensor *stacked;
  char err_shape[PE_SHAPE_STRLEN], err_shape2[PE_SHAPE_STRLEN];
} batch_src;

static pe_status *produce(void *ctx, pe_tensor *in, int n_in, bool *end) {
  batch_src *b = ctx;
  if (b->produced == b->rb->batches) {
    *end = true;
    return NULL;
  }
  for (int i = 0; i < n_in; i++) {
    const pe_tensor *t = b->rb->feeds[i].t;
    pe_shape s = t->shape;
    s.d[0] = b->rows;
    PE_TRY(pe_tensor_resize(&in[i], t->dtype, &s, b->rb->feeds[i].name));
  }
  b->cur = b->produced++;
  return NULL;
}

static pe_status *fill(void *ctx, pe_tensor *in, int n_in, int64_t lo, int64_t hi) {
  batch_src *b = ctx;
  for (int i = 0; i < n_in; i++) {
    const pe_tensor *t = b->rb->feeds[i].t;
    size_t row = pe_tensor_bytes(t) / (size_t)t->shape.d[0];
    size_t from = (size_t)((int64_t)b->cur * b->rows + lo) * row, bytes = (size_t)(hi - lo) * row;
    char *dst = (char *)in[i].data + lo * (int64_t)row;
    const pe_shm_pin *pin = b->rb->pins ? b->rb->pins[i] : NULL;
    const int64_t *rows = pin && b->rb->rows ? b->rb->rows[i] : NULL;
    int64_t first = (int64_t)b->cur * b->rows;
    if (rows)
      PE_TRY(pe_status_wrap(pe_shm_pin_read_rows(pin, rows + first + lo, hi - lo, row, dst),
                            "feed '%s' batch %u", b->rb->feeds[i].name, b->cur));
    else if (pin)
      PE_TRY(pe_status_wrap(pe_shm_pin_read(pin, from, bytes, dst), "feed '%s' batch %u",
                            b->rb->feeds[i].name, b->cur));
    else
      memcpy(dst, (const char *)t->data + from, bytes);
  }
  return NULL;
}

/* Step `step` ended: its fetches go to row `step` of the stacked tensors
 * (made at step 0, when the fetch shapes are known). */
static pe_status *step_done(void *ctx, int64_t step, int64_t samples, const pe_tensor *fetched,
                            int n_fetch) {
  batch_src *b = ctx;
  const pe_run_batches *rb = b->rb;
  (void)samples;
  b->ended = (uint32_t)step + 1;
  if (rb->progress) atomic_store(rb->progress, b->ended);
  for (int i = 0; i < n_fetch; i++) {
    const pe_tensor *f = &fetched[i];
    pe_tensor *out = &b->stacked[i];
    if (step == 0) {
      if (f->shape.ndim >= PE_MAX_DIMS)
        return pe_error(PE_ESHAPE,
                        "run: fetch '%s' has shape %s: stacking %u batches needs %d dims",
                        rb->fetch[i], pe_shape_str(&f->shape, b->err_shape, PE_SHAPE_STRLEN),
                        rb->batches, f->shape.ndim + 1);
      pe_shape s = {.ndim = f->shape.ndim + 1};
      s.d[0] = rb->batches;
      memcpy(&s.d[1], f->shape.d, sizeof(int64_t) * (size_t)f->shape.ndim);
      PE_TRY(pe_tensor_resize(out, f->dtype, &s, rb->fetch[i]));
    } else if (f->dtype != out->dtype || f->shape.ndim + 1 != out->shape.ndim ||
               memcmp(f->shape.d, &out->shape.d[1], sizeof(int64_t) * (size_t)f->shape.ndim)) {
      pe_shape first = out->shape;
      first.ndim--;
      memmove(first.d, &first.d[1], sizeof(int64_t) * (size_t)first.ndim);
      return pe_error(PE_ESHAPE, "run: fetch '%s' is %s %s at step %lld, %s %s at step 0",
                      rb->fetch[i], pe_dtype_name(f->dtype),
                      pe_shape_str(&f->shape, b->err_shape, PE_SHAPE_STRLEN), (long long)step,
                      pe_dtype_name(out->dtype),
                      pe_shape_str(&first, b->err_shape2, PE_SHAPE_STRLEN));
    }
    size_t n = pe_tensor_bytes(f);
    memcpy((char *)out->data + (size_t)step * n, f->data, n);
  }
  /* A non-finite loss stops the run after its (applied) step. */
  if (rb->loss_index >= 0 && rb->loss_index < n_fetch)
    PE_TRY(pe_run_finite_check(b->p, rb->fetch[rb->loss_index], &fetched[rb->loss_index],
                               (uint64_t)step));
  if (rb->deadline && step + 1 < rb->batches && pe_now_s() > rb->deadline)
    return pe_error(PE_EDEADLINE, "run: timeout of %u ms reached after %lld of %u steps",
                    rb->timeout_ms, (long long)step + 1, rb->batches);
  if (rb->guard && step + 1 < rb->batches)
    return pe_run_guard_check(rb->guard, (uint64_t)step + 1, rb->batches);
  return NULL;
}

pe_status *pe_srv_run_batches(pe_runtime *rt, pe_srv_program *p, const pe_run_batches *rb,
                              pe_tensor *stacked, uint32_t *done) {
  *done = 0;
  if (rb->n_feeds < 1 || rb->n_feeds > PE_PREFETCH_STEPS_MAX_INPUTS)
    return pe_error(PE_EINVAL, "run: %d feeds with batches %u (1 to %d)", rb->n_feeds, rb->batches,
                    PE_PREFETCH_STEPS_MAX_INPUTS);
  batch_src b = {.rb = rb, .p = p, .stacked = stacked};
  /* Every feed: dim 0 a multiple of batches, the same rows per batch. */
  for (int i = 0; i < rb->n_feeds; i++) {
    const pe_tensor *t = rb->feeds[i].t;
    int64_t n = t->shape.ndim ? t->shape.d[0] : 0;
    if (n < rb->batches || n % rb->batches) {
      char s[PE_SHAPE_STRLEN];
      return pe_error(PE_ESHAPE,
                      "run: feed '%s' has shape %s: dim 0 (%lld) is not a multiple "
                      "of batches %u",
                      rb->feeds[i].name, pe_shape_str(&t->shape, s, sizeof s), (long long)n,
                      rb->batches);
    }
    if (i && n / rb->batches != b.rows) {
      char s[PE_SHAPE_STRLEN], s0[PE_SHAPE_STRLEN];
      return pe_error(PE_ESHAPE,
                      "run: feed '%s' has shape %s, feed '%s' %s: not the same "
                      "rows per batch (batches %u)",
                      rb->feeds[i].name, pe_shape_str(&t->shape, s, sizeof s), rb->feeds[0].name,
                      pe_shape_str(&rb->feeds[0].t->shape, s0, sizeof s0), rb->batches);
    }
    b.rows = n / rb->batches;
  }
  pe_srv_model *m = p->model;
  pe_device *devices[PE_MAX_PLACES];
  for (int q = 0; q < m->n_places; q++)
    PE_TRY(pe_runtime_device(rt, (pe_place){m->kind, q}, m->n_places, &devices[q]));
  pe_prefetch_opts po = {.n_places = m->n_places,
                         .n_inputs = rb->n_feeds,
                         .depth = 2,
                         .produce = produce,
                         .fill = fill,
                         .ctx = &b,
                         .devices = devices};
  /* On cpu places the places' own workers copy the rows (bench_train.c's
   * reasoning); a third slot keeps the next batch ready. */
  if (m->kind == PE_PLACE_CPU) {
    po.pool = pe_runtime_pool(rt);
    po.depth = 3;
  }
  pe_prefetch *pf = NULL;
  PE_TRY(pe_status_wrap(pe_prefetch_start(&po, &pf), "run: input split"));
  const char *names[PE_PREFETCH_STEPS_MAX_INPUTS];
  for (int i = 0; i < rb->n_feeds; i++) names[i] = rb->feeds[i].name;
  pe_prefetch_steps ps = {.pf = pf,
                          .n_places = m->n_places,
                          .n_inputs = rb->n_feeds,
                          .names = names,
                          .done = step_done,
                          .ctx = &b};
  /* fx: each step's values, copied into the stacked rows by step_done. */
  pe_tensor *fx = calloc((size_t)(rb->n_fetch ? rb->n_fetch : 1), sizeof *fx);
  if (!fx) {
    pe_prefetch_stop(pf);
    return pe_error(PE_ENOMEM, "run: %d fetch tensors", rb->n_fetch);
  }
  pe_status *st = pe_prefetch_run_steps(p->exec, &ps, rb->fetch, rb->n_fetch, fx, rb->opts, NULL);
  pe_prefetch_stop(pf);
  for (int i = 0; i < rb->n_fetch; i++) pe_tensor_release(&fx[i]);
  free(fx);
  *done = b.ended;
  /* The stacked tensors say how many steps they hold. */
  for (int i = 0; i < rb->n_fetch && !st; i++) stacked[i].shape.d[0] = b.ended;
  return st;
}
