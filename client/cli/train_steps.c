/* pe-client train's step loop and the evaluation (trainer.h): groups of
 * mini-batches in requests, the progress bar and the lines per epoch, and
 * the test accuracy.
 *
 * Batches are gathered by a pe_batch_prefetch thread into two buffer
 * pairs: the next group of batches is copied out of the data set while the
 * current one's request is in flight.
 *
 * A daemon restart does not stop training: libpeclient registers the
 * programs again. When the restored checkpoint lacks steps this trainer
 * had been answered, train goes back to where the parameters stand
 * (train_log.h) and repeats them on the same batches. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pe_batch_prefetch.h"
#include "trainer.h"

/* Starts gathering bt's batches of rows into the two buffer pairs, or
 * (index: the training rows in their region) their row indices only. */
static int prefetch_start(trainer *t, pe_batcher *bt, const pe_feed_data *rows, bool index,
                          long max_batches, pe_batch_prefetch **pf) {
  int err = index ? pe_batch_prefetch_start_index(bt, t->idx, max_batches, pf)
                  : pe_batch_prefetch_start_rows(bt, rows, t->x, t->y, max_batches, pf);
  if (err) return cli_error(t->ctx, "cannot start the batch prefetch thread: %s", strerror(errno));
  return CLI_OK;
}

/* Feeds for examples [off, off + n) of buffer pair k (by reference into
 * shm with --shm). */
static void batch_feeds(trainer *t, int k, long off, long n, pe_client_tensor feeds[2]) {
  const char *x = (const char *)t->x[k] + (size_t)off * t->train->x.row_bytes;
  const char *y = (const char *)t->y[k] + (size_t)off * t->train->y.row_bytes;
  if (t->train->kind == PE_FEED_IMAGES) {
    cli_batch_feeds(&t->m, (int)n, (const float *)x, (const int64_t *)y, feeds);
  } else { /* the feeds' declared shapes, n rows */
    int64_t xs[PE_FEED_MAX_DIMS], ys[PE_FEED_MAX_DIMS];
    memcpy(xs, t->xf.dims, sizeof xs);
    memcpy(ys, t->yf.dims, sizeof ys);
    xs[0] = ys[0] = n;
    pe_client_tensor_set(&feeds[0], t->xf.name, (pe_b_dtype)t->xf.dtype, t->xf.ndim, xs, x);
    pe_client_tensor_set(&feeds[1], t->yf.name, (pe_b_dtype)t->yf.dtype, t->yf.ndim, ys, y);
  }
  if (t->shm.base) {
    feeds[0].shm_region = feeds[1].shm_region = t->shm.region;
    feeds[0].shm_offset = (uint64_t)((const char *)x - (char *)t->shm.base);
    feeds[1].shm_offset = (uint64_t)((const char *)y - (char *)t->shm.base);
  }
}

/* Feeds for the training rows idx[k][off .. off + n) of their region:
 * batch_feeds' names and shapes, the bytes named by row. */
static void row_feeds(trainer *t, int k, long off, long n, pe_client_tensor feeds[2]) {
  batch_feeds(t, k, off, n, feeds);
  uint64_t at[2] = {0, t->rows_y_off};
  for (int i = 0; i < 2; i++) {
    feeds[i].data = NULL;
    feeds[i].shm_region = t->rows_shm.region;
    feeds[i].shm_offset = at[i];
    feeds[i].shm_rows = t->idx[k] + off;
    feeds[i].shm_array_rows = t->train->n;
  }
}

/* The progress bar: redrawn in place on a terminal (at most 10 times a
 * second), one line per epoch otherwise. */
typedef struct progress {
  bool tty, quiet;
  double last_draw;
} progress;

static void progress_draw(progress *p, long ep, long epochs, long done, long total, double sps,
                          double loss) {
  if (p->quiet || !p->tty) return;
  double now = cli_now();
  if (now - p->last_draw < 0.1 && done < total) return;
  p->last_draw = now;
  int width = 30, fill = total ? (int)(width * done / total) : width;
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
  bar[width] = 0;
  fprintf(stderr, "\repoch %ld/%ld [%s] %3ld%% %8.0f samples/s  loss %.4f ", ep, epochs, bar,
          total ? 100 * done / total : 100, sps, loss);
  fflush(stderr);
}

/* After a request: tell the user when libpeclient registered a program
 * again because the daemon had lost it (a restart, usually), and what the
 * restored parameters include. Training goes on. */
static void report_recovery(trainer *t, train_result *r) {
  pe_client_recovery rv;
  pe_client_recovery_info(t->c, &rv);
  if (rv.recoveries == t->recoveries) return;
  t->recoveries = rv.recoveries;
  r->recoveries++;
  r->steps_rolled_back += (long)rv.rolled_back_steps;
  fprintf(stderr,
          "pe-client %s: the daemon had lost program 0x%016llx (restarted?); registered it again. "
          "Model %s's parameters include this trainer's requests up to %llu; %llu answered "
          "request(s), %llu step(s), were rolled back by the restore\n",
          t->ctx->cmd, (unsigned long long)rv.handle, t->ns, (unsigned long long)rv.applied_request,
          (unsigned long long)rv.rolled_back_runs, (unsigned long long)rv.rolled_back_steps);
}

#define TRAIN_REWIND (-1)  /* run_request: go back to t->rewind_to */
#define TRAIN_REGROUP (-2) /* grow_requests: the requests grew; regroup the batches */

/* The step the parameters stand at after the request that starts at step
 * `at` failed with code after a recovery (train connects with
 * fail_on_rollback): ALREADY_APPLIED, part or all of it is in them;
 * ROLLED_BACK, they lack the last rolled_back_steps answered steps. -1
 * when not known (runs older than the 4096 remembered were rolled back). */
static long restored_step(trainer *t, int code, long at, long nb) {
  pe_client_recovery rv;
  pe_client_recovery_info(t->c, &rv);
  if (code == PE_C_EALREADY) return at + (rv.applied_steps < nb ? (long)rv.applied_steps : nb);
  if (!rv.rolled_back_exact || (long)rv.rolled_back_steps > at) return -1;
  return at - (long)rv.rolled_back_steps;
}

/* Mini-batches [off, off + rows) of buffer pair k in one request: nb of
 * the batch size each (nb > 1: RunRequest.batches), or one short batch.
 * Returns TRAIN_REWIND when a daemon restart left the parameters at
 * another step than this request's start (t->rewind_to). */
static int run_request(trainer *t, int k, long off, long rows, int nb, epoch_sums *e,
                       train_result *r) {
  const char *fetch[2] = {t->m.loss, t->m.accuracy};
  size_t n_fetch = t->m.accuracy[0] ? 2 : 1; /* a model without accuracy: the loss */
  pe_client_tensor feeds[2];
  if (t->use_rows)
    row_feeds(t, k, off, rows, feeds);
  else
    batch_feeds(t, k, off, rows, feeds);
  pe_client_run_opts o = {.batches = nb > 1 ? (uint32_t)nb : 0,
                          .check_nan_inf = t->cfg.check_nan_inf};
  pe_client_run_result res;
  train_log_push(&t->log, &(train_mark){r->steps, r->samples, nb, rows, *e});
  int code = pe_client_run(t->c, t->train_h, feeds, 2, fetch, n_fetch, &o, &res);
  report_recovery(t, r);
  if (code == PE_C_EALREADY || code == PE_C_EROLLEDBACK) {
    fprintf(stderr, "pe-client %s: %s\n", t->ctx->cmd, pe_client_error(t->c));
    if ((t->rewind_to = restored_step(t, code, r->steps, nb)) >= 0) return TRAIN_REWIND;
    /* Rolled back further than remembered: those steps stay lost; this
     * request goes out as it is (the program is registered again). */
    fprintf(stderr,
            "pe-client %s: the rolled-back steps are older than the last %zu requests; "
            "they are not repeated\n",
            t->ctx->cmd, t->log.cap);
    code = pe_client_run(t->c, t->train_h, feeds, 2, fetch, n_fetch, &o, &res);
  }
  if (code) {
    char what[64];
    if (nb > 1)
      snprintf(what, sizeof what, "steps %ld-%ld", r->steps + 1, r->steps + nb);
    else
      snprintf(what, sizeof what, "step %ld", r->steps + 1);
    return cli_fail_at(t->ctx, t->c, code, what);
  }
  const pe_client_tensor *lt = pe_client_find(res.fetched, res.n_fetched, fetch[0]);
  const pe_client_tensor *at =
      n_fetch == 2 ? pe_client_find(res.fetched, res.n_fetched, fetch[1]) : NULL;
  if (!lt || lt->dtype != PE_B_F32 || pe_client_tensor_numel(lt) < nb ||
      (n_fetch == 2 && (!at || at->dtype != PE_B_F32 || pe_client_tensor_numel(at) < nb)))
    return cli_error(t->ctx, "steps %ld-%ld: the reply lacks %d f32 '%s'%s%s", r->steps + 1,
                     r->steps + nb, nb, fetch[0], n_fetch == 2 ? " and " : "",
                     n_fetch == 2 ? fetch[1] : "");
  /* Step j's values are element j * (numel / nb) of the stacked fetches. */
  int64_t ls = pe_client_tensor_numel(lt) / nb, as = at ? pe_client_tensor_numel(at) / nb : 0;
  long n = rows / nb;
  for (int j = 0; j < nb; j++) {
    e->last_loss = ((const float *)lt->data)[j * ls];
    e->loss += e->last_loss * n;
    if (at) e->acc += (double)((const float *)at->data)[j * as] * n;
    e->samples += n;
    e->steps++;
  }
  r->run_ms += res.run_ms;
  r->queue_ms += res.queue_ms;
  r->steps += nb;
  r->samples += rows;
  return CLI_OK;
}

/* After a full request of nb steps that took `seconds` (t->grow_requests):
 * from the second on (the first warms up), its time per step sizes the
 * later requests (TRAIN_REQUEST_MS of steps, a power of two from
 * TRAIN_REQUEST_STEPS to TRAIN_REQUEST_MAX_STEPS). They only grow, so a
 * slow request (another client's load) does not shrink them, and a few
 * regroups reach the size. TRAIN_REGROUP when they grew: the batches are
 * then gathered in groups of the new size. */
static int grow_requests(trainer *t, long nb, double seconds) {
  if (!t->grow_requests || nb < t->cfg.per_request || ++t->full_requests < 2) return CLI_OK;
  if (t->cfg.per_request >= TRAIN_REQUEST_MAX_STEPS) {
    t->grow_requests = false;
    return CLI_OK;
  }
  double step_ms = seconds * 1e3 / (double)nb;
  long want = t->cfg.per_request;
  while (want < TRAIN_REQUEST_MAX_STEPS && (double)want * step_ms < TRAIN_REQUEST_MS) want *= 2;
  if (want > TRAIN_REQUEST_MAX_STEPS) want = TRAIN_REQUEST_MAX_STEPS;
  if (want <= t->cfg.per_request) return CLI_OK;
  size_t cap = (size_t)(t->cfg.batch * want > EVAL_BATCH ? t->cfg.batch * want : EVAL_BATCH);
  for (int k = 0; k < 2; k++) {
    int64_t *idx = realloc(t->idx[k], cap * sizeof *idx);
    if (!idx) return CLI_OK; /* the requests stay as they are */
    t->idx[k] = idx;
  }
  t->cfg.per_request = want;
  return TRAIN_REGROUP;
}

/* The batcher of groups of cfg.per_request batches (this node's part of
 * each epoch in a job: checked at set-up). */
static int make_batcher(trainer *t, pe_batcher **bt) {
  long group = t->cfg.batch * t->cfg.per_request;
  *bt = pe_feed_data_batcher(t->train, (int)group, true, (uint64_t)t->cfg.seed);
  if (!*bt) return cli_error(t->ctx, "cannot make a batcher (batch %ld)", group);
  if (t->cfg.job && !pe_batcher_shard(*bt, (int)t->cfg.world, (int)t->cfg.rank)) {
    pe_batcher_free(*bt);
    *bt = NULL;
    return cli_error(t->ctx, "--job %s: rank %ld of %ld gets no example", t->cfg.job, t->cfg.rank,
                     t->cfg.world);
  }
  return CLI_OK;
}

/* Go back (or, after ALREADY_APPLIED, on) to step t->rewind_to: the run's
 * totals and the epoch's sums as they were there. */
static int rewind_to(trainer *t, epoch_sums *e, train_result *r) {
  train_mark at;
  long unfetched, from = r->steps;
  if (!train_log_rewind(&t->log, t->rewind_to, t->cfg.batch, &at, &unfetched))
    return cli_error(t->ctx, "cannot go back to step %ld: it is not among the last %zu requests",
                     t->rewind_to + 1, t->log.cap);
  r->steps = at.step;
  r->samples = at.samples;
  *e = at.e;
  r->steps_unfetched += unfetched;
  if (from > at.step) {
    r->steps_repeated += from - at.step;
    fprintf(stderr,
            "pe-client %s: repeating from step %ld: the restored parameters lack the "
            "last %ld step(s)\n",
            t->ctx->cmd, at.step + 1, from - at.step);
  }
  return CLI_OK;
}

/* The model's learning_rate now (the rate of its last step under a
 * schedule); NAN when it cannot be read. One GetParams per epoch. */
static double current_lr(trainer *t) {
  const char *name = "learning_rate";
  const pe_client_tensor *v = NULL;
  size_t n = 0;
  if (pe_client_get_params(t->c, t->ns, &name, 1, &v, &n) != 0 || n != 1 ||
      v[0].dtype != PE_B_F32 || v[0].nbytes != sizeof(float))
    return NAN;
  float lr;
  memcpy(&lr, v[0].data, sizeof lr);
  return lr;
}

/* The model's epoch count after epoch ep of this run (absolute, so an
 * epoch repeated after a daemon restart writes the same value). */
static int count_epoch(trainer *t, long ep) {
  if (!t->counts) return CLI_OK;
  int code = trainer_set_i64(t, CLI_EPOCHS_DONE, ep + t->cfg.start_epoch - 1);
  return code ? cli_fail_at(t->ctx, t->c, code, "the epoch count") : CLI_OK;
}

/* The end of epoch ep: its figures become the run's last ones, the
 * model's epoch count moves on; every --eval-every epochs, the test
 * accuracy too. */
static int epoch_end(trainer *t, long ep, const epoch_sums *e, double ep_t0, train_result *r,
                     const progress *pg) {
  int rc = count_epoch(t, ep);
  if (rc) return rc;
  if (e->samples) {
    r->final_loss = e->loss / e->samples;
    r->final_acc = e->acc / e->samples;
  }
  double sps = e->samples / (cli_now() - ep_t0);
  r->final_lr = current_lr(t);
  char test[96] = "", lb[32];
  const char *al = trainer_acc_label(t, lb, sizeof lb);
  if (t->cfg.eval_every && ep % t->cfg.eval_every == 0) {
    double acc, secs;
    int64_t seen = 0;
    rc = trainer_evaluate(t, r, &acc, &seen, &secs);
    if (rc) return rc;
    long k = ep / t->cfg.eval_every; /* an epoch repeated after a rewind: evaluated again */
    r->epoch_acc[k - 1] = acc;
    if (k > r->n_epoch_acc) r->n_epoch_acc = k;
    r->epoch_eval_s += secs;
    trainer_test_figure(t, r, acc, test, sizeof test);
  }
  if (pg->quiet) return CLI_OK;
  if (pg->tty) fputc('\n', stderr);
  char lr[32] = ""; /* unknown (the model's learning_rate unreadable): not printed */
  if (isfinite(r->final_lr)) snprintf(lr, sizeof lr, ", lr %.4g", r->final_lr);
  char bits[48] = "", train_acc[64] = "";
  if (trainer_bits(t)) snprintf(bits, sizeof bits, " (%.3f bits/char)", r->final_loss / M_LN2);
  if (t->m.accuracy[0]) snprintf(train_acc, sizeof train_acc, ", train %s %.4f", al, r->final_acc);
  char loss[32];
  fprintf(stderr, "epoch %ld/%ld: %ld steps, mean loss %s%s%s, %.0f samples/s%s%s\n",
          ep + t->cfg.start_epoch - 1, t->cfg.epochs + t->cfg.start_epoch - 1, e->steps,
          trainer_loss_str(t, r->final_loss, loss, sizeof loss), bits, train_acc, sps, lr, test);
  return CLI_OK;
}

/* The epochs, as one run of steps: step s is batch s % per_epoch of
 * epoch s / per_epoch + 1. The batcher hands out groups of per_request batches
 * from a step on (the same examples in the same order as batch by batch:
 * its permutation does not depend on the batch size); each group goes in
 * one request, except the epoch's short last batch, and the --steps cap,
 * which may cut a group. After a daemon restart that rolled steps back,
 * the loop goes back to where the parameters stand and repeats them. */
int trainer_train(trainer *t, train_result *r) {
  long b = t->cfg.batch;
  pe_batcher *bt;
  int rc = make_batcher(t, &bt);
  if (rc) return rc;
  progress pg = {.tty = isatty(2), .quiet = t->cfg.quiet};
  long per_epoch = trainer_steps_per_epoch(t);
  long total = per_epoch * t->cfg.epochs;
  double t0 = cli_now(), ep_t0 = t0;
  epoch_sums e = {0};
  while (!rc && r->steps < total) {
    long ep = r->steps / per_epoch + 1, left = per_epoch - e.steps; /* e.steps: step in epoch */
    /* One prefetch per stretch: the batcher moves only while it is stopped. */
    /* The data order of epoch start_epoch - 1 + ep: a run continuing a
     * model trained before (--start-epoch) sees the epochs' orders one
     * longer run would have. */
    pe_batcher_seek(bt, (int)(ep + t->cfg.start_epoch - 1), e.steps * b);
    pe_batch_prefetch *pf;
    if ((rc = prefetch_start(
             t, bt, t->train, t->use_rows,
             t->cfg.steps ? (left + t->cfg.per_request - 1) / t->cfg.per_request : 0, &pf)))
      break;
    int n, k;
    while (!rc && e.steps < per_epoch && (k = pe_batch_prefetch_next(pf, &n)) >= 0) {
      for (long off = 0; off < n && e.steps < per_epoch && !rc;) {
        long full = (n - off) / b, nb = full < per_epoch - e.steps ? full : per_epoch - e.steps;
        long rows = nb ? nb * b : n - off;
        double q0 = cli_now();
        rc = run_request(t, k, off, rows, nb ? (int)nb : 1, &e, r);
        if (!rc) rc = grow_requests(t, nb, cli_now() - q0);
        off += rows;
      }
      if (rc && rc != TRAIN_REGROUP && pg.tty && !pg.quiet) fputc('\n', stderr);
      if (!rc || rc == TRAIN_REGROUP)
        progress_draw(&pg, ep + t->cfg.start_epoch - 1, t->cfg.epochs + t->cfg.start_epoch - 1,
                      e.steps, per_epoch, e.samples / (cli_now() - ep_t0), e.last_loss);
    }
    pe_batch_prefetch_stop(pf);
    if (rc == TRAIN_REGROUP) { /* the next stretch seeks the new batcher to step e.steps */
      pe_batcher_free(bt);
      if ((rc = make_batcher(t, &bt))) break; /* rc is CLI_OK after it */
      if (e.steps < per_epoch) continue;
    }
    if (rc == TRAIN_REWIND) {
      rc = rewind_to(t, &e, r);
      if (r->steps / per_epoch + 1 != ep) ep_t0 = cli_now(); /* another epoch */
      if (rc || e.steps < per_epoch) continue;
      ep = r->steps / per_epoch; /* exactly at the end of an epoch */
    }
    if (rc) break;
    rc = epoch_end(t, ep, &e, ep_t0, r, &pg);
    e = (epoch_sums){0};
    ep_t0 = cli_now();
  }
  r->train_s = cli_now() - t0 - r->epoch_eval_s;
  pe_batcher_free(bt);
  return rc;
}

void trainer_test_figure(const trainer *t, const train_result *r, double acc, char *buf,
                         size_t len) {
  char lb[32], bits[48] = "";
  if (!trainer_eval_loss(t)) {
    snprintf(buf, len, ", test %s %.4f", trainer_acc_label(t, lb, sizeof lb), acc);
    return;
  }
  if (trainer_bits(t)) snprintf(bits, sizeof bits, " (%.3f bits/char)", r->test_loss / M_LN2);
  char loss[32];
  snprintf(buf, len, ", test loss %s%s", trainer_loss_str(t, r->test_loss, loss, sizeof loss),
           bits);
}

int trainer_evaluate(trainer *t, train_result *r, double *acc, int64_t *seen, double *secs) {
  pe_batcher *bt = pe_feed_data_batcher(t->test, (int)t->eval_batch, false, 0);
  if (!bt) return cli_error(t->ctx, "cannot make a batcher (batch %ld)", t->eval_batch);
  /* The correct predictions, and the loss where it is the figure. */
  bool by_acc = t->m.correct[0], by_loss = trainer_eval_loss(t);
  const char *fetch[2];
  size_t n_fetch = 0;
  if (by_acc) fetch[n_fetch++] = t->m.correct;
  if (by_loss) fetch[n_fetch++] = t->m.loss;
  double t0 = cli_now(), loss = 0;
  int64_t correct = 0;
  pe_batch_prefetch *pf;
  int rc = prefetch_start(t, bt, t->test, false, 0, &pf);
  int n, k;
  while (!rc && (k = pe_batch_prefetch_next(pf, &n)) >= 0) {
    pe_client_tensor feeds[2];
    batch_feeds(t, k, 0, n, feeds);
    pe_client_run_result res;
    int code = pe_client_run(t->c, t->eval_h, feeds, 2, fetch, n_fetch, NULL, &res);
    report_recovery(t, r);
    if (code) {
      rc = cli_fail_at(t->ctx, t->c, code, "evaluation");
      break;
    }
    const pe_client_tensor *ct =
        by_acc ? pe_client_find(res.fetched, res.n_fetched, fetch[0]) : NULL;
    const pe_client_tensor *lt =
        by_loss ? pe_client_find(res.fetched, res.n_fetched, t->m.loss) : NULL;
    if (by_acc && (!ct || ct->dtype != PE_B_I64 || pe_client_tensor_numel(ct) < 1)) {
      rc = cli_error(t->ctx, "evaluation: the reply lacks i64 '%s'", fetch[0]);
      break;
    }
    if (by_loss && (!lt || lt->dtype != PE_B_F32 || pe_client_tensor_numel(lt) < 1)) {
      rc = cli_error(t->ctx, "evaluation: the reply lacks f32 '%s'", t->m.loss);
      break;
    }
    if (ct) correct += ((const int64_t *)ct->data)[0];
    if (lt) loss += (double)((const float *)lt->data)[0] * n; /* a batch's mean */
    *seen += n;
  }
  *secs = cli_now() - t0;
  /* A sequence model's accuracy counts every position of a label row. */
  int64_t per_row = 1;
  for (int d = 1; d < t->m.label_feed.ndim; d++)
    if (t->m.label_feed.dims[d] > 0) per_row *= t->m.label_feed.dims[d];
  *acc = *seen ? (double)correct / ((double)*seen * (double)per_row) : 0;
  if (by_loss && *seen) r->test_loss = loss / (double)*seen;
  pe_batch_prefetch_stop(pf);
  pe_batcher_free(bt);
  return rc;
}
