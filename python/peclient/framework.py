"""Programs and variables, in the manner of Paddle's static graph API.

A Program wraps one libpeclient program builder (pe_builder.h): layers add
ops to it, and to_bytes() is pe_builder_finish's ProgramDesc, the same
bytes a C trainer making the same calls gets. Layer functions act on the
program of their input variable; data() on the default program, which
program_guard() changes:

    main = pe.Program()
    with pe.program_guard(main):
        x = pe.data("x", [-1, 784])

A program made from bytes (Program.from_bytes, load_model) is complete: it
takes no layers. Programs are not thread-safe (one builder each).
"""
import contextlib

from ._ffi import ffi, lib, libc, string
from .errors import BuilderError

DTYPES = {
    "float32": lib.PE_B_F32,
    "float64": lib.PE_B_F64,
    "int32": lib.PE_B_I32,
    "int64": lib.PE_B_I64,
    "uint8": lib.PE_B_U8,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_code(dtype):
    """pe_b_dtype of a dtype name or numpy dtype ("float32", np.int64, ...)."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if name not in DTYPES:
        raise TypeError("dtype %r: peclient takes %s" % (dtype, ", ".join(DTYPES)))
    return DTYPES[name]


class Variable:
    """A variable of a program, by name. For feeds (data), also its dtype and
    shape. `a + b` is a residual add (layers.add)."""

    def __init__(self, program, name, dtype=None, shape=None):
        self.program = program
        self.name = name
        self.dtype = dtype
        self.shape = shape

    def __add__(self, other):
        from . import layers

        return layers.add(self, other)

    def __repr__(self):
        extra = " %s %s" % (self.dtype, list(self.shape)) if self.shape is not None else ""
        return "<Variable %s%s>" % (self.name, extra)

    def __str__(self):
        return self.name


def var_name(v):
    """A variable's name: a Variable's or a str."""
    return v.name if isinstance(v, Variable) else str(v)


class Program:
    """A ProgramDesc in the making (a builder) or made (bytes).

    feeds: name -> (dtype name, shape) of the feed variables, as data()
    declared them (known for built programs and model files; empty for bare
    bytes). loss: the training loss's name once an optimizer minimised it.
    """

    def __init__(self):
        self._b = ffi.gc(lib.pe_builder_new(), lib.pe_builder_free)
        if self._b == ffi.NULL:
            raise MemoryError("pe_builder_new: out of memory")
        self._bytes = None
        self.feeds = {}
        self.loss = None
        self.metrics = {}
        self.optimizer = None

    @classmethod
    def from_bytes(cls, data, feeds=None, loss=None):
        """A complete program from ProgramDesc bytes. feeds (name -> (dtype,
        shape)) lets run() convert and reshape feeds; without it, feeds are
        sent as given."""
        p = cls.__new__(cls)
        p._b = None
        p._bytes = bytes(data)
        p.feeds = dict(feeds or {})
        p.loss = var_name(loss) if loss is not None else None
        p.metrics = {}
        p.optimizer = lib.pe_program_optimizer(p._bytes, len(p._bytes))
        p.optimizer = string(p.optimizer) if p.optimizer != ffi.NULL else None
        return p

    @property
    def builder(self):
        if self._b is None:
            raise BuilderError("this program was made from bytes: it takes no layers")
        return self._b

    def check(self, result, what):
        """Raise the builder's (sticky) error when a call returned NULL or -1."""
        if result == ffi.NULL or (isinstance(result, int) and result < 0):
            msg = lib.pe_builder_error(self._b)
            msg = string(msg) if msg != ffi.NULL else "failed"
            # The builder's messages name the layer kind already.
            raise BuilderError(msg if msg.startswith(what.split()[0]) else "%s: %s" % (what, msg))
        return result

    def var(self, name_ptr, what, dtype=None, shape=None):
        """A Variable for a name a builder call returned (NULL: its error)."""
        self.check(name_ptr, what)
        return Variable(self, string(name_ptr), dtype, shape)

    def fetchable(self):
        """The names a trainer fetches without asking: the loss and the
        metrics (an accuracy's .correct and .total too)."""
        names = [self.loss] if self.loss else []
        for acc in self.metrics.values():
            names += [acc.name] + [v.name for v in (getattr(acc, "correct", None),
                                                    getattr(acc, "total", None)) if v]
        return names

    def to_bytes(self):
        """The ProgramDesc's protobuf bytes (pe_builder_finish)."""
        if self._b is None:
            return self._bytes
        out = ffi.new("uint8_t **")
        n = ffi.new("size_t *")
        self.check(lib.pe_builder_finish(self._b, out, n), "finish")
        try:
            return bytes(ffi.buffer(out[0], n[0]))
        finally:
            libc.free(out[0])

    def __repr__(self):
        kind = "bytes" if self._b is None else "builder"
        return "<Program (%s) feeds=%s loss=%s>" % (kind, list(self.feeds), self.loss)


_stack = [Program()]


def default_main_program():
    """The program data() adds to (the innermost program_guard's)."""
    return _stack[-1]


@contextlib.contextmanager
def program_guard(main_program, startup_program=None):
    """Make main_program the default inside the block. One builder makes
    both the main and the startup blocks: startup_program is accepted for
    Paddle's signature and must be None or main_program."""
    if startup_program is not None and startup_program is not main_program:
        raise ValueError("program_guard: the startup block is main_program's own; pass None")
    _stack.append(main_program)
    try:
        yield main_program
    finally:
        _stack.pop()


def data(name, shape, dtype="float32"):
    """A feed variable of the default program; -1 in shape is the batch."""
    prog = default_main_program()
    dims = [int(d) for d in shape]
    if not 1 <= len(dims) <= 8:
        raise BuilderError("data '%s': %d dims (1 to 8)" % (name, len(dims)))
    code = dtype_code(dtype)
    ptr = lib.pe_builder_data(prog.builder, name.encode(), code, len(dims), dims)
    v = prog.var(ptr, "data '%s'" % name, DTYPE_NAMES[code], tuple(dims))
    prog.feeds[v.name] = (v.dtype, v.shape)
    return v
