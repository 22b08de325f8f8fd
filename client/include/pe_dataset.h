/* Fashion-MNIST reader and mini-batcher (trainer side, libpeclient).
 *
 * Files: <dir>/<split>-images-idx3-ubyte.gz and <split>-labels-idx1-ubyte.gz
 * with split "train" (60,000 examples) or "t10k" (10,000), as Debian's
 * dataset-fashion-mnist installs them. Read through zlib's gzread (a plain,
 * uncompressed file is read as is). Checked: magic numbers (0x803 images,
 * 0x801 labels), image dims, the example counts of both files, the file
 * lengths (short: truncated; longer: trailing bytes), and label values < 10.
 * Every error message names the file and the problem.
 *
 * Representation: images as float32 in [0, 1] (pixel / 255), row-major, one
 * rows*cols vector per example, which feeds both [N,784] and [N,1,28,28]
 * without a copy. Loading does no more than that scaling, so a split never
 * depends on another; a trainer that wants standardised inputs takes the
 * training split's pe_dataset_stats and applies pe_dataset_normalize to both
 * splits (pe-bench does: it makes momentum SGD at the models' fixed learning
 * rates steadier). Labels as int64, one per example (an i64 [N,1] feed).
 *
 * The batcher walks a dataset in mini-batches. With shuffle it draws a fresh
 * Fisher-Yates permutation per epoch from a generator seeded with (seed,
 * epoch), so runs with equal seeds see equal batches. The last batch of an
 * epoch may be partial. Not thread-safe; the dataset must outlive it. */
#ifndef PE_DATASET_H
#define PE_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PE_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define PE_FASHION_MNIST_CLASSES 10

typedef struct pe_dataset {
  int64_t n;       /* examples */
  int rows, cols;  /* 28 x 28 */
  int64_t dim;     /* rows * cols */
  float *images;   /* n * dim, owned */
  int64_t *labels; /* n, owned */
} pe_dataset;

/* $PE_FASHION_MNIST_DIR when set and non-empty, else PE_FASHION_MNIST_DIR. */
const char *pe_dataset_default_dir(void);

/* Load split "train" or "t10k" from dir (NULL: the default dir). Returns 0
 * and *out (free with pe_dataset_free), or -1 with a message in err. */
int pe_dataset_open(const char *dir, const char *split, pe_dataset **out, char *err, size_t errlen);
void pe_dataset_free(pe_dataset *ds);

/* 0 when a model input `name` of ndim dims (dims[0] the batch) takes ds's
 * images: the other dims hold ds->dim values (784 for 28x28). Else -1 with a
 * message naming the input, its shape and both sizes (a model file's
 * `input image 50000` would otherwise make feeds read past each image). */
int pe_dataset_check_input(const pe_dataset *ds, const char *name, int ndim, const int64_t *dims,
                           char *err, size_t errlen);

/* Mean and standard deviation over every pixel of ds (population std). */
void pe_dataset_stats(const pe_dataset *ds, float *mean, float *std);
/* x := (x - mean) / std for every pixel (std > 0). */
void pe_dataset_normalize(pe_dataset *ds, float mean, float std);

typedef struct pe_batcher pe_batcher;

/* batch >= 1; NULL on a bad argument or out of memory. */
pe_batcher *pe_batcher_new(const pe_dataset *ds, int batch, bool shuffle, uint64_t seed);
void pe_batcher_free(pe_batcher *bt);

/* Copy the next batch into images (batch*dim floats) and labels (batch
 * int64) and set *n to its size (<= batch; the epoch's last may be smaller).
 * Returns true for a batch; false once at the end of each epoch (*n = 0),
 * after which the next call starts the next epoch. So one epoch is
 *   while (pe_batcher_next(bt, x, y, &n)) { ... } */
bool pe_batcher_next(pe_batcher *bt, float *images, int64_t *labels, int *n);
/* pe_batcher_next in two halves, for callers that copy a batch's rows on
 * several threads. claim takes the next batch: same sequence, *n and
 * return value as pe_batcher_next, with *idx[0..*n) the examples' indices
 * (owned by the batcher, valid until its next claim, next or reset).
 * gather copies examples idx[lo..hi) into rows lo..hi of images / labels
 * (either may be NULL); gathers of disjoint rows may run concurrently. */
bool pe_batcher_claim(pe_batcher *bt, const int64_t **idx, int *n);
void pe_dataset_gather(const pe_dataset *ds, const int64_t *idx, int lo, int hi, float *images,
                       int64_t *labels);
/* One rank's part of every epoch, for a job across nodes where every
 * node reads the same examples: each epoch's order is made as without it
 * (the seed and the epoch), and this rank walks positions p of it with
 * p % world == rank, n / world of them (the last n % world positions of
 * the order are left out, other examples each epoch). Step s of every
 * rank together then holds positions [s * world * batch, (s + 1) * world
 * * batch) of the order: one machine's batch s of world * batch examples.
 * Offsets (seek) and batches count this rank's examples. Restarts the
 * epoch; false on a bad argument or when a rank would get no example. */
bool pe_batcher_shard(pe_batcher *bt, int world, int rank);
/* Abandon the current epoch; the next call starts a new one. */
void pe_batcher_reset(pe_batcher *bt);
/* Go to example `offset` (0 <= offset <= n, this rank's) of epoch `epoch` (>= 1): the
 * next batch starts there, in that epoch's order, and later epochs follow
 * as usual. For a trainer that repeats steps from a point (the order of an
 * epoch depends only on the seed and the epoch). Returns false on a bad
 * argument. */
bool pe_batcher_seek(pe_batcher *bt, int epoch, int64_t offset);
/* Epochs started so far (1 during the first). */
int pe_batcher_epoch(const pe_batcher *bt);
/* Batches per epoch: ceil(n / batch) (n: this rank's examples). */
int64_t pe_batcher_batches(const pe_batcher *bt);

#ifdef __cplusplus
}
#endif

#endif
