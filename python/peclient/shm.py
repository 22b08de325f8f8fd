"""Shared-memory regions (pe_client_shm_create): arrays the daemon reads in
place. A feed that is a view into one of its client's regions travels by
reference (region id and offset): nothing of it is copied into the request.

    region = c.shm(64 << 20)
    x = region.array((16 * 128, 784), np.float32)
    y = region.array((16 * 128, 1), np.int64, offset=x.nbytes)
    ... fill x and y ...; m.run({"image": x, "label": y}, ...)

The mapping lives until the region and every array over it are gone;
close() unregisters it from the daemon (which then refuses feeds in it).
"""
import numpy as np

from ._ffi import ffi, lib, string
from ._tensor import CMemory, address


class _Mapping:
    """Owns one pe_client_shm: unmaps and unlinks it when collected."""

    def __init__(self, shm):
        self.shm = shm

    def __del__(self):
        lib.pe_client_shm_close(ffi.NULL, self.shm)


class ShmRegion:
    """A region of a client: .name (/dev/shm), .size, .region (the daemon's id)."""

    def __init__(self, client, size):
        self.client = client
        shm = ffi.new("pe_client_shm *")
        # Ctrl-C or kill leaves no region behind (signals still at their
        # default action only; Python's SIGINT handler stays).
        lib.pe_client_shm_unlink_on_signals()
        client._call(lib.pe_client_shm_create, size, shm)
        self._mapping = _Mapping(shm)
        self._mem = CMemory(int(ffi.cast("uintptr_t", shm.base)), shm.size, self._mapping)
        self.region = shm.region
        self.size = shm.size
        self.name = string(shm.name)
        self.base = int(ffi.cast("uintptr_t", shm.base))
        self._open = True

    def array(self, shape, dtype=np.float32, offset=0):
        """A numpy array in the region at byte offset."""
        return self._mem.array(offset, tuple(shape), dtype)

    def offset_of(self, a):
        """Byte offset of array a in this region, or None when a is not a
        C-contiguous array inside it."""
        if not self._open or not a.flags.c_contiguous:
            return None
        off = address(a) - self.base
        return off if 0 <= off and off + a.nbytes <= self.size else None

    def close(self):
        """Unregister from the daemon; the memory goes with its last array."""
        if self._open:
            self._open = False
            self.client._forget_region(self)

    def __repr__(self):
        return "<ShmRegion %s %d bytes id %#x>" % (self.name, self.size, self.region)
