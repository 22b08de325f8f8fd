/* pe-client train and eval's data (trainer.h): Fashion-MNIST, or the
 * user's own file given by --data, by its extension (run reads the same
 * files: cli_data_file_rows):
 *
 *   .npz  arrays named after the model's input and label feeds;
 *   .csv  a header row, the label column (--label-column, default the
 *         last) and the input's features (the other columns);
 *   .txt  bytes for a language model with i64 [-1,T] token feeds.
 *
 * The test split: --test-data FILE (the same kind), else (.npz) the arrays
 * test/<feed> of the same file, else --test-fraction of the rows (0.1),
 * held out by a permutation seeded with --seed, so that train and eval
 * with the same seed hold out the same rows. A text file's last 10% is
 * its validation split. --limit keeps the first N rows of each split. */
#include <string.h>
#include <strings.h>

#include "trainer.h"

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcasecmp(s + n - k, suffix);
}

/* Fashion-MNIST's splits, as pe-bench reads them, as feed rows. */
static int load_images(trainer *t) {
  int rc = cli_data_load(t->ctx, &t->m, t->cfg.data, t->cfg.limit, &t->images, &t->test_images);
  if (rc) return rc;
  if (!(t->train = pe_feed_data_borrow(t->images)) ||
      !(t->test = pe_feed_data_borrow(t->test_images)))
    return cli_error(t->ctx, "out of memory");
  /* --limit shrank n only */
  t->train->n = t->train->rows.n = t->images->n;
  t->test->n = t->test->rows.n = t->test_images->n;
  return CLI_OK;
}

/* One file of the user's arrays (.npz with prefix, or .csv); 1: an .npz
 * without the prefix's arrays. */
static int read_arrays(trainer *t, const char *path, const char *prefix, pe_feed_data **out,
                       char *err, size_t errlen) {
  if (ends_with(path, ".npz")) return pe_npz_read(path, prefix, &t->xf, &t->yf, out, err, errlen);
  return pe_csv_read(path, t->cfg.label_column, &t->xf, &t->yf, out, err, errlen);
}

static int load_arrays(trainer *t) {
  char err[1024];
  const char *data = t->cfg.data, *test = t->cfg.test_data;
  if (t->cfg.label_column && !ends_with(data, ".csv"))
    return cli_usage(t->ctx, "--label-column names a CSV column; %s is not a .csv file", data);
  if (test && ends_with(test, ".npz") != ends_with(data, ".npz"))
    return cli_usage(t->ctx, "--test-data %s and --data %s: give two files of one kind", test,
                     data);
  if (read_arrays(t, data, "", &t->train, err, sizeof err)) return cli_error(t->ctx, "%s", err);
  int rc = 1; /* 1: no test split */
  if (test)
    rc = read_arrays(t, test, "", &t->test, err, sizeof err);
  else if (ends_with(data, ".npz"))
    rc = read_arrays(t, data, "test/", &t->test, err, sizeof err);
  if (rc < 0) return cli_error(t->ctx, "%s", err);
  if (rc == 1) {
    double f = t->cfg.test_fraction >= 0 ? t->cfg.test_fraction : 0.1;
    if (pe_feed_data_split(t->train, f, (uint64_t)t->cfg.seed, &t->test, err, sizeof err))
      return cli_error(t->ctx, "%s: %s (--test-fraction)", data, err);
  } else if (t->cfg.test_fraction >= 0) {
    return cli_usage(t->ctx, "--test-fraction: %s has a test split already (%s)", data,
                     test ? "--test-data" : "its test/ arrays");
  }
  return CLI_OK;
}

/* Feed `name` as the model declares it: from the spec before its program
 * is packed (pe_model_opts.prepare), else from the program. */
static int model_feed(const pe_model_spec *m, const char *name, const pe_model_feed *f,
                      pe_feed_decl *out, char *err, size_t errlen) {
  if (m->bytes) return pe_program_feed(m->bytes, m->len, name, out, err, errlen);
  if (f->ndim < 1 || f->ndim > PE_FEED_MAX_DIMS) {
    snprintf(err, errlen, "the model has no feed '%s'", name);
    return -1;
  }
  *out = (pe_feed_decl){.dtype = f->dtype, .ndim = f->ndim};
  snprintf(out->name, sizeof out->name, "%s", name);
  memcpy(out->dims, f->dims, sizeof(int64_t) * (size_t)f->ndim);
  return 0;
}

bool cli_data_is_file(const char *data) {
  return data && (ends_with(data, ".npz") || ends_with(data, ".csv") || ends_with(data, ".txt"));
}

/* The model's input and label feeds as its program declares them. */
static int model_feeds(const cli_ctx *ctx, const pe_model_spec *m, const char *model,
                       pe_feed_decl *xf, pe_feed_decl *yf) {
  char err[1024];
  if (model_feed(m, m->image, &m->image_feed, xf, err, sizeof err) ||
      model_feed(m, m->label, &m->label_feed, yf, err, sizeof err))
    return cli_error(ctx, "%s: %s", model, err);
  return CLI_OK;
}

int cli_data_file_rows(const cli_ctx *ctx, const pe_model_spec *m, const char *model,
                       const char *path, const char *label_column, long limit, pe_feed_decl *xf,
                       pe_feed_decl *yf, pe_feed_data **out) {
  char err[1024];
  *out = NULL;
  if (label_column && !ends_with(path, ".csv"))
    return cli_usage(ctx, "--label-column names a CSV column; %s is not a .csv file", path);
  int rc = model_feeds(ctx, m, model, xf, yf);
  if (rc) return rc;
  if (ends_with(path, ".npz"))
    rc = pe_npz_read(path, "", xf, yf, out, err, sizeof err);
  else if (ends_with(path, ".csv"))
    rc = pe_csv_read(path, label_column, xf, yf, out, err, sizeof err);
  else { /* the text's training windows; the validation ones are not run's */
    pe_feed_data *valid = NULL;
    rc = pe_text_read(path, xf, yf, out, &valid, err, sizeof err);
    pe_feed_data_free(valid);
  }
  if (rc) return cli_error(ctx, "%s", err);
  if (limit > 0 && limit < (*out)->n) (*out)->n = (*out)->rows.n = limit;
  return CLI_OK;
}

int trainer_load_data(trainer *t) {
  const char *data = t->cfg.data;
  if (!cli_data_is_file(data)) {
    if (t->cfg.test_data || t->cfg.label_column || t->cfg.test_fraction >= 0)
      return cli_usage(t->ctx,
                       "--test-data, --test-fraction and --label-column go with --data FILE "
                       "(.npz, .csv, .txt)");
    return load_images(t);
  }
  char err[1024];
  int rc = model_feeds(t->ctx, &t->m, t->cfg.model, &t->xf, &t->yf);
  if (rc) return rc;
  if (ends_with(data, ".txt")) {
    if (t->cfg.test_data || t->cfg.label_column || t->cfg.test_fraction >= 0)
      return cli_usage(t->ctx,
                       "%s: a text file's last 10%% is its validation split (no --test-data, "
                       "--test-fraction or --label-column)",
                       data);
    if (pe_text_read(data, &t->xf, &t->yf, &t->train, &t->test, err, sizeof err))
      return cli_error(t->ctx, "%s", err);
  } else if ((rc = load_arrays(t))) {
    return rc;
  }
  if (t->cfg.limit > 0 && t->cfg.limit < t->train->n) t->train->n = t->train->rows.n = t->cfg.limit;
  if (t->cfg.limit > 0 && t->cfg.limit < t->test->n) t->test->n = t->test->rows.n = t->cfg.limit;
  return CLI_OK;
}
