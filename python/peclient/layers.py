"""Layers, losses and metrics: each one pe_builder_* call on the program of
its input. Names follow the builder: a layer is `name` if given, else
"<kind>_<k>"; its output "<layer>.out", its parameters "<layer>.w" /
"<layer>.b" (batch_norm: .scale .bias .mean .variance)."""
from ._ffi import ffi, lib
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
