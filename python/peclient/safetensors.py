"""The safetensors format (Hugging Face's): an 8-byte little-endian header
length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin,
end]}, "__metadata__": {str: str}} padded with spaces to 8 bytes, then the
tensors' little-endian bytes, offsets counted from the end of the header.
Written in name order; read with its offsets checked (in bounds, covering
the data without gaps or overlaps)."""
import json
import struct

import numpy as np

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
    "BOOL": "?",
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def save(path, tensors, metadata=None):
    """Write {name: array} (and string metadata) to path."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        if dt not in _NAMES:
            raise TypeError("safetensors: '%s' has dtype %s (not in the format)" % (name, a.dtype))
        data = np.ascontiguousarray(a, dtype=dt).tobytes()
        header[name] = {"dtype": _NAMES[dt], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path, with_metadata=False):
    """{name: array} from path ((tensors, metadata) with with_metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: %d bytes, not a safetensors file" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError("%s: header of %d bytes in a %d-byte file" % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ValueError("%s: the header is not JSON: %s" % (path, e)) from None
    data = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    out, spans = {}, []
    for name, d in header.items():
        if d.get("dtype") not in _DTYPES:
            raise ValueError("%s: '%s' has dtype %r" % (path, name, d.get("dtype")))
        dt = np.dtype(_DTYPES[d["dtype"]])
        shape = tuple(int(s) for s in d["shape"])
        begin, end = (int(o) for o in d["data_offsets"])
        want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if not 0 <= begin <= end <= len(data) or end - begin != want:
            raise ValueError("%s: '%s' %s %s at [%d, %d) of %d data bytes (needs %d)"
                             % (path, name, d["dtype"], list(shape), begin, end, len(data), want))
        out[name] = np.frombuffer(data[begin:end], dt).reshape(shape).copy()
        spans.append((begin, end, name))
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            raise ValueError("%s: '%s' starts at %d, the data before ends at %d"
                             % (path, name, begin, pos))
        pos = end
    if pos != len(data):
        raise ValueError("%s: %d data bytes, the tensors cover %d" % (path, len(data), pos))
    return (out, metadata) if with_metadata else out
