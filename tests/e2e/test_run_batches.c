/* Run requests that carry several mini-batches (RunRequest.batches, the
 * daemon's run/batches.c) against the real daemon:
 *  - k batches in one request give, step for step, the losses of k
 *    single-batch requests, and then bit-identical parameters: on cpu:2
 *    (AllReduce and Sharded), cpu:3 (uneven splits of 32 rows) and sim:2;
 *    the fetches come back stacked [k, 1];
 *  - bad requests are refused naming the feed, the shape and the batches,
 *    and change nothing; a step that fails (a label out of range in the
 *    third batch) stops the request with the step's error, the two steps
 *    before it stay applied (the parameters equal those after two
 *    single-batch requests), and the daemon goes on serving;
 *  - the batches from a shared-memory region equal inline ones, and a
 *    region truncated under a request fails the step whose rows are gone
 *    (the steps before it stay applied);
 *  - feeds that name rows of a region by index equal the rows gathered
 *    and sent inline.
 * Data: synthetic batches (no dataset needed). Skipped (77) when
 * pe-executord is not built. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_daemon.h"
#include "pe_client.h"
#include "pe_models.h"

#define ROWS 32 /* per mini-batch */
#define K 4     /* mini-batches per request */
#define DIM 784

/* K deterministic mini-batches, stored back to back: pixels from an LCG,
 * labels (i + batch) % 10. */
typedef struct batches {
  float x[K * ROWS * DIM];
  int64_t y[K * ROWS];
} batches;

static batches *batches_new(void) {
  batches *b = malloc(sizeof *b);
  ck_assert_ptr_nonnull(b);
  uint32_t s = 12345;
  for (int i = 0; i < K * ROWS * DIM; i++) {
    s = s * 1664525u + 1013904223u;
    b->x[i] = (float)(s >> 8) / (float)(1u << 24);
  }
  for (int i = 0; i < K * ROWS; i++) b->y[i] = (i + i / ROWS) % 10;
  return b;
}

/* Feeds over mini-batches [first, first + n) of b. */
static void feeds_of(const pe_model_spec *m, const batches *b, int first, int n,
                     pe_client_tensor f[2]) {
  pe_client_tensor_set(&f[0], m->image, PE_B_F32, 2, (int64_t[]){(int64_t)n * ROWS, DIM},
                       &b->x[(size_t)first * ROWS * DIM]);
  pe_client_tensor_set(&f[1], m->label, PE_B_I64, 2, (int64_t[]){(int64_t)n * ROWS, 1},
                       &b->y[(size_t)first * ROWS]);
}

typedef struct fixture {
  cd_daemon d;
  pe_client *c;
  pe_model_spec m;
  batches *b;
} fixture;

static void fixture_start(fixture *f) {
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &f->m, err, sizeof err) == 0, "%s", err);
  f->b = batches_new();
  cd_start(&f->d);
  f->c = cd_connect(&f->d);
}

static void fixture_stop(fixture *f) {
  pe_client_free(f->c);
  cd_stop(&f->d);
  pe_model_spec_release(&f->m);
  free(f->b);
}

/* Register and initialise model ns (seed 5) on places; its train handle. */
static uint64_t model_new(fixture *f, const char *ns, const char *places,
                          pe_client_strategy strategy) {
  const char *keep[] = {f->m.loss, f->m.accuracy};
  pe_client_register_args a = {.program = f->m.bytes,
                               .program_len = f->m.len,
                               .model = ns,
                               .places = places,
                               .strategy = strategy,
                               .seed = 5,
                               .keep = keep,
                               .n_keep = 2};
  pe_client_program p;
  CD_OK(f->c, pe_client_register(f->c, &a, &p));
  CD_OK(f->c, pe_client_init(f->c, p.handle, false, NULL));
  return p.handle;
}

/* Every parameter of models a and b is bit-identical. */
static void params_same(fixture *f, const char *a, const char *b) {
  const pe_client_tensor *v;
  size_t n, nb;
  CD_OK(f->c, pe_client_get_params(f->c, a, NULL, 0, &v, &n));
  ck_assert_uint_ge(n, 6);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += v[i].nbytes;
  /* The reply's tensors live until the next request: copy a's. */
  char **names = calloc(n, sizeof *names);
  void **data = calloc(n, sizeof *data);
  size_t *bytes = calloc(n, sizeof *bytes);
  for (size_t i = 0; i < n; i++) {
    names[i] = strdup(v[i].name);
    bytes[i] = v[i].nbytes;
    data[i] = malloc(bytes[i]);
    memcpy(data[i], v[i].data, bytes[i]);
  }
  CD_OK(f->c, pe_client_get_params(f->c, b, NULL, 0, &v, &nb));
  ck_assert_uint_eq(nb, n);
  for (size_t i = 0; i < n; i++) {
    const pe_client_tensor *w = pe_client_find(v, nb, names[i]);
    ck_assert_msg(w, "model %s has no %s", b, names[i]);
    ck_assert_uint_eq(w->nbytes, bytes[i]);
    ck_assert_msg(!memcmp(w->data, data[i], bytes[i]), "%s differs between %s and %s", names[i], a,
                  b);
    free(names[i]);
    free(data[i]);
  }
  ck_assert_uint_gt(total, 784 * 256 * 4);
  free(names);
  free(data);
  free(bytes);
}

/* Losses of k single-batch requests on model `single` vs one k-batch
 * request on model `multi`, then their parameters. */
static void check_equal(fixture *f, const char *places, pe_client_strategy strategy) {
  char single[64], multi[64];
  snprintf(single, sizeof single, "single-%s-%d", places, (int)strategy);
  snprintf(multi, sizeof multi, "multi-%s-%d", places, (int)strategy);
  single[strcspn(single, ":")] = '_';
  multi[strcspn(multi, ":")] = '_';
  uint64_t hs = model_new(f, single, places, strategy);
  uint64_t hm = model_new(f, multi, places, strategy);
  const char *fetch[] = {f->m.loss, f->m.accuracy};
  pe_client_tensor feeds[2];
  pe_client_run_result r;
  float loss[K], acc[K];
  for (int k = 0; k < K; k++) {
    feeds_of(&f->m, f->b, k, 1, feeds);
    CD_OK(f->c, pe_client_run(f->c, hs, feeds, 2, fetch, 2, NULL, &r));
    loss[k] = ((const float *)pe_client_find(r.fetched, r.n_fetched, fetch[0])->data)[0];
    acc[k] = ((const float *)pe_client_find(r.fetched, r.n_fetched, fetch[1])->data)[0];
  }
  ck_assert_msg(loss[K - 1] < loss[0], "%s: loss %g -> %g", places, loss[0], loss[K - 1]);
  feeds_of(&f->m, f->b, 0, K, feeds);
  pe_client_run_opts o = {.batches = K};
  CD_OK(f->c, pe_client_run(f->c, hm, feeds, 2, fetch, 2, &o, &r));
  ck_assert_uint_eq(r.steps, K);
  ck_assert_uint_eq(r.n_fetched, 2);
  for (int j = 0; j < 2; j++) {
    const pe_client_tensor *t = pe_client_find(r.fetched, r.n_fetched, fetch[j]);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, PE_B_F32);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_int_eq(t->shape[0], K);
    ck_assert_int_eq(t->shape[1], 1);
    for (int k = 0; k < K; k++) {
      float want = j ? acc[k] : loss[k], got = ((const float *)t->data)[k];
      ck_assert_msg(!memcmp(&got, &want, sizeof got),
                    "%s %s step %d: %.9g in one request, %.9g "
                    "in single ones",
                    places, fetch[j], k, got, want);
    }
  }
  params_same(f, single, multi);
}

START_TEST(batches_equal_single_requests) {
  fixture f;
  fixture_start(&f);
  check_equal(&f, "cpu:2", PE_C_ALLREDUCE);
  check_equal(&f, "cpu:2", PE_C_SHARDED);
  check_equal(&f, "cpu:3", PE_C_ALLREDUCE);
  check_equal(&f, "sim:2", PE_C_ALLREDUCE);
  fixture_stop(&f);
}
END_TEST

/* A refused request: an error code from the daemon naming every word of
 * `want`; returns the steps it applied (the result's steps). */
static uint32_t refused(fixture *f, uint64_t h, const pe_client_tensor *feeds, uint32_t batches,
                        uint32_t steps, const char *const *want) {
  const char *fetch[] = {f->m.loss};
  pe_client_run_opts o = {.batches = batches, .steps = steps};
  pe_client_run_result r;
  int rc = pe_client_run(f->c, h, feeds, 2, fetch, 1, &o, &r);
  ck_assert_msg(rc != 0 && rc < PE_C_CLIENT_BASE, "rc %d: %s", rc, pe_client_error(f->c));
  fprintf(stderr, "refused as expected: %s\n", pe_client_error(f->c));
  for (; *want; want++)
    ck_assert_msg(strstr(pe_client_error(f->c), *want), "'%s' not in: %s", *want,
                  pe_client_error(f->c));
  return r.steps;
}

START_TEST(bad_batches_and_a_failing_step) {
  fixture f;
  fixture_start(&f);
  uint64_t h = model_new(&f, "multi", "cpu:2", PE_C_ALLREDUCE);
  uint64_t h2 = model_new(&f, "two-steps", "cpu:2", PE_C_ALLREDUCE);
  pe_client_tensor feeds[2];
  /* 4 x 32 rows refused as 3 batches. */
  feeds_of(&f.m, f.b, 0, K, feeds);
  refused(&f, h, feeds, 3, 0,
          (const char *[]){f.m.image, "[128,784]", "not a multiple of batches 3", NULL});
  /* steps that disagree with batches. */
  refused(&f, h, feeds, K, 3, (const char *[]){"steps 3 with batches 4", NULL});
  /* Feeds with different rows per batch. */
  feeds[1].shape[0] = 2 * ROWS;
  feeds[1].nbytes /= 2;
  refused(&f, h, feeds, 2, 0,
          (const char *[]){f.m.label, "[64,1]", "[128,784]", "rows per batch", NULL});
  /* None of that changed the model: it still equals a fresh one. */
  params_same(&f, "multi", "two-steps");

  /* A label out of range in mini-batch 2: steps 0 and 1 run, step 2 fails. */
  f.b->y[2 * ROWS + 5] = 10;
  feeds_of(&f.m, f.b, 0, K, feeds);
  /* The message and the result say that steps 0 and 1 stay applied. */
  uint32_t applied = refused(&f, h, feeds, K, 0,
                             (const char *[]){"step 2", "10", "steps 0..1 stay applied", NULL});
  ck_assert_uint_eq(applied, 2);
  const char *fetch[] = {f.m.loss};
  pe_client_run_result r;
  for (int k = 0; k < 2; k++) {
    feeds_of(&f.m, f.b, k, 1, feeds);
    CD_OK(f.c, pe_client_run(f.c, h2, feeds, 2, fetch, 1, NULL, &r));
  }
  params_same(&f, "multi", "two-steps");
  /* The daemon goes on: a good multi-batch request on both models. */
  f.b->y[2 * ROWS + 5] = 5;
  feeds_of(&f.m, f.b, 2, 2, feeds);
  pe_client_run_opts o = {.batches = 2};
  CD_OK(f.c, pe_client_run(f.c, h, feeds, 2, fetch, 1, &o, &r));
  ck_assert_uint_eq(r.steps, 2);
  CD_OK(f.c, pe_client_run(f.c, h2, feeds, 2, fetch, 1, &o, &r));
  params_same(&f, "multi", "two-steps");
  CD_OK(f.c, pe_client_ping(f.c));
  fixture_stop(&f);
}
END_TEST

/* Two fresh models named PREFIX_A-PLACES and PREFIX_B-PLACES (':' as
 * '_') on places, and a region holding b's K mini-batches, labels first,
 * then images. */
typedef struct shm_pair {
  char a[64], b[64];
  uint64_t ha, hb;
  pe_client_shm shm;
} shm_pair;

static void shm_pair_start(fixture *f, const char *pa, const char *pb, const char *places,
                           pe_client_strategy strategy, shm_pair *p) {
  snprintf(p->a, sizeof p->a, "%s-%s", pa, places);
  snprintf(p->b, sizeof p->b, "%s-%s", pb, places);
  p->a[strcspn(p->a, ":")] = '_';
  p->b[strcspn(p->b, ":")] = '_';
  p->ha = model_new(f, p->a, places, strategy);
  p->hb = model_new(f, p->b, places, strategy);
  const size_t ysz = sizeof f->b->y, xsz = sizeof f->b->x;
  int rc = pe_client_shm_create(f->c, ysz + xsz, &p->shm);
  ck_assert_msg(rc == 0, "shm: %s", pe_client_error(f->c));
  memcpy(p->shm.base, f->b->y, ysz);
  memcpy((char *)p->shm.base + ysz, f->b->x, xsz);
}

/* The same K mini-batches from a shared-memory region (labels first, then
 * images: the daemon copies each mini-batch's rows straight from the
 * region) and inline: the same stacked fetches and parameters. Then the
 * client truncates the region inside mini-batch 2's images: steps 0 and 1
 * run, the request fails at mini-batch 2 naming the feed, the batch and the
 * truncation, and the model equals one that ran mini-batches 0 and 1
 * inline (on cpu the pool's workers copy the rows, on sim the prefetch
 * thread: the SIGBUS guard holds on either). */
static void shm_check(fixture *f, const char *places) {
  shm_pair sp;
  shm_pair_start(f, "inline", "sp.shm", places, PE_C_ALLREDUCE, &sp);
  const size_t ysz = sizeof f->b->y, xsz = sizeof f->b->x;
  const char *fetch[] = {f->m.loss, f->m.accuracy};
  pe_client_run_opts o = {.batches = K};
  pe_client_tensor feeds[2];
  pe_client_run_result r;
  feeds_of(&f->m, f->b, 0, K, feeds);
  CD_OK(f->c, pe_client_run(f->c, sp.ha, feeds, 2, fetch, 2, &o, &r));
  float want[2][K];
  for (int j = 0; j < 2; j++)
    memcpy(want[j], pe_client_find(r.fetched, r.n_fetched, fetch[j])->data, sizeof want[j]);
  feeds[0].shm_region = feeds[1].shm_region = sp.shm.region;
  feeds[0].shm_offset = ysz;
  feeds[1].shm_offset = 0;
  CD_OK(f->c, pe_client_run(f->c, sp.hb, feeds, 2, fetch, 2, &o, &r));
  ck_assert_uint_eq(r.steps, K);
  for (int j = 0; j < 2; j++)
    ck_assert_msg(
        !memcmp(pe_client_find(r.fetched, r.n_fetched, fetch[j])->data, want[j], sizeof want[j]),
        "%s: %s from shared memory differs from inline", places, fetch[j]);
  params_same(f, sp.a, sp.b);

  /* Cut inside mini-batch 2's images, two pages past its first row (the
   * pages of batches 0 and 1 stay readable). */
  size_t batch_bytes = (size_t)ROWS * DIM * sizeof(float);
  int fd = shm_open(sp.shm.name, O_RDWR, 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)(ysz + 2 * batch_bytes + 8192)), 0);
  ck_assert_uint_eq(refused(f, sp.hb, feeds, K, 0,
                            (const char *[]){"batch 2", f->m.image, "truncated",
                                             "steps 0..1 stay applied", NULL}),
                    2);
  feeds_of(&f->m, f->b, 0, 2, feeds);
  o.batches = 2;
  CD_OK(f->c, pe_client_run(f->c, sp.ha, feeds, 2, fetch, 2, &o, &r));
  params_same(f, sp.a, sp.b);
  CD_OK(f->c, pe_client_ping(f->c));
  ck_assert_int_eq(ftruncate(fd, (off_t)(ysz + xsz)), 0);
  close(fd);
  pe_client_shm_close(f->c, &sp.shm);
}

/* Feeds by row index (pe_client_tensor.shm_rows): the K mini-batches'
 * rows in a region once, in file order, and a request naming them in a
 * shuffled order equals the same rows gathered and sent inline, bit for
 * bit: K batches in one request (the daemon's workers copy each batch's
 * rows from the pinned region) and a single batch (copied at the request).
 * Then the client's own checks: an index outside the array, and indices
 * without a region, are refused before anything is sent. */
static void rows_check(fixture *f, const char *places) {
  shm_pair sp;
  shm_pair_start(f, "gathered", "rows", places, PE_C_SHARDED, &sp);
  const size_t ysz = sizeof f->b->y;
  enum { N = K * ROWS };
  int64_t perm[N];
  batches *g = malloc(sizeof *g);
  ck_assert_ptr_nonnull(g);
  for (int i = 0; i < N; i++) {
    perm[i] = (i * 37 + 5) % N; /* 37 is prime to N: a permutation */
    memcpy(&g->x[(size_t)i * DIM], &f->b->x[(size_t)perm[i] * DIM], DIM * sizeof(float));
    g->y[i] = f->b->y[perm[i]];
  }
  const char *fetch[] = {f->m.loss, f->m.accuracy};
  pe_client_tensor feeds[2];
  pe_client_run_result r;
  for (int pass = 0; pass < 2; pass++) { /* K batches, then one */
    int nb = pass ? 1 : K;
    pe_client_run_opts o = {.batches = pass ? 0 : K};
    feeds_of(&f->m, g, 0, nb, feeds);
    CD_OK(f->c, pe_client_run(f->c, sp.ha, feeds, 2, fetch, 2, &o, &r));
    float want[2][K];
    for (int j = 0; j < 2; j++)
      memcpy(want[j], pe_client_find(r.fetched, r.n_fetched, fetch[j])->data,
             sizeof(float) * (size_t)nb);
    feeds_of(&f->m, g, 0, nb, feeds);
    for (int i = 0; i < 2; i++) {
      feeds[i].data = NULL;
      feeds[i].shm_region = sp.shm.region;
      feeds[i].shm_rows = perm;
      feeds[i].shm_array_rows = N;
    }
    feeds[0].shm_offset = ysz; /* the images after the labels */
    CD_OK(f->c, pe_client_run(f->c, sp.hb, feeds, 2, fetch, 2, &o, &r));
    for (int j = 0; j < 2; j++)
      ck_assert_msg(!memcmp(pe_client_find(r.fetched, r.n_fetched, fetch[j])->data, want[j],
                            sizeof(float) * (size_t)nb),
                    "%s: %s by row index differs from the gathered rows (%d batches)", places,
                    fetch[j], nb);
    params_same(f, sp.a, sp.b);
  }
  /* The client refuses an index outside the array, and indices without a
   * region, naming the tensor; the model is unchanged. */
  perm[7] = N;
  pe_client_run_opts o1 = {0};
  int rc = pe_client_run(f->c, sp.hb, feeds, 2, fetch, 1, &o1, &r);
  ck_assert_int_eq(rc, PE_C_EARG);
  ck_assert_msg(strstr(pe_client_error(f->c), "row index 7 is 128") &&
                    strstr(pe_client_error(f->c), f->m.image),
                "%s", pe_client_error(f->c));
  perm[7] = 0;
  feeds[0].shm_region = 0;
  rc = pe_client_run(f->c, sp.hb, feeds, 2, fetch, 1, &o1, &r);
  ck_assert_int_eq(rc, PE_C_EARG);
  ck_assert_msg(strstr(pe_client_error(f->c), "row indices but no shm region"), "%s",
                pe_client_error(f->c));
  params_same(f, sp.a, sp.b);
  free(g);
  pe_client_shm_close(f->c, &sp.shm);
}

/* check on cpu:2 (the pool's workers copy the rows) and sim:2 (the
 * prefetch thread does), one daemon. */
static void on_cpu_and_sim(void (*check)(fixture *, const char *)) {
  fixture f;
  fixture_start(&f);
  check(&f, "cpu:2");
  check(&f, "sim:2");
  fixture_stop(&f);
}

START_TEST(shm_rows_equal_gathered_rows) {
  on_cpu_and_sim(rows_check);
}
END_TEST

START_TEST(shm_batches_and_a_truncated_region) {
  on_cpu_and_sim(shm_check);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("run_batches");
  TCase *tc = tcase_create("run_batches");
  tcase_add_test(tc, batches_equal_single_requests);
  tcase_add_test(tc, bad_batches_and_a_failing_step);
  tcase_add_test(tc, shm_batches_and_a_truncated_region);
  tcase_add_test(tc, shm_rows_equal_gathered_rows);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  cd_require_binary("pe-executord");
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
