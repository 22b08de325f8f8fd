/* The CUDA backend without a GPU: what CI can check on a machine with the
 * toolkit but no device. Every op of the registry but the cpu-only ones
 * (listed below) has a CUDA kernel, the cuda kind is registered, opening a
 * cuda place without a driver/GPU fails with a clear PE_EBACKEND status
 * (never a crash), and the caching allocator reuses blocks (exercised
 * over a host-memory backend).
 * Without PE_HAVE_CUDA (PE_CUDA=OFF or no nvcc) the suite is skipped. */
#include <stdio.h>
#include <stdlib.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend (PE_CUDA=OFF or nvcc not found)\n");
  return 77;
}
#else

#include <check.h>
#include <string.h>

#include "check_main.h"
#include "core/tensor.h"
#include "cuda/cuda_alloc.h"
#include "cuda/cuda_ctx.h"
#include "engine/device.h"
#include "ops/registry.h"
#include "test_assert.h"

/* The ops that run on cpu places only (a cuda place refuses them when the
 * executor compiles its graph, naming the op and the place kind). */
static const char *const cpu_only[] = {
    NULL,
};

static bool is_cpu_only(const char *type) {
  for (int i = 0; cpu_only[i]; i++)
    if (strcmp(cpu_only[i], type) == 0) return true;
  return false;
}

START_TEST(every_op_has_a_cuda_kernel) {
  int n = pe_op_count(), with_cpu = 0;
  for (int i = 0; i < n; i++) {
    const pe_op_def *d = pe_op_at(i);
    if (!d->kernel_cpu) continue;
    with_cpu++;
    if (is_cpu_only(d->type)) {
      ck_assert_msg(pe_op_kernel(d, PE_PLACE_CUDA) == NULL, "op '%s' is listed cpu-only", d->type);
      continue;
    }
    ck_assert_msg(pe_op_kernel(d, PE_PLACE_CUDA) != NULL, "op '%s' has no CUDA kernel", d->type);
    ck_assert_ptr_eq(pe_op_kernel(d, PE_PLACE_CPU), d->kernel_cpu);
  }
  ck_assert_int_ge(with_cpu, 40); /* the core set and its gradients */
  /* cuDNN ops keep descriptors in op state: it must be freed. */
  ck_assert_ptr_nonnull(pe_op_state_free(pe_op_lookup("conv2d"), PE_PLACE_CUDA));
}
END_TEST

/* Run op's cuda kernel without a GPU, with input slot `slot` (-1: none)
 * bound to a tensor that is never read; the status it returns. */
static pe_status *run_cuda_kernel(const pe_op_desc *op, int slot) {
  const pe_op_def *def = pe_op_lookup(op->type);
  ck_assert_ptr_nonnull(def);
  pe_tensor t, *tp = &t;
  pe_tensor_init(&t);
  pe_tensor_list in[16], out[16];
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  if (slot >= 0) in[slot] = (pe_tensor_list){1, &tp};
  void *state = NULL;
  pe_kernel_ctx kc = {def, op, 0, in, out, &state, NULL, NULL, 0};
  return pe_op_kernel(def, PE_PLACE_CUDA)(&kc);
}

static void expect_refusal(pe_status *st, const char *op, const char *what) {
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(st->code, PE_EBACKEND);
  ck_assert_msg(strstr(st->msg, op) && strstr(st->msg, what), "unclear refusal: %s", st->msg);
  pe_status_free(st);
}

/* Sparse gradients have no CUDA kernels: lookup_table_v2_grad with
 * is_sparse and the optimizers given GradRows refuse them, naming the op
 * and the attribute or the variable, before they need a GPU (an optimizer
 * would otherwise read the [n, dim] rows as the whole parameter). */
START_TEST(sparse_gradients_are_refused) {
  pe_op_desc *op = pe_op_desc_new("lookup_table_v2_grad");
  PE_CK_OK(pe_op_set_bool(op, "is_sparse", true));
  expect_refusal(run_cuda_kernel(op, -1), "lookup_table_v2_grad", "is_sparse");
  pe_op_desc_free(op);
  const char *opt[] = {"sgd", "momentum", "adam"};
  for (int i = 0; i < 3; i++) {
    op = pe_op_desc_new(opt[i]);
    PE_CK_OK(pe_op_input1(op, "GradRows", "emb@GRAD@ROWS"));
    int slot = pe_op_input_index(pe_op_lookup(opt[i]), "GradRows");
    ck_assert_int_ge(slot, 0);
    expect_refusal(run_cuda_kernel(op, slot), opt[i], "GradRows 'emb@GRAD@ROWS'");
    pe_op_desc_free(op);
  }
}
END_TEST

START_TEST(cuda_kind_is_registered) {
  const pe_device_ops *ops = pe_device_kind_ops(PE_PLACE_CUDA);
  ck_assert_ptr_nonnull(ops);
  ck_assert_str_eq(ops->name, "cuda");
  ck_assert(ops->async);
  ck_assert(!ops->host_memory); /* device pointers: never dereferenced on the host */
  ck_assert_ptr_nonnull(ops->event_init);
  ck_assert_ptr_nonnull(ops->event_fini);
}
END_TEST

START_TEST(open_without_gpu_is_a_clear_error) {
  pe_status *why = NULL;
  int n = pe_cuda_device_count(&why);
  pe_device *d = (pe_device *)0x1;
  /* No GPU: cuda:0 fails; with GPUs: the first id past the last fails. */
  pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, n}, NULL, &d);
  ck_assert_ptr_null(d);
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(st->code, PE_EBACKEND);
  char place[16];
  snprintf(place, sizeof place, "cuda:%d", n);
  ck_assert_msg(strstr(st->msg, place), "message does not name %s: %s", place, st->msg);
  if (n == 0) {
    ck_assert_ptr_nonnull(why);
    /* The CUDA error string is part of the message. */
    ck_assert_msg(strstr(st->msg, "cudaGetDeviceCount") || strstr(st->msg, "no GPU"),
                  "message lacks the CUDA error: %s", st->msg);
  } else {
    ck_assert_msg(strstr(st->msg, "visible"), "unexpected message: %s", st->msg);
  }
  printf("cuda open error (expected): %s\n", st->msg);
  pe_status_free(st);
  pe_status_free(why);
}
END_TEST

typedef struct counting {
  int allocs, frees;
} counting;

static void *host_alloc(size_t bytes, void *arg) {
  ((counting *)arg)->allocs++;
  return malloc(bytes);
}

static void host_free(void *p, void *arg) {
  ((counting *)arg)->frees++;
  free(p);
}

START_TEST(cache_reuses_blocks_of_a_class) {
  counting cnt = {0, 0};
  pe_cuda_cache *c =
      pe_cuda_cache_new((pe_cuda_backend){host_alloc, host_free, &cnt}, PE_CUDA_CACHE_LIMIT);
  ck_assert_ptr_nonnull(c);
  size_t cap1, cap2, cap3;
  void *a = pe_cuda_cache_alloc(c, 1000, &cap1);
  ck_assert_ptr_nonnull(a);
  ck_assert_uint_eq(cap1, 1024);
  pe_cuda_cache_release(c, a, cap1);
  /* Same class (513..1024 bytes): the cached block, no backend call. */
  void *b = pe_cuda_cache_alloc(c, 600, &cap2);
  ck_assert_ptr_eq(a, b);
  ck_assert_uint_eq(cap2, 1024);
  ck_assert_int_eq(cnt.allocs, 1);
  /* Another class: a new block. */
  void *d = pe_cuda_cache_alloc(c, 5000, &cap3);
  ck_assert_ptr_ne(d, b);
  ck_assert_uint_eq(cap3, 8192);
  ck_assert_int_eq(cnt.allocs, 2);
  pe_alloc_stats s = pe_cuda_cache_stats(c);
  ck_assert_uint_eq(s.bytes_in_use, 1024 + 8192);
  ck_assert_uint_eq(s.n_alloc, 3);
  ck_assert_uint_eq(s.n_system, 2);
  pe_cuda_cache_release(c, b, cap2);
  pe_cuda_cache_release(c, d, cap3);
  s = pe_cuda_cache_stats(c);
  ck_assert_uint_eq(s.bytes_in_use, 0);
  ck_assert_uint_eq(s.bytes_cached, 1024 + 8192);
  ck_assert_uint_eq(s.peak_in_use, 1024 + 8192);
  pe_cuda_cache_free(c);
  ck_assert_int_eq(cnt.frees, 2); /* everything cached went back */
}
END_TEST

static void *impl_alloc(void *self, size_t bytes, size_t *cap) {
  return pe_cuda_cache_alloc(self, bytes, cap);
}
static void impl_free(void *self, void *p, size_t cap) {
  pe_cuda_cache_release(self, p, cap);
}
static void impl_trim(void *self) {
  pe_cuda_cache_trim(self);
}
static pe_alloc_stats impl_stats(void *self) {
  return pe_cuda_cache_stats(self);
}

/* The cuda device hands the executor its cache as a pe_allocator; tensors
 * resized with it take their blocks from the cache and give them back. */
START_TEST(cache_behind_the_allocator_interface) {
  counting cnt = {0, 0};
  pe_cuda_cache *c =
      pe_cuda_cache_new((pe_cuda_backend){host_alloc, host_free, &cnt}, PE_CUDA_CACHE_LIMIT);
  static const pe_allocator_impl impl = {impl_alloc, impl_free, impl_trim, impl_stats, NULL};
  pe_allocator *a = pe_allocator_new_impl(&impl, c);
  ck_assert_ptr_nonnull(a);
  pe_tensor t;
  pe_tensor_init(&t);
  pe_shape sh = PE_SHAPE(10, 30);
  ck_assert_ptr_null(pe_tensor_resize_with(&t, a, PE_F32, &sh, "w"));
  ck_assert_uint_eq(t.cap, 2048); /* 1200 bytes -> the 2 KiB class */
  ck_assert_ptr_eq(t.alloc, a);
  void *first = t.data;
  pe_tensor_release(&t);
  ck_assert_uint_eq(pe_allocator_stats(a).bytes_cached, 2048);
  ck_assert_ptr_null(pe_tensor_resize_with(&t, a, PE_F32, &sh, "w"));
  ck_assert_ptr_eq(t.data, first);
  ck_assert_int_eq(cnt.allocs, 1);
  pe_tensor_release(&t);
  pe_allocator_trim(a);
  ck_assert_int_eq(cnt.frees, 1);
  pe_allocator_free(a);
  pe_cuda_cache_free(c);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_build");
  TCase *t = tcase_create("no_gpu");
  tcase_add_test(t, every_op_has_a_cuda_kernel);
  tcase_add_test(t, sparse_gradients_are_refused);
  tcase_add_test(t, cuda_kind_is_registered);
  tcase_add_test(t, open_without_gpu_is_a_clear_error);
  tcase_add_test(t, cache_reuses_blocks_of_a_class);
  tcase_add_test(t, cache_behind_the_allocator_interface);
  suite_add_tcase(s, t);
  return s;
}

PE_CHECK_MAIN(suite)

#endif
