"""Layers, losses and metrics: each one pe_builder_* call on the program of
its input. Names follow the builder: a layer is `name` if given, else
"<kind>_<k>"; its output "<layer>.out", its parameters "<layer>.w" /
"<layer>.b" (batch_norm: .scale .bias .mean .variance)."""
from ._ffi import ffi, lib, string
from .errors import BuilderError
from .framework import Variable, var_name

ACTS = {
    None: lib.PE_B_ACT_NONE,
    "none": lib.PE_B_ACT_NONE,
    "relu": lib.PE_B_ACT_RELU,
    "tanh": lib.PE_B_ACT_TANH,
    "sigmoid": lib.PE_B_ACT_SIGMOID,
    "softmax": lib.PE_B_ACT_SOFTMAX,
}


def _act(act, layer):
    if act not in ACTS:
        raise BuilderError("%s: act %r unknown (relu, tanh, sigmoid, softmax or None)" % (layer, act))
    return ACTS[act]


def _pair(v, what):
    """An int or a pair of ints as a pair."""
    if isinstance(v, int):
        return (v, v)
    if len(v) != 2:
        raise BuilderError("%s: %r is neither an int nor a pair" % (what, v))
    return (int(v[0]), int(v[1]))


def _program(x, layer):
    if not isinstance(x, Variable):
        raise BuilderError("%s: input %r is not a Variable of a program" % (layer, x))
    return x.program


def _name(name, keep):
    """name as a char[] (kept alive in keep), or NULL."""
    if name is None:
        return ffi.NULL
    s = ffi.new("char[]", name.encode())
    keep.append(s)
    return s


def _weights(o, layer, act, bias, weight_init, bias_init, name, keep):
    """The options fc and conv2d share: name, act, bias and initialisers."""
    o.name = _name(name, keep)
    o.act = _act(act, layer)
    o.no_bias = not bias
    if weight_init is not None:
        weight_init.fill(o.w_init)
    if bias_init is not None:
        bias_init.fill(o.b_init)


def fc(x, size, act=None, num_flatten_dims=1, bias=True, weight_init=None, bias_init=None,
       name=None):
    """x flattened to [prod(dims[:num_flatten_dims]), rest] times a
    [rest, size] weight, plus a bias, then act."""
    p, keep = _program(x, "fc"), []
    o = ffi.new("pe_b_fc_opts *")
    _weights(o, "fc", act, bias, weight_init, bias_init, name, keep)
    o.num_col_dims = num_flatten_dims
    return p.var(lib.pe_builder_fc(p.builder, x.name.encode(), size, o), "fc")


def conv2d(x, num_filters, filter_size, stride=1, padding=0, dilation=1, groups=1, act=None,
           bias=True, weight_init=None, bias_init=None, name=None):
    """NCHW convolution with a [num_filters, C/groups, kh, kw] filter, a
    per-channel bias, then act. padding: (top/bottom, left/right)."""
    p, keep = _program(x, "conv2d"), []
    kh, kw = _pair(filter_size, "conv2d filter_size")
    o = ffi.new("pe_b_conv_opts *")
    _weights(o, "conv2d", act, bias, weight_init, bias_init, name, keep)
    o.stride = _pair(stride, "conv2d stride")
    o.pad = _pair(padding, "conv2d padding")
    o.dilation = _pair(dilation, "conv2d dilation")
    o.groups = groups
    return p.var(lib.pe_builder_conv2d(p.builder, x.name.encode(), num_filters, kh, kw, o),
                 "conv2d")


def pool2d(x, pool_size=2, pool_type="max", pool_stride=None, pool_padding=0,
           global_pooling=False, exclusive=True, name=None):
    """Max or average pooling; pool_stride None: the window (no overlap);
    exclusive False: an average counts the padding."""
    p, keep = _program(x, "pool2d"), []
    if pool_type not in ("max", "avg"):
        raise BuilderError("pool2d: pool_type %r unknown (max, avg)" % (pool_type,))
    kh, kw = _pair(pool_size, "pool2d pool_size")
    o = ffi.new("pe_b_pool_opts *")
    o.name = _name(name, keep)
    o.avg = pool_type == "avg"
    o.stride = _pair(pool_stride or 0, "pool2d pool_stride")
    o.pad = _pair(pool_padding, "pool2d pool_padding")
    setattr(o, "global", global_pooling)  # a keyword in Python
    o.inclusive = not exclusive
    return p.var(lib.pe_builder_pool2d(p.builder, x.name.encode(), kh, kw, o), "pool2d")


def batch_norm(x, act=None, momentum=0.9, epsilon=1e-5, name=None):
    """Batch normalisation over dim 1 (channels), then act."""
    p, keep = _program(x, "batch_norm"), []
    o = ffi.new("pe_b_bn_opts *")
    o.name = _name(name, keep)
    o.momentum = momentum
    o.epsilon = epsilon
    o.act = _act(act, "batch_norm")
    return p.var(lib.pe_builder_batch_norm(p.builder, x.name.encode(), o), "batch_norm")


def dropout(x, dropout_prob, seed=0, name=None):
    """Zeroes elements with probability dropout_prob in training (upscale in
    train); seed 0: the program's generator."""
    p, keep = _program(x, "dropout"), []
    return p.var(
        lib.pe_builder_dropout(p.builder, x.name.encode(), dropout_prob, seed, _name(name, keep)),
        "dropout")


def _unary(fn, what):
    def layer(x):
        p = _program(x, what)
        return p.var(fn(p.builder, x.name.encode()), what)

    layer.__name__ = what
    layer.__doc__ = "%s of x (a layer of its own)." % what
    return layer


relu = _unary(lib.pe_builder_relu, "relu")
tanh = _unary(lib.pe_builder_tanh, "tanh")
sigmoid = _unary(lib.pe_builder_sigmoid, "sigmoid")
softmax = _unary(lib.pe_builder_softmax, "softmax")


def flatten(x, axis=1):
    """[prod(dims[:axis]), prod(dims[axis:])]."""
    p = _program(x, "flatten")
    return p.var(lib.pe_builder_flatten(p.builder, x.name.encode(), axis), "flatten")


def add(x, y, act=None, name=None):
    """x + y (one shape), then act: a residual connection."""
    p, keep = _program(x, "add"), []
    return p.var(lib.pe_builder_add(p.builder, x.name.encode(), var_name(y).encode(),
                                    _act(act, "add"), _name(name, keep)), "add")


elementwise_add = add


def softmax_with_cross_entropy(logits, label, return_softmax=False):
    """Loss [N,1] from logits [N,C]: an int64 [N,1] label is a hard label, a
    float32 [N,C] one soft. return_softmax: (loss, softmax)."""
    p = _program(logits, "softmax_with_cross_entropy")
    sm = ffi.new("const char **")
    loss = p.var(lib.pe_builder_softmax_with_cross_entropy(
        p.builder, logits.name.encode(), var_name(label).encode(), sm),
        "softmax_with_cross_entropy")
    return (loss, p.var(sm[0], "softmax_with_cross_entropy")) if return_softmax else loss


def cross_entropy(input, label):
    """-log(input[label]) from probabilities [N,C]; [N,1]."""
    p = _program(input, "cross_entropy")
    return p.var(lib.pe_builder_cross_entropy(p.builder, input.name.encode(),
                                              var_name(label).encode()), "cross_entropy")


def mean(x):
    """Mean of all elements; [1]."""
    p = _program(x, "mean")
    return p.var(lib.pe_builder_mean(p.builder, x.name.encode()), "mean")


def accuracy(input, label, k=1):
    """Top-k accuracy of scores [N,C] against int64 labels [N,1]: float32
    [1]. The result's .correct and .total are the int64 [1] counts."""
    p = _program(input, "accuracy")
    acc = p.var(lib.pe_builder_accuracy(p.builder, input.name.encode(),
                                        var_name(label).encode(), k), "accuracy")
    layer = acc.name[: -len(".out")]
    acc.correct = Variable(p, layer + ".correct")
    acc.total = Variable(p, layer + ".total")
    p.metrics[acc.name] = acc
    return acc


# --- sequence models ---------------------------------------------------------------


def _ints(v):
    return [int(i) for i in v]


def embedding(input, size, padding_idx=None, is_sparse=False, name=None):
    """Rows of a [vocab, dim] table (size = (vocab, dim)) picked by int64 ids
    of any shape: ids' shape + [dim]. padding_idx: a row that reads as zeros
    and gets no gradient. is_sparse: the table's gradient holds only the
    rows the batch touched, and sgd, momentum and adam update only those
    (the daemon refuses it with gradient clipping, weight decay on the
    table, or several places)."""
    p, keep = _program(input, "embedding"), []
    vocab, dim = _pair(size, "embedding size")
    pad = -1 if padding_idx is None else padding_idx
    o = ffi.new("pe_b_embedding_opts *")
    o.name = _name(name, keep)
    o.is_sparse = bool(is_sparse)
    return p.var(lib.pe_builder_embedding_ex(p.builder, input.name.encode(), vocab, dim, pad, o),
                 "embedding")


def layer_norm(x, begin_norm_axis=1, epsilon=1e-5, name=None):
    """Normalisation over the dims from begin_norm_axis, with a trainable
    scale (1) and bias (0)."""
    p, keep = _program(x, "layer_norm"), []
    return p.var(lib.pe_builder_layer_norm(p.builder, x.name.encode(), begin_norm_axis, epsilon,
                                           _name(name, keep)), "layer_norm")


def gelu(x, approximate=False):
    """gelu: the exact erf form, or with approximate the tanh formula."""
    p = _program(x, "gelu")
    return p.var(lib.pe_builder_gelu(p.builder, x.name.encode(), approximate), "gelu")


def transpose(x, perm):
    """x with its dims permuted: out dim i is x dim perm[i]."""
    p, perm = _program(x, "transpose"), _ints(perm)
    return p.var(lib.pe_builder_transpose(p.builder, x.name.encode(), len(perm), perm),
                 "transpose")


def slice(input, axes, starts, ends):
    """input[starts:ends] along each of axes (Python's slice rules)."""
    p = _program(input, "slice")
    axes, starts, ends = _ints(axes), _ints(starts), _ints(ends)
    if not len(axes) == len(starts) == len(ends):
        raise BuilderError("slice: axes, starts and ends differ in length (%d, %d, %d)"
                           % (len(axes), len(starts), len(ends)))
    return p.var(lib.pe_builder_slice(p.builder, input.name.encode(), len(axes), axes, starts,
                                      ends), "slice")


def concat(input, axis=0):
    """The variables of the list input (one dtype, equal dims but axis)
    joined along axis."""
    if not input:
        raise BuilderError("concat: no inputs")
    p = _program(input[0], "concat")
    names = [ffi.new("char[]", var_name(v).encode()) for v in input]
    return p.var(lib.pe_builder_concat(p.builder, len(names), ffi.new("const char *[]", names),
                                       axis), "concat")


def split(input, num_or_sections, dim=-1):
    """input cut along dim: into num_or_sections equal parts (an int) or
    parts of the sizes listed. A list of Variables."""
    p = _program(input, "split")
    if isinstance(num_or_sections, int):
        n, sections = num_or_sections, ffi.NULL
    else:
        sections = _ints(num_or_sections)
        n = len(sections)
    if not 1 <= n <= lib.PE_B_MAX_SPLIT:
        raise BuilderError("split: %d parts (1 to %d)" % (n, lib.PE_B_MAX_SPLIT))
    outs = ffi.new("const char *[]", n)
    p.check(lib.pe_builder_split(p.builder, input.name.encode(), n, sections, dim, outs), "split")
    return [Variable(p, string(outs[i])) for i in range(n)]


def matmul(x, y, transpose_x=False, transpose_y=False, name=None):
    """op(x) . op(y) over the last two dims (op transposes when asked), batch
    dims broadcast as numpy's matmul (Paddle's matmul_v2)."""
    p, keep = _program(x, "matmul"), []
    return p.var(lib.pe_builder_matmul(p.builder, x.name.encode(), var_name(y).encode(),
                                       transpose_x, transpose_y, _name(name, keep)), "matmul")


def mse_loss(input, label):
    """Mean squared error of input and label (one shape); [1]."""
    p = _program(input, "mse_loss")
    return p.var(lib.pe_builder_mse_loss(p.builder, input.name.encode(),
                                         var_name(label).encode()), "mse_loss")


def l1_loss(input, label):
    """Mean absolute error of input and label (one shape); [1]."""
    p = _program(input, "l1_loss")
    return p.var(lib.pe_builder_l1_loss(p.builder, input.name.encode(),
                                        var_name(label).encode()), "l1_loss")


def smooth_l1_loss(input, label, beta=1.0):
    """Smooth L1 loss of input and label (one shape, dims after the first
    known): the mean of 0.5 d^2 / beta where |d| < beta, else |d| - beta / 2,
    d = input - label (PyTorch's smooth_l1_loss); [1]."""
    p = _program(input, "smooth_l1_loss")
    return p.var(lib.pe_builder_smooth_l1_loss(p.builder, input.name.encode(),
                                               var_name(label).encode(), beta),
                 "smooth_l1_loss")


def multi_head_attention(x, num_heads, mask=None, name=None, fused=True):
    """Self-attention of x [B, T, D] in num_heads heads; mask: an additive
    float32 variable broadcasting to the scores [B, H, T, T] (a causal mask
    fed as [B, 1, T, T]: feeds share the batch dim). fused: one
    scaled_dot_product_attention op, else its composition of matmul,
    scale, add and softmax ops (pe_builder_attention_composed)."""
    p, keep = _program(x, "multi_head_attention"), []
    lib.pe_builder_attention_composed(p.builder, not fused)
    m = _name(var_name(mask), keep) if mask is not None else ffi.NULL
    return p.var(lib.pe_builder_multi_head_attention(p.builder, x.name.encode(), num_heads, m,
                                                     _name(name, keep)), "multi_head_attention")


def transformer_block(x, num_heads, ffn_dim, mask=None, name=None, fused=True):
    """A pre-LN transformer block of x [B, T, D]: attention and a gelu
    feed-forward of ffn_dim units, each after a layer_norm and with a
    residual sum. fused: as multi_head_attention's."""
    p, keep = _program(x, "transformer_block"), []
    lib.pe_builder_attention_composed(p.builder, not fused)
    m = _name(var_name(mask), keep) if mask is not None else ffi.NULL
    return p.var(lib.pe_builder_transformer_block(p.builder, x.name.encode(), num_heads, ffn_dim,
                                                  m, _name(name, keep)), "transformer_block")
