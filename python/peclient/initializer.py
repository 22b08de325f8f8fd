"""Parameter initialisers (pe_b_init): a layer's weight_init / bias_init.

seed 0 draws from the program's generator (the register's seed)."""
from ._ffi import lib


class Initializer:
    kind = lib.PE_B_INIT_DEFAULT

    def __init__(self, a=0.0, b=0.0, seed=0):
        self.a, self.b, self.seed = float(a), float(b), int(seed)

    def fill(self, c):
        """Write this initialiser into a pe_b_init struct c."""
        c.kind = self.kind
        c.a, c.b, c.seed = self.a, self.b, self.seed

    def __repr__(self):
        return "%s(a=%g, b=%g, seed=%d)" % (type(self).__name__, self.a, self.b, self.seed)


class Xavier(Initializer):
    """Uniform in +-sqrt(6 / (fan_in + fan_out)): fc weights' default."""

    kind = lib.PE_B_INIT_XAVIER

    def __init__(self, seed=0):
        super().__init__(seed=seed)


class Kaiming(Initializer):
    """Uniform in +-sqrt(6 / fan_in) (He, for relu): conv filters' default."""

    kind = lib.PE_B_INIT_KAIMING

    def __init__(self, seed=0):
        super().__init__(seed=seed)


class Normal(Initializer):
    kind = lib.PE_B_INIT_NORMAL

    def __init__(self, mean=0.0, std=1.0, seed=0):
        super().__init__(mean, std, seed)


class Uniform(Initializer):
    kind = lib.PE_B_INIT_UNIFORM

    def __init__(self, low=-1.0, high=1.0, seed=0):
        super().__init__(low, high, seed)


class Constant(Initializer):
    """Every element `value`: biases' default (0)."""

    kind = lib.PE_B_INIT_CONSTANT

    def __init__(self, value=0.0):
        super().__init__(value)
