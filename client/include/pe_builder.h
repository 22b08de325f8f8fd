/* The program builder: a trainer-side C API that assembles a ProgramDesc
 * (proto/program.proto) layer by layer and yields its protobuf bytes, so no
 * trainer writes protobuf by hand. It depends only on protobuf-c, never on
 * libpe: trainers link libpeclient alone.
 *
 * What it emits (the op contract is docs/ops.md):
 *   block 0  main program (parent -1): feeds, layers, loss, metrics;
 *   block 1  startup program (root, parent -1): one init op per persistable
 *            (uniform_random / gaussian_random / fill_constant);
 *   main_block = 0, startup_block = 1.
 * Every variable is declared with its dtype and shape (-1 = batch), so the
 * daemon's validation can check each op against them.
 *
 * Training: pe_builder_append_backward records the loss and an optimizer
 * setter records the optimizer in the program's TrainSpec. The builder does
 * NOT emit gradient or update ops: the daemon's backward and optimizer passes
 * append them, so all gradient logic lives in one place (next to the op rows).
 *
 * Names are deterministic. A layer gets `name` if given, else "<kind>_<k>"
 * with k counting layers of that kind ("fc_0", "conv2d_1"). Its output is
 * "<layer>.out"; intermediates are "<layer>.tmp_<i>" (the daemon's op
 * fusion removes those of a conv2d / fc + bias + relu: to fetch one, name
 * it in pe_client_register_args.keep or set no_op_fusion); parameters are
 * "<layer>.w" / "<layer>.b" (batch_norm: .scale .bias .mean .variance).
 *
 * Errors: the first error sticks. Calls that return a name return NULL,
 * calls that return int return -1; pe_builder_error gives the message. After
 * an error every later call is a no-op returning NULL / -1.
 *
 * Ownership: returned names belong to the builder and stay valid until
 * pe_builder_free. Not thread-safe. */
#ifndef PE_BUILDER_H
#define PE_BUILDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pe_builder pe_builder;

/* Element types; the values equal proto DataType and pe_dtype. */
typedef enum pe_b_dtype {
  PE_B_F32 = 0,
  PE_B_F64 = 1,
  PE_B_I32 = 2,
  PE_B_I64 = 3,
  PE_B_U8 = 4,
} pe_b_dtype;

typedef enum pe_b_act {
  PE_B_ACT_NONE = 0,
  PE_B_ACT_RELU,
  PE_B_ACT_TANH,
  PE_B_ACT_SIGMOID,
  PE_B_ACT_SOFTMAX,
} pe_b_act;

/* Parameter initialisers. DEFAULT picks the layer's default: Xavier for fc
 * weights, Kaiming for conv filters, zeros for biases. */
typedef enum pe_b_init_kind {
  PE_B_INIT_DEFAULT = 0,
  PE_B_INIT_XAVIER,   /* uniform, limit sqrt(6 / (fan_in + fan_out)) */
  PE_B_INIT_KAIMING,  /* uniform, limit sqrt(6 / fan_in) (He, for relu) */
  PE_B_INIT_NORMAL,   /* gaussian_random, mean a, std b */
  PE_B_INIT_UNIFORM,  /* uniform_random in [a, b] */
  PE_B_INIT_CONSTANT, /* fill_constant a */
} pe_b_init_kind;

/* fan_in: fc input features; conv C/groups*KH*KW. fan_out: fc size; conv
 * O*KH*KW. `seed` 0 draws from the program generator (the executor's seed). */
typedef struct pe_b_init {
  pe_b_init_kind kind;
  float a, b;
  int64_t seed;
} pe_b_init;

/* "ndim, dims" for the shape arguments: PE_B_SHAPE(-1, 784). */
#define PE_B_SHAPE(...)                                                          \
  (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]) { \
    __VA_ARGS__                                                                  \
  }

pe_builder *pe_builder_new(void); /* NULL only when out of memory */
void pe_builder_free(pe_builder *b);
/* The first error's message, or NULL when there was none. */
const char *pe_builder_error(const pe_builder *b);

/* A feed variable (is_feed, stop_gradient). dims may hold -1 (batch). */
const char *pe_builder_data(pe_builder *b, const char *name, pe_b_dtype dt, int ndim,
                            const int64_t *dims);

/* --- layers (every options pointer may be NULL: all defaults) ------------- */

typedef struct pe_b_fc_opts {
  const char *name;
  int num_col_dims; /* 0: 1. x is flattened to [prod(dims[:n]), prod(dims[n:])] */
  pe_b_act act;
  bool no_bias;
  pe_b_init w_init, b_init;
} pe_b_fc_opts;
/* matmul(x, w) + b (elementwise_add, axis = num_col_dims), then act. */
const char *pe_builder_fc(pe_builder *b, const char *x, int64_t size, const pe_b_fc_opts *o);

typedef struct pe_b_conv_opts {
  const char *name;
  int stride[2];   /* 0: 1 */
  int pad[2];      /* padding top/bottom, left/right */
  int dilation[2]; /* 0: 1 */
  int groups;      /* 0: 1 */
  pe_b_act act;
  bool no_bias;
  pe_b_init w_init, b_init;
} pe_b_conv_opts;
/* conv2d on NCHW x with an [out_channels, C/groups, kh, kw] filter, then a
 * per-channel bias (elementwise_add axis 1), then act. */
const char *pe_builder_conv2d(pe_builder *b, const char *x, int64_t out_channels, int kh, int kw,
                              const pe_b_conv_opts *o);

typedef struct pe_b_pool_opts {
  const char *name;
  bool avg;      /* default max */
  int stride[2]; /* 0: the kernel size (non-overlapping windows) */
  int pad[2];
  bool global;    /* global pooling: output [N,C,1,1] */
  bool inclusive; /* avg counts padding (exclusive=false) */
} pe_b_pool_opts;
const char *pe_builder_pool2d(pe_builder *b, const char *x, int kh, int kw,
                              const pe_b_pool_opts *o);

typedef struct pe_b_bn_opts {
  const char *name;
  float momentum; /* 0: 0.9 */
  float epsilon;  /* 0: 1e-5 */
  pe_b_act act;
} pe_b_bn_opts;
/* Channels are dim 1. Scale=1, Bias=0 (trainable); Mean=0, Variance=1
 * (running statistics: persistable, stop_gradient). */
const char *pe_builder_batch_norm(pe_builder *b, const char *x, const pe_b_bn_opts *o);

/* prob in [0, 1); seed 0: program generator. upscale_in_train. */
const char *pe_builder_dropout(pe_builder *b, const char *x, float prob, int64_t seed,
                               const char *name);

const char *pe_builder_act(pe_builder *b, const char *x, pe_b_act act);
const char *pe_builder_relu(pe_builder *b, const char *x);
const char *pe_builder_tanh(pe_builder *b, const char *x);
const char *pe_builder_sigmoid(pe_builder *b, const char *x);
const char *pe_builder_softmax(pe_builder *b, const char *x); /* last axis */
/* [prod(dims[:axis]), prod(dims[axis:])]. */
const char *pe_builder_flatten(pe_builder *b, const char *x, int axis);
/* x + y, then act: a residual connection (ResNet's shortcut sum). x and y
 * must have one shape (batch dim included); name NULL: "add_<k>". */
const char *pe_builder_add(pe_builder *b, const char *x, const char *y, pe_b_act act,
                           const char *name);

/* --- sequence models --------------------------------------------------------- */

/* layer_norm over the dims from begin_norm_axis (0: 1); epsilon 0: 1e-5.
 * Scale=1, Bias=0 (trainable, [prod(dims[begin_norm_axis:])], which must be
 * known). name NULL: "layer_norm_<k>". */
const char *pe_builder_layer_norm(pe_builder *b, const char *x, int begin_norm_axis, float epsilon,
                                  const char *name);
/* gelu; approximate: the tanh formula, else the exact erf one. */
const char *pe_builder_gelu(pe_builder *b, const char *x, bool approximate);
/* Rows of a [vocab, dim] table (trainable, uniform init as fc's weights)
 * picked by ids (i64, any shape): ids' shape + [dim]. padding_idx -1: none;
 * else that row reads as zeros and gets no gradient. name NULL:
 * "embedding_<k>". */
const char *pe_builder_embedding(pe_builder *b, const char *ids, int64_t vocab, int64_t dim,
                                 int64_t padding_idx, const char *name);
typedef struct pe_b_embedding_opts {
  const char *name;
  /* The table's gradient is sparse: the rows the batch touched, and sgd,
   * momentum and adam update only those (lookup_table_v2's is_sparse;
   * docs/architecture.md "Sparse gradients"). The daemon refuses it with
   * gradient clipping, weight decay on the table, a table read by two ops
   * or several places. false: a dense [vocab, dim] gradient. */
  bool is_sparse;
} pe_b_embedding_opts;
/* pe_builder_embedding with options (o may be NULL: all defaults). */
const char *pe_builder_embedding_ex(pe_builder *b, const char *ids, int64_t vocab, int64_t dim,
                                    int64_t padding_idx, const pe_b_embedding_opts *o);
/* x with its dims permuted: out dim i is x dim perm[i]. */
const char *pe_builder_transpose(pe_builder *b, const char *x, int n, const int64_t *perm);
/* x[starts:ends] along each of axes (Python's slice rules, negative values
 * count from the end). */
const char *pe_builder_slice(pe_builder *b, const char *x, int n, const int64_t *axes,
                             const int64_t *starts, const int64_t *ends);

/* x_0 .. x_{n-1} (one dtype, equal dims but axis) joined along axis
 * (negative counts from the end). */
const char *pe_builder_concat(pe_builder *b, int n, const char *const *xs, int axis);
/* x cut along axis into n parts (at most PE_B_MAX_SPLIT): of the sizes
 * sections[0..n) (which sum to the dim when it is known), or with sections
 * NULL n equal parts of a known dim. outs[0..n) receive the parts' names.
 * 0, or -1 on error. */
#define PE_B_MAX_SPLIT 64
int pe_builder_split(pe_builder *b, const char *x, int n, const int64_t *sections, int axis,
                     const char **outs);
/* op(x) · op(y) over the last two dims (op transposes when the flag is set),
 * batch dims broadcast as numpy's matmul, 1-D operands as numpy's (the
 * matmul_v2 op). name NULL: "matmul_<k>". */
const char *pe_builder_matmul(pe_builder *b, const char *x, const char *y, bool trans_x,
                              bool trans_y, const char *name);

/* Multi-head self-attention over x [B, T, D] (T and D known, D divisible by
 * num_heads): q, k, v = fc(x) each [B, T, D] split into heads [B, H, T,
 * D/H]; softmax(q kᵀ / sqrt(D/H) + mask) v, heads joined, then an fc. mask
 * (may be NULL) is an additive f32 variable that broadcasts to the scores
 * [B, H, T, T]: for causal attention 0 on and below the diagonal and a
 * large negative value above it, fed as [T, T], or as [B, 1, T, T] to the
 * daemon (whose feeds share the batch dim). Parameters are those
 * of the fc layers "<layer>.q", ".k", ".v", ".out". name NULL:
 * "attention_<k>". */
const char *pe_builder_multi_head_attention(pe_builder *b, const char *x, int num_heads,
                                            const char *mask, const char *name);
/* How the attention layers made after this call compute softmax(scale
 * Q Kᵀ + mask) V: false (the default) with the fused
 * scaled_dot_product_attention op, true composed of matmul_v2, scale,
 * elementwise_add, softmax and matmul_v2 ops (the same values within f32
 * rounding; docs/ops.md gives the timings). Returns 0, -1 after an error. */
int pe_builder_attention_composed(pe_builder *b, bool composed);
/* A causal attention mask for sequences of length t: f32 [1, 1, t, t]
 * (stop_gradient), 0 on and below the diagonal and -1e9 above it, made by
 * the program itself (fill_constant, then tril_triu) so that nothing is
 * fed: pass it as the mask of pe_builder_multi_head_attention or
 * pe_builder_transformer_block (one mask serves every block). name NULL:
 * "causal_mask_<k>". */
const char *pe_builder_causal_mask(pe_builder *b, int64_t t, const char *name);
/* Learned positions: x [B, T, D] (T and D known) plus a trainable table
 * "<layer>.w" [T, D] (initialised as pe_builder_embedding's table of T
 * rows), row t added at position t of every example. name NULL:
 * "pos_embedding_<k>". */
const char *pe_builder_position_embedding(pe_builder *b, const char *x, const char *name);
/* A pre-LN transformer block over x [B, T, D]: h = x + attention(
 * layer_norm(x)), out = h + fc(gelu(fc(layer_norm(h)))), the inner fc of
 * ffn_dim units. mask as pe_builder_multi_head_attention's. name NULL:
 * "transformer_<k>". */
const char *pe_builder_transformer_block(pe_builder *b, const char *x, int num_heads,
                                         int64_t ffn_dim, const char *mask, const char *name);

/* --- losses and metrics ---------------------------------------------------- */

/* Loss [N,1] from logits [N,C]. An i64 [N,1] label is a hard label, an f32
 * [N,C] label a soft one. *softmax_out (may be NULL) receives the softmax. */
const char *pe_builder_softmax_with_cross_entropy(pe_builder *b, const char *logits,
                                                  const char *label, const char **softmax_out);
/* -log(x[label]) from probabilities [N,C]; Y [N,1]. Label as above. */
const char *pe_builder_cross_entropy(pe_builder *b, const char *x, const char *label);
/* Mean squared error mean((x - label)^2) of f32 x and label of one shape;
 * shape [1] (elementwise_sub, square, mean). */
const char *pe_builder_mse_loss(pe_builder *b, const char *x, const char *label);
/* Mean absolute error mean(|x - label|), x and label as mse's; shape [1]
 * (elementwise_sub, abs, mean). */
const char *pe_builder_l1_loss(pe_builder *b, const char *x, const char *label);
/* Smooth L1 loss, the mean over elements of 0.5 d^2 / beta where |d| <
 * beta, else |d| - 0.5 beta, with d = x - label (PyTorch's smooth_l1_loss
 * with beta; the smooth_l1_loss op with sigma = 1 / sqrt(beta)); x and
 * label as mse's, their dims after the first known; beta > 0; shape [1]. */
const char *pe_builder_smooth_l1_loss(pe_builder *b, const char *x, const char *label, float beta);
/* Mean of all elements; shape [1]. */
const char *pe_builder_mean(pe_builder *b, const char *x);
/* Top-k accuracy of scores [N,C] against label i64 [N,1]; f32 [1]. The
 * layer also declares "<layer>.correct" and "<layer>.total" (i64 [1]). */
const char *pe_builder_accuracy(pe_builder *b, const char *x, const char *label, int k);

/* --- training intent (TrainSpec) ------------------------------------------ */

/* Record `loss` (a [1] f32 variable of the main block) as the training loss.
 * The daemon's backward pass differentiates it; nothing is emitted here. */
int pe_builder_append_backward(pe_builder *b, const char *loss);
/* The optimizer kinds (OptimizerDesc.type): name's static copy when it is
 * one, else NULL. */
#define PE_OPTIMIZER_KINDS "sgd, momentum, adam, adamw"
const char *pe_optimizer_kind(const char *name);
int pe_builder_sgd(pe_builder *b, float lr);
int pe_builder_momentum(pe_builder *b, float lr, float mu, bool nesterov);
int pe_builder_adam(pe_builder *b, float lr, float beta1, float beta2, float epsilon);
/* Adam with decoupled weight decay (PyTorch's AdamW): each step first scales
 * the parameter by 1 - lr * weight_decay, and the gradient is not changed.
 * The coefficient is pe_builder_weight_decay's; unset (0) it is PyTorch's
 * default, 0.01 (use pe_builder_adam for none). */
int pe_builder_adamw(pe_builder *b, float lr, float beta1, float beta2, float epsilon);
/* Weight decay of every trainable parameter: sgd, momentum and adam update
 * with grad + coeff * param (L2; PyTorch's SGD/Adam weight_decay; Paddle's
 * L2Decay), adamw decouples it (above). Any order with the optimizer setter;
 * 0 (the default) is none. A finite coeff >= 0; with no optimizer at finish
 * it is an error. */
int pe_builder_weight_decay(pe_builder *b, float coeff);
/* Clip the gradients by their global L2 norm before the updates (PyTorch's
 * clip_grad_norm_, Paddle's ClipGradByGlobalNorm): with n the norm of all
 * parameter gradients together, each is scaled by max_norm / (n + 1e-6)
 * when that is below 1. 0 (the default) is none; a finite max_norm >= 0;
 * with no optimizer at finish it is an error. On several places the daemon
 * trains such a program with the AllReduce strategy (auto picks it). The
 * norm before clipping is fetchable as PE_GRAD_NORM. */
#define PE_GRAD_NORM "@GRAD_GLOBAL_NORM@"
int pe_builder_grad_clip_norm(pe_builder *b, float max_norm);
/* Exempt the trainable parameter `param` (a name a layer returned or
 * declared, e.g. "fc_0.b") from weight decay (VarDesc.no_weight_decay). */
int pe_builder_no_weight_decay(pe_builder *b, const char *param);
/* Exempt every trainable parameter with one dimension, i.e. the biases and
 * the batch-norm scale and shift: the usual "no decay on biases and norms"
 * recipe. Applied at finish, so layers added afterwards count too. */
int pe_builder_no_weight_decay_1d(pe_builder *b);

/* A learning-rate schedule, counted in optimizer steps (one per batch):
 * PyTorch's StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR (no
 * restarts) and LinearLR, with an optional linear warmup of warmup_steps
 * first. proto/program.proto (LrSchedule) has the formulas. The daemon keeps
 * the step counter as model state (persistable, checkpointed and restored
 * with the parameters), and writes learning_rate every step: a later
 * SetParams of learning_rate is overwritten at the next step. */
#define PE_B_MAX_MILESTONES 32
typedef struct pe_lr_schedule_opts {
  const char *type; /* constant | step | multistep | exponential | cosine | linear */
  int64_t warmup_steps, decay_steps;
  float gamma, min_lr;       /* 0: the kind's default (gamma 0.1 for step/multistep) */
  int n_milestones;          /* at most PE_B_MAX_MILESTONES */
  const int64_t *milestones; /* multistep: increasing step numbers */
} pe_lr_schedule_opts;
/* Any order with the optimizer setter; a later call replaces the schedule.
 * The options are copied. Checked here: the type, counts and signs (finite,
 * >= 0); the rest (decay_steps needed, gamma in (0, 1], min_lr below the
 * learning rate, increasing milestones) by the daemon at Register. With no
 * optimizer at finish it is an error. */
int pe_builder_lr_schedule(pe_builder *b, const pe_lr_schedule_opts *s);
/* The schedule kinds: name's static copy when it is one, else NULL. */
#define PE_LR_SCHEDULE_KINDS "constant, step, multistep, exponential, cosine, linear"
/* The model's step counter of a schedule (int64 [1], the number of updates
 * done): SetParams it to move the schedule. */
#define PE_LR_STEP_COUNTER "@LR_DECAY_COUNTER@"
const char *pe_lr_schedule_kind(const char *name);

/* Serialise. On success *bytes is malloc'd (caller frees) and 0 returned.
 * An optimizer without a loss is an error (a loss without an optimizer
 * only computes gradients). The builder
 * stays usable (finish may be called again after more layers). */
int pe_builder_finish(pe_builder *b, uint8_t **bytes, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
