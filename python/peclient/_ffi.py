"""libpeclient's C API for cffi's ABI mode, and the library itself.

The declarations are the public headers' own (client/include/, read by
_headers.py): from the checkout when imported from it, from the copy made
at install otherwise.

The library is looked for, in order, at $PE_LIBPECLIENT (a file), in
$PE_BUILD_DIR, in the build tree this package was installed from or sits in
(<source>/build), and where the dynamic linker finds libpeclient.so.0
(the system install; /usr/local/lib without ldconfig too).
"""
import os
from pathlib import Path

import cffi


def _cdef():
    """The headers' declarations: stored at install, else the checkout's."""
    try:
        from ._cdef import CDEF  # written by setup.py at install

        return CDEF
    except ImportError:
        pass
    from ._headers import cdef

    include = Path(__file__).resolve().parent.parent.parent / "client" / "include"
    try:
        return cdef(include)
    except OSError as e:
        raise ImportError("peclient: no _cdef.py (install with pip) and no headers at %s: %s"
                          % (include, e)) from None


SONAME = "libpeclient.so.0"

ffi = cffi.FFI()
ffi.cdef(_cdef())
ffi.cdef("void free(void *);")


def _build_dirs():
    """Build trees to look in: $PE_BUILD_DIR, then the source tree's build/."""
    dirs = []
    if os.environ.get("PE_BUILD_DIR"):
        dirs.append(Path(os.environ["PE_BUILD_DIR"]))
    try:
        from ._source import BUILD_DIR  # written by setup.py at install

        dirs.append(Path(BUILD_DIR))
    except ImportError:
        pass
    dirs.append(Path(__file__).resolve().parent.parent.parent / "build")
    return dirs


def library_candidates():
    """The paths (or bare names, for the dynamic linker) tried, in order."""
    found = []
    if os.environ.get("PE_LIBPECLIENT"):
        found.append(os.environ["PE_LIBPECLIENT"])
    found += [str(d / SONAME) for d in _build_dirs() if (d / SONAME).exists()]
    found.append(SONAME)
    found.append("/usr/local/lib/" + SONAME)
    return found


def _open():
    errors = []
    for path in library_candidates():
        try:
            return ffi.dlopen(path), path
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise ImportError(
        "peclient: cannot load %s (build it: cmake --build build --target peclient_shared; "
        "or set PE_BUILD_DIR to the build directory, or PE_LIBPECLIENT to the file). Tried:\n  %s"
        % (SONAME, "\n  ".join(errors))
    )


lib, LIBRARY_PATH = _open()
libc = ffi.dlopen(None)


def string(p):
    """A C string as str ("" for NULL)."""
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""
