/* pe_csv_read (pe_feed_data.h): a CSV file with a header row, every cell a
 * number. The label columns go to the label feed (f32: regression
 * targets, one column per value of a D-wide target; i64: class ids,
 * integers only), the other columns, in file order, are the input's
 * features. Cells are separated by commas; blanks
 * around a cell and a CRLF line end are allowed, quotes are not (a cell
 * that is not a number names the file, line, column and its text). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pe_builder.h"
#include "pe_feed_data.h"

typedef struct csv {
  const char *path;
  char **cols; /* header names */
  int ncols;
  int *ycol; /* per column: its place among the label columns; -1: a feature */
  int ny;    /* label columns */
  float *x;
  void *y;
  int64_t rows, cap;
  char *err;
  size_t errlen;
} csv;

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
    s[--n] = 0;
  return s;
}

/* Values per example of feed f: the product of its dims after the batch;
 * 0 when one is not known. */
static int64_t feed_width(const pe_feed_decl *f) {
  int64_t w = 1;
  for (int i = 1; i < f->ndim; i++) w = f->dims[i] > 0 ? w * f->dims[i] : 0;
  return w;
}

/* The label columns: those --label-column names (comma-separated, in
 * order), else the last `want` (the label feed's values per example). */
static int pick_labels(csv *c, const char *label, int64_t want, const pe_feed_decl *y) {
  if (!(c->ycol = malloc((size_t)c->ncols * sizeof *c->ycol))) {
    snprintf(c->err, c->errlen, "out of memory");
    return -1;
  }
  for (int i = 0; i < c->ncols; i++) c->ycol[i] = -1;
  if (!label) {
    int64_t n = want > 0 ? want : 1;
    if (n >= c->ncols) {
      snprintf(c->err, c->errlen,
               "%s:1: %d column(s); the model's label feed '%s' takes %lld value(s) per example "
               "and at least one feature column is needed",
               c->path, c->ncols, y->name, (long long)n);
      return -1;
    }
    for (int i = c->ncols - (int)n; i < c->ncols; i++) c->ycol[i] = c->ny++;
    return 0;
  }
  for (const char *p = label;;) {
    size_t len = strcspn(p, ",");
    int found = -1;
    for (int i = 0; i < c->ncols && found < 0; i++)
      if (strlen(c->cols[i]) == len && !strncmp(c->cols[i], p, len)) found = i;
    if (found < 0) {
      snprintf(c->err, c->errlen, "%s:1: no column '%.*s' (--label-column); the header has %d",
               c->path, (int)(len < 200 ? len : 200), p, c->ncols);
      return -1;
    }
    if (c->ycol[found] >= 0) {
      snprintf(c->err, c->errlen, "%s: --label-column names column '%s' twice", c->path,
               c->cols[found]);
      return -1;
    }
    c->ycol[found] = c->ny++;
    if (!p[len]) break;
    p += len + 1;
  }
  if (c->ny == c->ncols) {
    snprintf(c->err, c->errlen, "%s: --label-column names every column; no feature is left",
             c->path);
    return -1;
  }
  if (want > 0 && c->ny != want) {
    char shape[200];
    pe_feed_shape_str(y->ndim, y->dims, shape, sizeof shape);
    snprintf(c->err, c->errlen,
             "%s: --label-column '%s' names %d column(s); the model's label feed '%s' %s takes "
             "%lld value(s) per example (name that many, comma-separated, in order)",
             c->path, label, c->ny, y->name, shape, (long long)want);
    return -1;
  }
  return 0;
}

static int header(csv *c, char *line, const char *label, const pe_feed_decl *y) {
  for (char *p = line, *cell; (cell = strsep(&p, ","));) {
    char **grown = realloc(c->cols, (size_t)(c->ncols + 1) * sizeof *grown);
    if (!grown || !(grown[c->ncols] = strdup(trim(cell)))) {
      if (grown) c->cols = grown;
      snprintf(c->err, c->errlen, "out of memory");
      return -1;
    }
    c->cols = grown;
    c->ncols++;
  }
  if (c->ncols < 2) {
    snprintf(c->err, c->errlen, "%s:1: %d column(s); a label and at least one feature are needed",
             c->path, c->ncols);
    return -1;
  }
  return pick_labels(c, label, feed_width(y), y);
}

/* One data line (number `lineno`) as row c->rows. */
static int row(csv *c, char *line, long lineno, int ydtype) {
  if (c->rows == c->cap) {
    int64_t cap = c->cap ? 2 * c->cap : 1024;
    float *x = realloc(c->x, (size_t)cap * (size_t)(c->ncols - c->ny) * sizeof *x);
    if (x) c->x = x;
    void *y = x ? realloc(c->y, (size_t)cap * (size_t)c->ny * 8) : NULL;
    if (!y) {
      snprintf(c->err, c->errlen, "%s: out of memory at line %ld", c->path, lineno);
      return -1;
    }
    c->y = y;
    c->cap = cap;
  }
  int col = 0, f = 0;
  char *p = line;
  for (char *cell; col < c->ncols && (cell = strsep(&p, ",")); col++) {
    char *t = trim(cell), *end;
    errno = 0;
    int yc = c->ycol[col];
    if (yc >= 0 && ydtype == PE_B_I64) {
      long long v = strtoll(t, &end, 10);
      if (!*t || *end || errno) {
        snprintf(c->err, c->errlen,
                 "%s:%ld: column '%s': '%s' is not an integer (the model's label feed is i64: "
                 "class ids)",
                 c->path, lineno, c->cols[col], t);
        return -1;
      }
      ((int64_t *)c->y)[c->rows * c->ny + yc] = v;
      continue;
    }
    double v = strtod(t, &end);
    if (!*t || *end || errno == ERANGE || !isfinite(v)) {
      snprintf(c->err, c->errlen, "%s:%ld: column '%s': '%s' is not a number", c->path, lineno,
               c->cols[col], t);
      return -1;
    }
    if (yc >= 0)
      ((float *)c->y)[c->rows * c->ny + yc] = (float)v;
    else
      c->x[c->rows * (c->ncols - c->ny) + f++] = (float)v;
  }
  if (col != c->ncols || p) {
    snprintf(c->err, c->errlen, "%s:%ld: %s cells than the header's %d columns", c->path, lineno,
             p ? "more" : "fewer", c->ncols);
    return -1;
  }
  c->rows++;
  return 0;
}

int pe_csv_read(const char *path, const char *label, const pe_feed_decl *x, const pe_feed_decl *y,
                pe_feed_data **out, char *err, size_t errlen) {
  *out = NULL;
  if (y->dtype != PE_B_I64 && y->dtype != PE_B_F32) {
    snprintf(err, errlen, "%s: the model's label feed '%s' is %s; a CSV column fills f32 or i64",
             path, y->name, pe_feed_dtype_str(y->dtype));
    return -1;
  }
  FILE *fp = fopen(path, "r");
  if (!fp) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  csv c = {.path = path, .err = err, .errlen = errlen};
  char *line = NULL;
  size_t cap = 0;
  long lineno = 0;
  int rc = 0;
  while (!rc && getline(&line, &cap, fp) >= 0) {
    lineno++;
    if (lineno == 1)
      rc = header(&c, line, label, y);
    else if (*trim(line))
      rc = row(&c, line, lineno, y->dtype);
  }
  free(line);
  fclose(fp);
  if (!rc && lineno == 0) {
    snprintf(err, errlen, "%s: empty (a header row and data rows are needed)", path);
    rc = -1;
  }
  if (!rc && c.rows == 0) {
    snprintf(err, errlen, "%s: a header and no data rows", path);
    rc = -1;
  }
  pe_feed_data *d = rc ? NULL : pe_feed_data_new(PE_FEED_ARRAYS);
  if (!rc && !d) {
    snprintf(err, errlen, "out of memory");
    rc = -1;
  }
  if (d) {
    int nx = c.ncols - c.ny;
    d->x = (pe_feed_array){.dtype = PE_B_F32,
                           .ndim = 2,
                           .dims = {c.rows, nx},
                           .row_bytes = (size_t)nx * sizeof(float),
                           .data = c.x};
    /* one column: [N] (a [-1, 1] feed takes it); several: the feed's
     * shape when they fill it (row-major), else [N, columns] */
    d->y = (pe_feed_array){.dtype = y->dtype,
                           .ndim = 1,
                           .dims = {c.rows},
                           .row_bytes = (size_t)c.ny * (y->dtype == PE_B_I64 ? 8 : 4),
                           .data = c.y};
    if (c.ny > 1 && feed_width(y) == c.ny) {
      d->y.ndim = y->ndim;
      memcpy(d->y.dims + 1, y->dims + 1, sizeof(int64_t) * (size_t)(y->ndim - 1));
    } else if (c.ny > 1) {
      d->y.ndim = 2;
      d->y.dims[1] = c.ny;
    }
    c.x = NULL;
    c.y = NULL;
    char what[96], ywhat[160];
    snprintf(what, sizeof what, "the input (%d feature columns)", nx);
    size_t k = (size_t)snprintf(ywhat, sizeof ywhat, "column%s ", c.ny > 1 ? "s" : "");
    for (int i = 0, n = 0; i < c.ncols && k < sizeof ywhat; i++)
      if (c.ycol[i] >= 0)
        k += (size_t)snprintf(ywhat + k, sizeof ywhat - k, "%s'%.40s'", n++ ? "," : "", c.cols[i]);
    rc = pe_feed_array_check(&d->x, x, path, what, err, errlen) ||
                 pe_feed_array_check(&d->y, y, path, ywhat, err, errlen) ||
                 pe_feed_data_finish(d, path, err, errlen)
             ? -1
             : 0;
  }
  for (int i = 0; i < c.ncols; i++) free(c.cols[i]);
  free(c.cols);
  free(c.ycol);
  free(c.x);
  free(c.y);
  if (rc)
    pe_feed_data_free(d);
  else
    *out = d;
  return rc;
}
