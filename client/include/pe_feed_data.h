/* A trainer's data as the rows of two feeds (trainer side, libpeclient):
 * the model's input and its label, each one array whose first dimension is
 * the example. The readers fill one from the user's files: .npz arrays
 * named after the feeds (npz_reader.c), CSV columns (csv_reader.c), the
 * windows of a text file (text_windows.c); pe_feed_data_borrow wraps a
 * loaded Fashion-MNIST split without a copy.
 *
 * Every reader checks its arrays against the feeds the program declares
 * (pe_program_feed): the dtype (f32 or i64; an .npz's f64 array fills an
 * f32 feed, narrowed, no other conversion) and the dimensions after the
 * batch. Errors name the file, the array or column,
 * and both shapes.
 *
 * Batches: pe_feed_data_batcher walks the rows with pe_batcher (the same
 * seeded per-epoch order as Fashion-MNIST's), pe_feed_data_gather copies
 * the claimed rows. Not thread-safe; gathers of disjoint rows may run
 * concurrently. */
#ifndef PE_FEED_DATA_H
#define PE_FEED_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pe_dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PE_FEED_MAX_DIMS 8
#define PE_FEED_NAME_LEN 64

/* A feed as the program declares it: dtype a pe_b_dtype (pe_builder.h),
 * dims[0] the batch (-1). */
typedef struct pe_feed_decl {
  char name[PE_FEED_NAME_LEN];
  int dtype;
  int ndim;
  int64_t dims[PE_FEED_MAX_DIMS];
} pe_feed_decl;

/* Feed `name` of the ProgramDesc's main block. Returns 0, or -1 with a
 * message naming the feed (not in the program, not a feed). */
int pe_program_feed(const uint8_t *program, size_t len, const char *name, pe_feed_decl *out,
                    char *err, size_t errlen);

/* One feed's rows: dims[0] rows of row_bytes each. */
typedef struct pe_feed_array {
  int dtype; /* PE_B_F32 or PE_B_I64 */
  int ndim;
  int64_t dims[PE_FEED_MAX_DIMS];
  size_t row_bytes;
  void *data;    /* dims[0] * row_bytes */
  bool borrowed; /* data belongs to someone else (pe_feed_data_borrow) */
} pe_feed_array;

typedef enum pe_feed_kind {
  PE_FEED_IMAGES, /* Fashion-MNIST */
  PE_FEED_ARRAYS, /* .npz or CSV */
  PE_FEED_TEXT,   /* byte windows: losses also in bits per character */
} pe_feed_kind;

typedef struct pe_feed_data {
  int64_t n; /* rows used (<= x.dims[0]: --limit shrinks it) */
  pe_feed_kind kind;
  pe_feed_array x, y; /* the input feed's rows, the label feed's */
  pe_dataset rows;    /* n only: what pe_batcher walks */
} pe_feed_data;

/* A zeroed pe_feed_data of kind; NULL when out of memory. */
pe_feed_data *pe_feed_data_new(pe_feed_kind kind);
void pe_feed_data_free(pe_feed_data *d);

/* Fashion-MNIST's images and labels as f32 [n, dim] and i64 [n, 1] rows,
 * borrowed: ds must outlive the result. */
pe_feed_data *pe_feed_data_borrow(const pe_dataset *ds);

/* a (its dims[0] the rows) against feed f: dtype equal, ndim equal and
 * every dim after the batch equal (an [N, D] array also fits a declared
 * [-1, D, 1] feed: a trailing 1 is added). 0, or -1 with "file: <what>
 * has shape [N,5]; the model's feed 'x' needs [N,4]" (what: "array 'x'",
 * "column 'y'", ...). */
int pe_feed_array_check(pe_feed_array *a, const pe_feed_decl *f, const char *file, const char *what,
                        char *err, size_t errlen);

/* "[N,3,4]" into buf (at least 24 bytes per dim); returns buf. */
const char *pe_feed_shape_str(int ndim, const int64_t *dims, char *buf, size_t len);
const char *pe_feed_dtype_str(int dtype);

/* Sets the rows (n = x.dims[0]) after a reader filled x and y; -1 with a
 * message when the arrays' row counts differ. */
int pe_feed_data_finish(pe_feed_data *d, const char *file, char *err, size_t errlen);

/* Moves a held-out fraction (0 < fraction < 1) of d's rows, chosen by a
 * permutation seeded with seed, into *test (at least one row each side);
 * both keep the rows in file order. -1 with a message when d has too few
 * rows or memory runs out. */
int pe_feed_data_split(pe_feed_data *d, double fraction, uint64_t seed, pe_feed_data **test,
                       char *err, size_t errlen);

/* A batcher over d's n rows (pe_batcher_claim; not pe_batcher_next). */
pe_batcher *pe_feed_data_batcher(pe_feed_data *d, int batch, bool shuffle, uint64_t seed);

/* Copies rows idx[lo..hi) into rows lo..hi of x and y (either may be NULL). */
void pe_feed_data_gather(const pe_feed_data *d, const int64_t *idx, int lo, int hi, void *x,
                         void *y);

/* The readers. Each checks its arrays against the feeds x (the model's
 * input) and y (its label) and returns 0 with *out (pe_feed_data_free), or
 * -1 with a message naming the file.
 *
 * .npz (numpy.savez, stored or deflated): arrays `<prefix><x->name>` and
 * `<prefix><y->name>`, dtype '<f4' or '<i8' (as the feed), '<f8' for an
 * f32 feed (narrowed to f32), other dtypes only to be refused by name; C
 * order. Returns 1 (no message) when
 * neither array exists and prefix is not empty (an optional split). */
int pe_npz_read(const char *path, const char *prefix, const pe_feed_decl *x, const pe_feed_decl *y,
                pe_feed_data **out, char *err, size_t errlen);

/* CSV with a header row: the columns `label` names, comma-separated and
 * in order (NULL: the last ones, as many as y has values per example), are
 * y's; several fill a y of that many values per example, row-major (an
 * f32 [-1, D] target: D columns). The others, in file order, are x's
 * features (x: f32 [-1, D] with D the other columns). Cells are numbers;
 * an i64 label takes integers only. */
int pe_csv_read(const char *path, const char *label, const pe_feed_decl *x, const pe_feed_decl *y,
                pe_feed_data **out, char *err, size_t errlen);

/* A text file for a byte-level language model: x and y are i64 [-1, T]
 * (y may be [-1, T, 1]); token ids are the byte values 0..255. The first
 * 90% of the bytes give *train, the rest *valid: windows of T + 1 bytes at
 * stride T, input the first T, label the last T. */
int pe_text_read(const char *path, const pe_feed_decl *x, const pe_feed_decl *y,
                 pe_feed_data **train, pe_feed_data **valid, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
