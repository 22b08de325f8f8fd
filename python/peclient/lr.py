"""Learning-rate schedules (pe_builder_lr_schedule), counted in optimizer
steps: pass one as an optimizer's learning_rate. Each takes warmup_steps: a
linear warmup to the base rate first. The daemon keeps the step counter
with the parameters (proto/program.proto LrSchedule has the formulas)."""
from ._ffi import ffi, lib


class LRScheduler:
    kind = "constant"

    def __init__(self, learning_rate, warmup_steps=0, decay_steps=0, gamma=0.0, min_lr=0.0,
                 milestones=()):
        self.learning_rate = float(learning_rate)
        self.warmup_steps, self.decay_steps = int(warmup_steps), int(decay_steps)
        self.gamma, self.min_lr = float(gamma), float(min_lr)
        self.milestones = [int(m) for m in milestones]

    def apply(self, program, what):
        s = ffi.new("pe_lr_schedule_opts *")
        kind = ffi.new("char[]", self.kind.encode())
        milestones = ffi.new("int64_t[]", self.milestones or [0])
        s.type = kind
        s.warmup_steps, s.decay_steps = self.warmup_steps, self.decay_steps
        s.gamma, s.min_lr = self.gamma, self.min_lr
        s.n_milestones = len(self.milestones)
        s.milestones = milestones if self.milestones else ffi.NULL
        program.check(lib.pe_builder_lr_schedule(program.builder, s), what)

    def __repr__(self):
        return "%s(learning_rate=%g)" % (type(self).__name__, self.learning_rate)


class LinearWarmup(LRScheduler):
    """The base rate after warmup_steps of linear warmup."""

    def __init__(self, learning_rate, warmup_steps):
        super().__init__(learning_rate, warmup_steps)


class StepDecay(LRScheduler):
    """lr * gamma^floor(t / step_size)."""

    kind = "step"

    def __init__(self, learning_rate, step_size, gamma=0.1, warmup_steps=0):
        super().__init__(learning_rate, warmup_steps, step_size, gamma)


class MultiStepDecay(LRScheduler):
    """lr * gamma^(milestones passed)."""

    kind = "multistep"

    def __init__(self, learning_rate, milestones, gamma=0.1, warmup_steps=0):
        super().__init__(learning_rate, warmup_steps, 0, gamma, milestones=milestones)


class ExponentialDecay(LRScheduler):
    """lr * gamma^(t / decay_steps)."""

    kind = "exponential"

    def __init__(self, learning_rate, gamma, decay_steps=1, warmup_steps=0):
        super().__init__(learning_rate, warmup_steps, decay_steps, gamma)


class CosineAnnealingDecay(LRScheduler):
    """From lr down to eta_min over T_max steps (half a cosine)."""

    kind = "cosine"

    def __init__(self, learning_rate, T_max, eta_min=0.0, warmup_steps=0):
        super().__init__(learning_rate, warmup_steps, T_max, 0.0, eta_min)


class LinearDecay(LRScheduler):
    """From lr to end_lr in a straight line over decay_steps steps."""

    kind = "linear"

    def __init__(self, learning_rate, decay_steps, end_lr=0.0, warmup_steps=0):
        super().__init__(learning_rate, warmup_steps, decay_steps, 0.0, end_lr)
