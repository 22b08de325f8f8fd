"""numpy arrays to and from pe_client_tensor (pe_client.h)."""
import numpy as np

from ._ffi import ffi, lib, string
from .framework import DTYPES, dtype_code

MAX_DIMS = lib.PE_CLIENT_MAX_DIMS


class CMemory:
    """Memory that C owns, as numpy sees it: np.asarray(CMemory(...)) is a
    uint8 array over it whose base keeps `owner` alive, so the memory stays
    until the last array over it is gone."""

    def __init__(self, address, nbytes, owner):
        self.owner = owner
        self.__array_interface__ = {
            "data": (address, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }

    def array(self, offset=0, shape=None, dtype=np.uint8):
        """A view of the memory from byte offset (shape None: all of it)."""
        raw = np.asarray(self)
        dt = np.dtype(dtype)
        if shape is None:
            return raw[offset:].view(dt)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset < 0 or offset + n > raw.size:
            raise ValueError("%d bytes at offset %d do not fit in %d" % (n, offset, raw.size))
        return raw[offset:offset + n].view(dt).reshape(shape)


def address(a):
    """The address of a numpy array's first byte."""
    return a.__array_interface__["data"][0]


# numpy dtype -> pe_b_dtype, and back (a lookup per tensor: run's hot path).
CODES = {np.dtype(name): code for name, code in DTYPES.items()}
NP_DTYPES = {code: np.dtype(name) for name, code in DTYPES.items()}


def fill_tensor(t, name_c, a):
    """Fill pe_client_tensor t with C-contiguous array a (by pointer: a must
    outlive the request)."""
    if a.ndim > MAX_DIMS:
        raise ValueError("feed '%s': %d dims, at most %d" % (string(name_c), a.ndim, MAX_DIMS))
    code = CODES.get(a.dtype)
    t.dtype = code if code is not None else dtype_code(a.dtype)  # dtype_code names the bad one
    t.name = name_c
    t.ndim = a.ndim
    t.shape[0:a.ndim] = a.shape
    t.data = ffi.from_buffer(a) if a.size else ffi.NULL
    t.nbytes = a.nbytes
    t.shm_region = 0
    t.shm_offset = 0


def to_numpy(t):
    """A copy of result tensor t (its data lives in the handle's last reply)."""
    dt = NP_DTYPES.get(t.dtype, np.dtype(np.uint8))
    out = np.empty(tuple(t.shape[0:t.ndim]), dt)
    if out.nbytes != t.nbytes:
        raise ValueError("result '%s': %d bytes for %s %s"
                         % (string(t.name), t.nbytes, dt, out.shape))
    if out.nbytes:
        ffi.memmove(ffi.from_buffer(out), t.data, out.nbytes)
    return out


def tensors_to_dict(ts, n):
    """{name: array} of n result tensors (copies)."""
    return {string(ts[i].name): to_numpy(ts[i]) for i in range(n)}
