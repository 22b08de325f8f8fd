"""Programs from model files (conf/models/README.md) and the built-in
models, through libpeclient's parser (pe_model_file.h, pe_models.h)."""
from ._ffi import ffi, lib, string
from .errors import BuilderError
from .framework import Program, Variable


def _from_spec(spec):
    """A Program from a filled pe_model_spec (released here)."""
    try:
        data = bytes(ffi.buffer(spec.bytes, spec.len))
        image, label = string(spec.image), string(spec.label)
        dims = tuple(spec.image_dims[i] for i in range(spec.image_ndim))
        # a sequence model's tokens are i64, its targets one per position
        image_dtype = "int64" if spec.image_dtype == 3 else "float32"
        label_dims = (-1, spec.label_len) if spec.label_len else (-1, 1)
        feeds = {image: (image_dtype, dims), label: ("int64", label_dims)}
        p = Program.from_bytes(data, feeds, string(spec.loss) or None)
        p.name = string(spec.name)
        p.default_batch = spec.default_batch
        for attr in ("image", "label", "loss", "accuracy", "correct"):
            setattr(p, attr + "_name", string(getattr(spec, attr)))
        acc = Variable(p, p.accuracy_name)
        acc.correct = Variable(p, p.correct_name)
        p.metrics[acc.name] = acc
        return p
    finally:
        lib.pe_model_spec_release(spec)


def _call(fn, *args):
    spec = ffi.new("pe_model_spec *")
    err = ffi.new("char[]", 1024)
    if fn(*args, spec, err, 1024) != 0:
        raise BuilderError(string(err))
    return _from_spec(spec)


def load_model(spec):
    """What pe-client's --model names: a model file (a path), a built-in
    model ("mlp", "cnn") or a file of the installed models directory
    ("resnet"). The Program knows its feeds (.image_name, .label_name), its
    loss and its metrics (.accuracy_name, .correct_name)."""
    return _call(lib.pe_model_resolve, str(spec).encode())


def parse_model(text, source="model"):
    """A model file's text; source names it in errors (and is the model's
    name unless a `name` line sets one)."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    return _call(lib.pe_model_file_parse, data, len(data), source.encode())
