/* The CPU-vs-CUDA harness of the GPU kernel suites (test_cuda_kernels,
 * test_cuda_ops_seq): a fixture that opens cuda:0, and compare() /
 * compare_grads(), which run an op's CPU kernel (op harness) and its CUDA
 * kernel on the same inputs and compare every output. Included by one
 * suite source each (static functions). */
#ifndef PE_TESTS_CUDA_COMPARE_H
#define PE_TESTS_CUDA_COMPARE_H

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ctx.h"
#include "engine/device.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_device *dev;

static void setup(void) {
  pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, 0}, NULL, &dev);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
}

static void teardown(void) {
  pe_device_close(dev);
  dev = NULL;
}

/* Device copies of the scope's variables for one compare(). */
typedef struct dvar {
  const char *name;
  pe_tensor t; /* a view over device memory */
  size_t cap;
} dvar;

typedef struct dscope {
  int n;
  dvar v[64];
} dscope;

static pe_tensor *dget(dscope *d, const char *name) {
  for (int i = 0; i < d->n; i++)
    if (!strcmp(d->v[i].name, name)) return &d->v[i].t;
  return NULL;
}

/* A device tensor of dtype/shape, holding host data when given. */
static pe_tensor *dput(dscope *d, const char *name, pe_dtype dt, const pe_shape *sh,
                       const void *data) {
  ck_assert_int_lt(d->n, 64);
  dvar *v = &d->v[d->n++];
  v->name = name;
  size_t bytes = (size_t)pe_shape_numel(sh) * pe_dtype_size(dt);
  void *p = pe_device_alloc(dev, bytes ? bytes : 1, &v->cap);
  ck_assert_ptr_nonnull(p);
  pe_tensor_init(&v->t);
  pe_tensor_view(&v->t, dt, sh, p);
  /* Poison outputs so that an unwritten element shows. */
  ck_assert_int_eq(cudaMemset(p, 0x7f, bytes), cudaSuccess);
  if (data && bytes)
    ck_assert_int_eq(cudaMemcpy(p, data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return &v->t;
}

static void dfree(dscope *d) {
  for (int i = 0; i < d->n; i++) pe_device_free(dev, d->v[i].t.data, d->v[i].cap);
  d->n = 0;
}

static bool close_enough(double got, double want, double tol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

static void expect_same(const char *op, const char *name, const pe_tensor *ref,
                        const pe_tensor *gpu, double tol) {
  ck_assert_msg(ref->dtype == gpu->dtype && pe_shape_equal(&ref->shape, &gpu->shape),
                "%s: output '%s' dtype/shape differs", op, name);
  size_t bytes = pe_tensor_bytes(ref);
  void *h = malloc(bytes ? bytes : 1);
  ck_assert_int_eq(cudaMemcpy(h, gpu->data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t n = pe_tensor_numel(ref);
  for (int64_t i = 0; i < n; i++) {
    double a, b;
    switch (ref->dtype) {
      case PE_F32: a = ((float *)h)[i], b = pe_f32(ref)[i]; break;
      case PE_F64: a = ((double *)h)[i], b = ((double *)ref->data)[i]; break;
      case PE_I32: a = ((int32_t *)h)[i], b = ((int32_t *)ref->data)[i]; break;
      case PE_I64: a = (double)((int64_t *)h)[i], b = (double)pe_i64(ref)[i]; break;
      default: a = ((uint8_t *)h)[i], b = ((uint8_t *)ref->data)[i]; break;
    }
    bool isfloat = ref->dtype == PE_F32 || ref->dtype == PE_F64;
    ck_assert_msg(isfloat ? close_enough(a, b, tol) : a == b,
                  "%s: output '%s' element %lld: cuda %.9g, cpu %.9g", op, name, (long long)i, a,
                  b);
  }
  free(h);
}

/* Run op on the CPU (scope s) and on cuda:0; compare every output. */
static void compare(pe_scope *s, const pe_op_desc *op, double tol) {
  const pe_op_def *def = pe_op_lookup(op->type);
  ck_assert_ptr_nonnull(def);
  ck_assert_msg(def->kernel_cuda, "%s has no CUDA kernel", op->type);
  static dscope d;
  d.n = 0;
  /* Inputs first, before the CPU run may update them in place. */
  for (int i = 0; i < op->n_in; i++)
    for (int k = 0; k < op->in[i].n; k++) {
      const char *name = op->in[i].args[k];
      pe_tensor *h = ph_get(s, name);
      ck_assert_msg(h, "%s: input '%s' not set", op->type, name);
      if (!dget(&d, name)) dput(&d, name, h->dtype, &h->shape, h->data);
    }
  pe_rng r_cpu = {4242, 6}, r_gpu = r_cpu;
  PE_CK_OK(ph_run_op(s, op, &r_cpu));
  pe_tensor_list in[16], out[16];
  pe_tensor *tin[16][16], *tout[16][16];
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  for (int i = 0; i < op->n_in; i++) {
    int di = pe_op_input_index(def, op->in[i].name);
    for (int k = 0; k < op->in[i].n; k++) tin[di][k] = dget(&d, op->in[i].args[k]);
    in[di] = (pe_tensor_list){op->in[i].n, tin[di]};
  }
  for (int i = 0; i < op->n_out; i++) {
    int di = pe_op_output_index(def, op->out[i].name);
    for (int k = 0; k < op->out[i].n; k++) {
      const char *name = op->out[i].args[k];
      pe_tensor *h = ph_get(s, name);
      pe_tensor *t = dget(&d, name);
      if (!t) t = dput(&d, name, h->dtype, &h->shape, NULL);
      tout[di][k] = t;
    }
    out[di] = (pe_tensor_list){op->out[i].n, tout[di]};
  }
  pe_stream *comp = pe_device_stream(dev, PE_STREAM_COMPUTE);
  void *state = NULL;
  pe_kernel_ctx kc = {def, op, 0, in, out, &state, &r_gpu, pe_stream_ctx(comp)};
  pe_status *st = def->kernel_cuda(&kc);
  ck_assert_msg(!st, "%s: %s", op->type, pe_status_msg(st));
  st = pe_stream_sync(comp);
  ck_assert_msg(!st, "%s: %s", op->type, pe_status_msg(st));
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  if (state && def->state_free_cuda) def->state_free_cuda(state);
  ck_assert_msg(r_cpu.offset == r_gpu.offset, "%s: generator offsets differ (%llu vs %llu)",
                op->type, (unsigned long long)r_cpu.offset, (unsigned long long)r_gpu.offset);
  for (int i = 0; i < op->n_out; i++)
    for (int k = 0; k < op->out[i].n; k++) {
      const char *name = op->out[i].args[k];
      expect_same(op->type, name, ph_get(s, name), dget(&d, name), tol);
    }
  dfree(&d);
}

/* Forward, then every gradient op with random output gradients. */
static void compare_grads(pe_scope *s, const pe_op_desc *fwd, double tol) {
  compare(s, fwd, tol);
  const pe_op_def *def = pe_op_lookup(fwd->type);
  ck_assert_ptr_nonnull(def->grad);
  pe_grad_ctx g;
  pe_grad_ctx_init(&g, def, fwd);
  PE_CK_OK(def->grad(&g));
  ck_assert_int_ge(g.n_ops, 1);
  uint64_t seed = 900;
  for (int j = 0; j < g.n_ops; j++) {
    pe_op_desc *op = g.ops[j];
    for (int i = 0; i < op->n_in; i++)
      for (int k = 0; k < op->in[i].n; k++) {
        const char *name = op->in[i].args[k];
        pe_tensor *have = ph_get(s, name);
        size_t len = strlen(name), sl = strlen(PE_GRAD_SUFFIX);
        bool is_grad = len > sl && !strcmp(name + len - sl, PE_GRAD_SUFFIX);
        if (have && !is_grad) continue;
        ck_assert_msg(is_grad, "%s: input '%s' missing", op->type, name);
        char base[256];
        snprintf(base, sizeof base, "%.*s", (int)(len - sl), name);
        pe_tensor *b = ph_get(s, base);
        ck_assert_msg(b, "%s: no forward variable '%s'", op->type, base);
        /* A gradient left in the scope by an earlier case of another
         * shape is made again (cases share the scope's names). */
        if (have && pe_shape_equal(&have->shape, &b->shape)) continue;
        ph_set_uniform(s, name, b->shape, -1.0f, 1.0f, seed++);
      }
    compare(s, op, tol);
  }
  pe_grad_ctx_destroy(&g);
}

static pe_op_desc *op1(const char *type, const char *in, const char *out) {
  return ph_op(type, "X", in, NULL, "Out", out, NULL);
}

#endif
