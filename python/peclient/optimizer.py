"""Optimizers: minimize(loss) records the loss and the optimizer in the
program's TrainSpec (pe_builder_append_backward and a setter); the daemon
appends the gradient and update ops.

    pe.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(loss)
    pe.optimizer.AdamW(learning_rate=lr.CosineAnnealingDecay(1e-3, T_max=1000),
                       weight_decay=0.05, grad_clip=pe.ClipGradByGlobalNorm(1.0),
                       no_weight_decay="1d").minimize(loss)

learning_rate is a float or a schedule of peclient.optimizer.lr (its base
rate and kind, counted in optimizer steps). `lr=` is the same argument.
"""
from ._ffi import lib, string
from . import lr  # noqa: F401  (pe.optimizer.lr)
from .lr import LRScheduler
from .errors import BuilderError
from .framework import Variable, var_name


class ClipGradByGlobalNorm:
    """Scale every gradient by clip_norm / (global L2 norm + 1e-6) when that
    is below 1 (PyTorch's clip_grad_norm_)."""

    def __init__(self, clip_norm):
        self.clip_norm = float(clip_norm)


class Optimizer:
    """weight_decay: L2 for sgd, momentum and adam; decoupled for adamw.
    grad_clip: a ClipGradByGlobalNorm or a max norm. no_weight_decay: "1d"
    (biases and norms) or the parameters (names or Variables) it spares."""

    kind = None

    def __init__(self, learning_rate=None, weight_decay=0.0, grad_clip=None, no_weight_decay=None,
                 lr=None):
        rate = learning_rate if learning_rate is not None else lr
        if rate is None:
            raise BuilderError("%s: learning_rate is required" % type(self).__name__)
        self.schedule = rate if isinstance(rate, LRScheduler) else None
        self.learning_rate = float(self.schedule.learning_rate if self.schedule else rate)
        self.weight_decay = float(weight_decay or 0.0)
        if isinstance(grad_clip, ClipGradByGlobalNorm):
            grad_clip = grad_clip.clip_norm
        self.grad_clip = float(grad_clip or 0.0)
        self.no_weight_decay = no_weight_decay

    def _set(self, b):
        raise NotImplementedError

    def minimize(self, loss):
        """Train loss ([1] float32) with this optimizer; returns loss."""
        if not isinstance(loss, Variable):
            raise BuilderError("minimize: loss %r is not a Variable of a program" % (loss,))
        p = loss.program
        b = p.builder
        what = "%s.minimize" % type(self).__name__
        p.check(lib.pe_builder_append_backward(b, loss.name.encode()), what)
        p.check(self._set(b), what)
        if self.weight_decay:
            p.check(lib.pe_builder_weight_decay(b, self.weight_decay), what)
        if self.grad_clip:
            p.check(lib.pe_builder_grad_clip_norm(b, self.grad_clip), what)
        if self.no_weight_decay == "1d":
            p.check(lib.pe_builder_no_weight_decay_1d(b), what)
        elif self.no_weight_decay:
            for v in self.no_weight_decay:
                p.check(lib.pe_builder_no_weight_decay(b, var_name(v).encode()), what)
        if self.schedule:
            self.schedule.apply(p, what)
        p.loss = loss.name
        p.optimizer = string(lib.pe_optimizer_kind(self.kind.encode()))
        return loss


class SGD(Optimizer):
    kind = "sgd"

    def _set(self, b):
        return lib.pe_builder_sgd(b, self.learning_rate)


class Momentum(Optimizer):
    kind = "momentum"

    def __init__(self, learning_rate=None, momentum=0.9, use_nesterov=False, **kw):
        super().__init__(learning_rate, **kw)
        self.momentum, self.use_nesterov = float(momentum), bool(use_nesterov)

    def _set(self, b):
        return lib.pe_builder_momentum(b, self.learning_rate, self.momentum, self.use_nesterov)


class Adam(Optimizer):
    kind = "adam"

    def __init__(self, learning_rate=None, beta1=0.9, beta2=0.999, epsilon=1e-8, **kw):
        super().__init__(learning_rate, **kw)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _set(self, b):
        return lib.pe_builder_adam(b, self.learning_rate, self.beta1, self.beta2, self.epsilon)


class AdamW(Adam):
    """Adam with decoupled weight decay (0.01 by default, PyTorch's)."""

    kind = "adamw"

    def __init__(self, learning_rate=None, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 weight_decay=0.01, **kw):
        super().__init__(learning_rate, beta1, beta2, epsilon, weight_decay=weight_decay, **kw)

    def _set(self, b):
        return lib.pe_builder_adamw(b, self.learning_rate, self.beta1, self.beta2, self.epsilon)


__all__ = ["SGD", "Momentum", "Adam", "AdamW", "ClipGradByGlobalNorm", "lr"]
