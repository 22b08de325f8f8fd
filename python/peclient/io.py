"""The user's own data, and parameters in files.

ArrayDataset holds features (float32, one row per example) and integer
class labels, from numpy arrays, .npy / .npz files or CSV, and walks them
in shuffled mini-batches with libpeclient's batcher and prefetch thread
(pe_dataset.h, pe_batch_prefetch.h): the next group of batches is gathered
in C while the current one trains, and the order for (seed, epoch) is the
one pe-client train uses.

    ds = pe.io.ArrayDataset(x, y)
    for xb, yb in ds.batches(128, seed=1, epoch=1):
        m.run({"x": xb, "y": yb}, fetch=[loss])

FashionMNIST() loads Fashion-MNIST as pe-client train does (standardised
with the training split's statistics).

save_params / load_params: {name: array} to and from a file: .npz,
.safetensors (safetensors.py), or any other name the daemon's checkpoint
format (pe_params_file.h), which `pe-client import` reads, `pe-client load`
loads once the file is in the daemon's state directory, and in which
`pe-client export` and the daemon's checkpoints are written.
"""
import os

import numpy as np

from . import safetensors
from ._ffi import ffi, lib, string
from ._tensor import CMemory, fill_tensor, tensors_to_dict
from .errors import PeError


class ArrayDataset:
    """Examples x[i] (features, stored float32) with labels y[i] (int64).

    x: [N, ...] any numeric array; y: [N] or [N, 1] integers, or None (no
    labels: batches give features only).
    """

    def __init__(self, x, y=None):
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim < 1 or x.shape[0] == 0:
            raise ValueError("ArrayDataset: x %s holds no examples" % (x.shape,))
        self.has_labels = y is not None
        if y is None:
            y = np.zeros(x.shape[0], np.int64)
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError("ArrayDataset: y %s is not one label per example of x %s"
                             % (y.shape, x.shape))
        if y.dtype.kind not in "iub" and not np.array_equal(y, np.round(y)):
            raise ValueError("ArrayDataset: y holds non-integer labels (dtype %s)" % y.dtype)
        self.x = x
        self.y = np.ascontiguousarray(y, dtype=np.int64)
        self.n = x.shape[0]
        self.example_shape = x.shape[1:]
        self.dim = int(np.prod(self.example_shape, dtype=np.int64))
        # The pe_dataset view of the arrays (rows, cols: not used by the batcher).
        self._ds = ffi.new("pe_dataset *")
        self._ds.n = self.n
        self._ds.dim = self.dim
        self._ds.images = ffi.cast("float *", self.x.ctypes.data)
        self._ds.labels = ffi.cast("int64_t *", self.y.ctypes.data)
        self._free_buffers = {}  # (client, group) -> shared-memory buffers not in use

    def __len__(self):
        return self.n

    @classmethod
    def from_npz(cls, path, x="x", y="y"):
        """Arrays x and y (names of the archive; y None: no labels)."""
        with np.load(path) as z:
            missing = [k for k in (x, y) if k is not None and k not in z]
            if missing:
                raise KeyError("%s: no array %s (it has %s)"
                               % (path, ", ".join(missing), ", ".join(z.files)))
            return cls(z[x], z[y] if y is not None else None)

    @classmethod
    def from_npy(cls, x_path, y_path=None):
        return cls(np.load(x_path), np.load(y_path) if y_path else None)

    @classmethod
    def from_csv(cls, path, label_column=-1, delimiter=",", skiprows=0):
        """One example per line; label_column (None: no labels) is the label,
        the other columns the features (numpy.loadtxt)."""
        data = np.loadtxt(path, delimiter=delimiter, skiprows=skiprows, dtype=np.float64, ndmin=2)
        if label_column is None:
            return cls(data)
        col = label_column % data.shape[1]
        return cls(np.delete(data, col, axis=1), data[:, col])

    def split(self, fraction, seed=0):
        """(first, second): a random `fraction` of the examples, and the rest."""
        order = np.random.default_rng(seed).permutation(self.n)
        k = int(round(self.n * fraction))
        a, b = order[:k], order[k:]
        return (ArrayDataset(self.x[a], self.y[a] if self.has_labels else None),
                ArrayDataset(self.x[b], self.y[b] if self.has_labels else None))

    def batches(self, batch_size, shuffle=True, seed=1, epoch=1, steps=1, client=None,
                limit=None):
        """One epoch of mini-batches.

        steps=1 yields (x [b, ...], y [b]); steps=S > 1 yields groups of up
        to S full batches, (x [s, batch_size, ...], y [s, batch_size]), and
        the epoch's short last batch as a group of one: a model runs a group
        in one request. The arrays are valid until the next one is asked
        for (two buffers alternate; the C thread fills the other). client:
        the buffers are in its shared memory, so that run() passes them by
        reference. limit: at most that many groups.
        """
        if batch_size < 1 or steps < 1:
            raise ValueError("batches: batch_size %d and steps %d must be >= 1"
                             % (batch_size, steps))
        group = batch_size * steps
        bt = ffi.gc(lib.pe_batcher_new(self._ds, group, shuffle, seed), lib.pe_batcher_free)
        if bt == ffi.NULL:
            raise MemoryError("pe_batcher_new: out of memory for %d examples" % self.n)
        if not lib.pe_batcher_seek(bt, epoch, 0):
            raise ValueError("batches: epoch %d (>= 1)" % epoch)
        key = (id(client), group) if client is not None else None
        xs, ys = self._free_buffers.pop(key, None) or self._buffers(group, client)
        x_ptrs = ffi.new("float *[2]", [ffi.cast("float *", a.ctypes.data) for a in xs])
        y_ptrs = ffi.new("int64_t *[2]", [ffi.cast("int64_t *", a.ctypes.data) for a in ys])
        pf = ffi.new("pe_batch_prefetch **")
        if lib.pe_batch_prefetch_start(bt, x_ptrs, y_ptrs, limit or 0, pf) != 0:
            raise OSError(ffi.errno, "cannot start the batch prefetch thread: %s"
                          % os.strerror(ffi.errno))
        n = ffi.new("int *")
        try:
            while True:
                k = lib.pe_batch_prefetch_next(pf[0], n)
                if k < 0:
                    return
                yield from self._split_group(xs[k], ys[k], n[0], batch_size, steps)
        finally:
            lib.pe_batch_prefetch_stop(pf[0])
            if key is not None:
                self._free_buffers[key] = (xs, ys)  # the next epoch's

    def _buffers(self, group, client):
        """Two buffer pairs of group examples: in client's shared memory, or
        numpy's."""
        xbytes = group * self.dim * 4
        if client is None:
            return ([np.empty((group, self.dim), np.float32) for _ in range(2)],
                    [np.empty(group, np.int64) for _ in range(2)])
        pair = xbytes + group * 8
        region = client.shm(2 * pair)
        xs = [region.array((group, self.dim), np.float32, k * pair) for k in range(2)]
        ys = [region.array((group,), np.int64, k * pair + xbytes) for k in range(2)]
        return xs, ys

    def _split_group(self, x, y, n, b, steps):
        """A gathered group of n examples as the batches to run."""
        shape = self.example_shape
        full = n // b
        if steps == 1:
            for i in range(0, n, b):
                j = min(i + b, n)
                yield self._out(x[i:j].reshape((j - i,) + shape), y[i:j])
            return
        if full:
            yield self._out(x[: full * b].reshape((full, b) + shape), y[: full * b].reshape(full, b))
        if n > full * b:
            r = n - full * b
            yield self._out(x[full * b: n].reshape((1, r) + shape), y[full * b: n].reshape(1, r))

    def _out(self, x, y):
        return (x, y) if self.has_labels else x


class FashionMNIST:
    """Fashion-MNIST's train and test splits (pe_dataset_open), standardised
    with the training split's mean and std, as pe-client train feeds them:
    .train and .test are ArrayDatasets of [N, 784] images. dir None:
    $PE_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist. limit: the
    first N examples of each split (pe-client's --limit)."""

    def __init__(self, dir=None, limit=None, normalize=True):
        d = (dir or string(lib.pe_dataset_default_dir())).encode()
        splits = {}
        for split in ("train", "t10k"):
            out = ffi.new("pe_dataset **")
            err = ffi.new("char[]", 512)
            if lib.pe_dataset_open(d, split.encode(), out, err, 512) != 0:
                raise OSError(string(err))
            splits[split] = ffi.gc(out[0], lib.pe_dataset_free)
        self.mean = self.std = None
        if normalize:
            m, s = ffi.new("float *"), ffi.new("float *")
            lib.pe_dataset_stats(splits["train"], m, s)
            self.mean, self.std = m[0], s[0]
            for ds in splits.values():
                lib.pe_dataset_normalize(ds, m[0], s[0])
        self.train = self._wrap(splits["train"], limit)
        self.test = self._wrap(splits["t10k"], limit)

    @staticmethod
    def _wrap(ds, limit):
        n = ds.n if not limit else min(limit, ds.n)
        # The arrays are over the C dataset's memory: no copy of the images.
        x = CMemory(int(ffi.cast("uintptr_t", ds.images)), ds.n * ds.dim * 4, ds)
        y = CMemory(int(ffi.cast("uintptr_t", ds.labels)), ds.n * 8, ds)
        return ArrayDataset(x.array(0, (ds.n, ds.dim), np.float32)[:n],
                            y.array(0, (ds.n,), np.int64)[:n])


#: save_params / load_params formats: format= takes one of these.
FORMATS = ("npz", "safetensors", "checkpoint")
_ERR_LEN = 1024


def _format(path, format):
    """The format of path: format if given, else by the name's ending."""
    if format is None:
        for f in ("npz", "safetensors"):
            if path.endswith("." + f):
                return f
        return "checkpoint"
    if format not in FORMATS:
        raise ValueError("%s: format %r unknown (known: %s)" % (path, format, ", ".join(FORMATS)))
    return format


def _save_checkpoint(path, params):
    names = [ffi.new("char[]", k.encode()) for k in params]
    arrays = [np.asarray(a, order="C") for a in params.values()]
    ts = ffi.new("pe_client_tensor[]", max(len(arrays), 1))
    for t, name, a in zip(ts, names, arrays):
        fill_tensor(t, name, a)
    err = ffi.new("char[]", _ERR_LEN)
    if lib.pe_params_file_write(ts, len(arrays), path.encode(), ffi.NULL, err, _ERR_LEN) != 0:
        raise PeError(string(err))


def _load_checkpoint(path):
    f = ffi.new("pe_params_file *")
    err = ffi.new("char[]", _ERR_LEN)
    if lib.pe_params_file_read(path.encode(), f, err, _ERR_LEN) != 0:
        raise PeError(string(err))
    try:
        return tensors_to_dict(f.t, f.n)
    finally:
        lib.pe_params_file_free(f)


def save_params(path, params, format=None):
    """{name: array} to path: .npz (numpy), .safetensors, or any other name
    the daemon's checkpoint format (replaced atomically; float32, float64,
    int32, int64 and uint8 arrays). format= ("npz", "safetensors",
    "checkpoint") chooses regardless of the name. A refused array or write
    raises PeError naming the tensor or the file."""
    path = os.fspath(path)
    f = _format(path, format)
    if f == "npz":
        np.savez(path, **params)
    elif f == "safetensors":
        safetensors.save(path, params)
    else:
        _save_checkpoint(path, params)


def load_params(path, format=None):
    """{name: array} from a file save_params writes (format as there): a
    checkpoint-format file is checked (version, sizes, CRC) first; a damaged
    or missing one raises PeError naming the file."""
    path = os.fspath(path)
    f = _format(path, format)
    if f == "npz":
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    if f == "safetensors":
        return safetensors.load(path)
    return _load_checkpoint(path)
