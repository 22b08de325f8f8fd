"""peclient: train on pe-executord from Python, through libpeclient.

    import peclient as pe

    x = pe.data("x", [-1, 784])
    y = pe.data("y", [-1, 1], "int64")
    h = pe.layers.fc(x, 256, act="relu")
    logits = pe.layers.fc(h, 10)
    loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, y))
    pe.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(loss)

    with pe.Client() as c:
        m = c.register(pe.default_main_program(), model="mlp")
        m.init()
        for xb, yb in pe.io.ArrayDataset(x_train, y_train).batches(128):
            l, = m.run({"x": xb, "y": yb}, fetch=[loss])

docs/python.md has the whole API.
"""
from . import errors, initializer, io, layers, lr, optimizer
from ._ffi import LIBRARY_PATH, lib, string
from .client import Client, Model
from .errors import *  # noqa: F401,F403  (PeError and a class per code)
from .framework import Program, Variable, data, default_main_program, program_guard
from .model_file import load_model, parse_model
from .optimizer import ClipGradByGlobalNorm
from .shm import ShmRegion

__version__ = string(lib.pe_client_version())


def default_address():
    """The daemon's default socket when $PE_SOCKET is unset."""
    from ._ffi import ffi

    buf = ffi.new("char[]", 512)
    return string(lib.pe_client_default_address(buf, 512))


__all__ = [
    "Client", "Model", "Program", "Variable", "ShmRegion", "ClipGradByGlobalNorm",
    "data", "default_main_program", "program_guard", "load_model", "parse_model",
    "default_address", "errors", "initializer", "io", "layers", "lr", "optimizer",
    "LIBRARY_PATH",
] + errors.__all__
