/* The sharded strategy's update node (PE_NODE_SHARDED_UPDATE, graph.h),
 * ZeRO-1 style on shared memory.
 *
 * Why: with AllReduce every place first sums its gradient with the others'
 * (all_reduce) and then streams the whole parameter, gradient and optimizer
 * state through its own optimizer. On cpu places the update is bound by
 * memory bandwidth, and every place pays for all of it. Here each slice of
 * the parameter is updated once, by whichever pool worker runs that chunk:
 * it sums the places' gradients for the slice into a stack block (in place
 * order, so the sums are bit-identical to all_reduce's), runs the
 * optimizer's own kernel on the slice, and copies the new slice of the
 * parameter to the other places. On 2 places that is about
 * half the memory traffic per place of all_reduce + a full optimizer, and
 * the gradient sum is never written back.
 *
 * Slicing (PE_OP_ELEMENTWISE, registry.h): args with Param's element count
 * are sliced; the others must be small (<= SHARD_SMALL elements: learning
 * rate, beta powers). Small inputs are copied before any chunk runs (an
 * in-place optimizer rewrites them: adam's Beta1Pow); each chunk writes its
 * small outputs to its own scratch, and after the last chunk chunk 0's go
 * to place 0 (and a small ParamOut to every place; every chunk computes the
 * same values).
 *
 * What each place holds (ZeRO-1: optimizer state once, not per place).
 * Place 0's Param, optimizer state and small inputs are the ones read, and
 * every place's Grad. The new Param goes to every place (their forward ops
 * read their own replica); the optimizer state (every output but ParamOut:
 * Velocity, Moment1/2, Beta*Pow) is kept on place 0 only, and on the other
 * places the node releases it at its first run (the startup broadcast had
 * filled it), which saves a copy per slice and step and that memory per
 * place. So after a sharded run, reading a state variable on place p > 0
 * (pe_model_get_place) finds no value; place 0's is the model's. The
 * kernel runs with a one-thread device ctx: the chunks are the
 * parallelism.
 *
 * Threads: prepare and finish run on one thread, before the chunks are
 * submitted and after the last one ended; chunks run concurrently on
 * disjoint slices and disjoint scratch. */
#include <stdlib.h>
#include <string.h>

#include "engine/op_run.h"
#include "engine/parallel/executor_internal.h"

#define SHARD_SMALL 16    /* elements of an unsliced arg */
#define SHARD_MAX_ARGS 16 /* args (and slots) per place */
#define SHARD_BLOCK 8192  /* gradient elements summed on the stack per kernel call */

struct par_shard {
  int w_in, w_out;             /* args per place */
  int param, grad;             /* their index among one place's inputs */
  int param_out;               /* ParamOut's index among one place's outputs */
  int64_t n;                   /* Param's elements, this run */
  bool sliced[SHARD_MAX_ARGS]; /* [w_in + w_out], this run */
  float small_in[SHARD_MAX_ARGS][SHARD_SMALL];
  float small_out[PAR_MAX_CHUNKS][SHARD_MAX_ARGS][SHARD_SMALL];
  pe_device_ctx ctx; /* one intra-op thread */
  bool ctx_init;
};

/* Input k / output k of place p (x->tensors is place-major, inputs first). */
static pe_tensor *in_t(const xnode *x, int p, int k) {
  return x->tensors[p * x->shard->w_in + k];
}
static pe_tensor *out_t(const xnode *x, int p, int k) {
  return x->tensors[x->n->n_in_data + p * x->shard->w_out + k];
}
static const char *arg_name(const xnode *x, int p, int a) {
  const par_shard *s = x->shard;
  return a < s->w_in ? x->names[p * s->w_in + a]
                     : x->names[x->n->n_in_data + p * s->w_out + (a - s->w_in)];
}

static int input_index(const pe_graph_node *n, const char *slot) {
  for (int s = 0; s < n->def->n_inputs; s++)
    if (!strcmp(n->def->inputs[s].name, slot) && n->in_slot[s + 1] - n->in_slot[s] == 1)
      return n->in_slot[s];
  return -1;
}

static int output_index(const pe_graph_node *n, const char *slot) {
  for (int s = 0; s < n->def->n_outputs; s++)
    if (!strcmp(n->def->outputs[s].name, slot) && n->out_slot[s + 1] - n->out_slot[s] == 1)
      return n->out_slot[s];
  return -1;
}

pe_status *par_shard_compile(pe_par_exec *e, xnode *x) {
  const pe_graph_node *n = x->n;
  const pe_op_def *def = n->def;
  if (!def || !n->desc || !n->in_slot || !n->out_slot)
    return pe_error(PE_EINTERNAL, "node %d %s: sharded update without an op", x->id, n->name);
  par_shard *s = calloc(1, sizeof(*s));
  if (!s) return pe_error(PE_ENOMEM, "parallel executor: out of memory");
  x->shard = s;
  s->w_in = n->in_slot[def->n_inputs];
  s->w_out = n->out_slot[def->n_outputs];
  s->param = input_index(n, "Param");
  s->grad = input_index(n, "Grad");
  s->param_out = output_index(n, "ParamOut");
  if (!(def->flags & PE_OP_ELEMENTWISE) || s->param < 0 || s->grad < 0 || s->param_out < 0 ||
      s->w_in + s->w_out > SHARD_MAX_ARGS || def->n_inputs + def->n_outputs > SHARD_MAX_ARGS ||
      n->n_in_lv != s->w_in * e->n_places || n->n_out_lv != s->w_out * e->n_places)
    return pe_error(PE_EINTERNAL,
                    "node %d %s: op '%s' cannot be sharded (element-wise optimizer with one Param, "
                    "one Grad and one ParamOut, at most %d args) or the node is malformed",
                    x->id, n->name, def->type, SHARD_MAX_ARGS);
  PE_TRY(pe_device_ctx_init(&s->ctx, pe_cpu_place(), 1));
  s->ctx_init = true;
  return par_compile_op_node(e, x, &s->ctx);
}

void par_shard_free(xnode *x) {
  if (!x->shard) return;
  if (x->shard->ctx_init) pe_device_ctx_destroy(&x->shard->ctx);
  free(x->shard);
  x->shard = NULL;
}

pe_status *par_shard_prepare(xnode *x, int64_t *count) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  par_shard *s = x->shard;
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  /* Place 0 as an ordinary op: value checks, the op's inference, outputs. */
  pe_status *st = pe_op_prepare(n->def, x->tl, x->ml, &x->ic, pe_device_allocator(e->dev[0]));
  if (st) return pe_status_wrap(st, "node %d %s", x->id, n->name);
  /* Other places: their Grad is read, their ParamOut written, their
   * optimizer state dropped (see the top of the file). */
  for (int p = 1; p < e->n_places; p++) {
    const pe_tensor *g0 = in_t(x, 0, s->grad), *g = in_t(x, p, s->grad);
    if (g->dtype != g0->dtype || !pe_shape_equal(&g->shape, &g0->shape) ||
        (!g->data && pe_tensor_numel(g) > 0))
      return pe_error(PE_ESHAPE, "node %d %s: '%s' on place %d is %s %s, on place 0 %s %s", x->id,
                      n->name, arg_name(x, p, s->grad), p, pe_dtype_name(g->dtype),
                      pe_shape_str(&g->shape, s1, sizeof s1), pe_dtype_name(g0->dtype),
                      pe_shape_str(&g0->shape, s2, sizeof s2));
    for (int k = 0; k < s->w_out; k++) {
      pe_tensor *o = out_t(x, p, k);
      if (k != s->param_out) {
        if (o != out_t(x, 0, k)) pe_tensor_release(o);
        continue;
      }
      const pe_tensor *o0 = out_t(x, 0, k);
      PE_TRY(pe_tensor_fit(o, pe_device_allocator(e->dev[p]), o0->dtype, &o0->shape,
                           arg_name(x, p, s->w_in + k)));
    }
  }
  s->n = pe_tensor_numel(in_t(x, 0, s->param));
  for (int a = 0; a < s->w_in + s->w_out; a++) {
    const pe_tensor *t = a < s->w_in ? in_t(x, 0, a) : out_t(x, 0, a - s->w_in);
    int64_t m = pe_tensor_numel(t);
    if (t->dtype != PE_F32)
      return pe_error(PE_EDTYPE, "node %d %s: '%s' is %s %s; strategy sharded updates f32 only",
                      x->id, n->name, arg_name(x, 0, a), pe_dtype_name(t->dtype),
                      pe_shape_str(&t->shape, s1, sizeof s1));
    s->sliced[a] = m == s->n;
    if (!s->sliced[a] && m > SHARD_SMALL)
      return pe_error(PE_ESHAPE,
                      "node %d %s: '%s' has shape %s: neither Param '%s''s %lld elements nor at "
                      "most %d, so it cannot be sliced",
                      x->id, n->name, arg_name(x, 0, a), pe_shape_str(&t->shape, s1, sizeof s1),
                      arg_name(x, 0, s->param), (long long)s->n, SHARD_SMALL);
    if (a < s->w_in && !s->sliced[a] && m > 0)
      memcpy(s->small_in[a], t->data, (size_t)m * sizeof(float));
  }
  *count = s->n;
  return NULL;
}

pe_status *par_shard_chunk(xnode *x, int c, int64_t lo, int64_t hi) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  const pe_op_def *def = n->def;
  par_shard *s = x->shard;
  int np = e->n_places;
  if (lo >= hi && c != 0) return NULL; /* chunk 0 always runs: it computes the small outputs */
  float acc[SHARD_BLOCK] __attribute__((aligned(64)));
  pe_tensor v[SHARD_MAX_ARGS];
  pe_tensor *vp[SHARD_MAX_ARGS];
  pe_tensor_list tl[SHARD_MAX_ARGS];
  for (int a = 0; a < s->w_in + s->w_out; a++) {
    pe_tensor_init(&v[a]);
    vp[a] = &v[a];
    if (s->sliced[a]) continue;
    const pe_tensor *t = a < s->w_in ? in_t(x, 0, a) : out_t(x, 0, a - s->w_in);
    pe_tensor_view(&v[a], PE_F32, &t->shape,
                   a < s->w_in ? s->small_in[a] : s->small_out[c][a - s->w_in]);
  }
  for (int k = 0; k < def->n_inputs; k++)
    tl[k] = (pe_tensor_list){n->in_slot[k + 1] - n->in_slot[k], &vp[n->in_slot[k]]};
  for (int k = 0; k < def->n_outputs; k++)
    tl[def->n_inputs + k] =
        (pe_tensor_list){n->out_slot[k + 1] - n->out_slot[k], &vp[s->w_in + n->out_slot[k]]};
  void *state = NULL;
  pe_kernel_ctx kc = {def, n->desc, n->src_op, tl, tl + def->n_inputs, &state, NULL, &s->ctx};
  const float *g[PE_MAX_PLACES];
  int64_t a0 = lo;
  do {
    int64_t m = hi - a0 < SHARD_BLOCK ? hi - a0 : SHARD_BLOCK;
    pe_shape sh = PE_SHAPE(m);
    for (int p = 0; p < np; p++) g[p] = pe_f32(in_t(x, p, s->grad)) + a0;
    par_sum_block(acc, g, np, m);
    for (int k = 0; k < s->w_in; k++)
      if (k == s->grad)
        pe_tensor_view(&v[k], PE_F32, &sh, acc);
      else if (s->sliced[k])
        pe_tensor_view(&v[k], PE_F32, &sh, pe_f32(in_t(x, 0, k)) + a0);
    for (int k = 0; k < s->w_out; k++)
      if (s->sliced[s->w_in + k])
        pe_tensor_view(&v[s->w_in + k], PE_F32, &sh, pe_f32(out_t(x, 0, k)) + a0);
    pe_status *st = x->kernel(&kc);
    if (st)
      return pe_status_wrap(st, "node %d %s, slice [%lld, %lld)", x->id, n->name, (long long)a0,
                            (long long)(a0 + m));
    if (s->sliced[s->w_in + s->param_out] && m > 0)
      for (int p = 1; p < np; p++)
        memcpy(pe_f32(out_t(x, p, s->param_out)) + a0, pe_f32(out_t(x, 0, s->param_out)) + a0,
               (size_t)m * sizeof(float));
    a0 += m;
  } while (a0 < hi);
  return NULL;
}

void par_shard_finish(xnode *x) {
  const par_shard *s = x->shard;
  for (int k = 0; k < s->w_out; k++) {
    if (s->sliced[s->w_in + k]) continue;
    for (int p = 0; p < (k == s->param_out ? x->e->n_places : 1); p++) {
      pe_tensor *t = out_t(x, p, k);
      int64_t m = pe_tensor_numel(t);
      if (m > 0) memcpy(t->data, s->small_out[0][k], (size_t)m * sizeof(float));
    }
  }
}
