"""Exceptions: one class per libpeclient code (pe_client.h's pe_client_code).

Every failure of a request raises a PeError subclass that carries the code
(.code, .code_name) and libpeclient's message, which names the request and
what was wrong ("run: feed 'x' [64,783] ..."). Codes below 100 are the
daemon's, 100 and up are raised on the client's side (no reply in time, no
daemon, a request over the size limit).
"""
from ._ffi import lib, string


class PeError(Exception):
    """A failed request: .code (pe_client_code), .code_name and the message."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    @property
    def code_name(self):
        return string(lib.pe_client_code_name(self.code)) if self.code is not None else ""

    def __str__(self):
        return "%s (%s)" % (self.message, self.code_name) if self.code is not None else self.message


class BuilderError(PeError, ValueError):
    """A program builder call refused its arguments (pe_builder_error's message)."""


# code -> (class name, extra base): the codes of pe_client.h in its order.
_CODES = {
    lib.PE_C_EINVAL: ("InvalidArgumentError", ValueError),
    lib.PE_C_ENOMEM: ("OutOfMemoryError", MemoryError),
    lib.PE_C_ENOTFOUND: ("NotFoundError", LookupError),
    lib.PE_C_EUNKNOWN_OP: ("UnknownOpError", ValueError),
    lib.PE_C_EUNKNOWN_VAR: ("UnknownVariableError", LookupError),
    lib.PE_C_EATTR: ("BadAttributeError", ValueError),
    lib.PE_C_EARITY: ("BadArityError", ValueError),
    lib.PE_C_ESHAPE: ("ShapeMismatchError", ValueError),
    lib.PE_C_EDTYPE: ("DtypeMismatchError", TypeError),
    lib.PE_C_EUSE_BEFORE_DEF: ("UseBeforeDefinitionError", ValueError),
    lib.PE_C_ECYCLE: ("CycleError", ValueError),
    lib.PE_C_EMISSING_FEED: ("MissingFeedError", KeyError),
    lib.PE_C_EIO: ("DaemonIOError", OSError),
    lib.PE_C_ECORRUPT: ("CorruptDataError", ValueError),
    lib.PE_C_ENOGRAD: ("NoGradientError", ValueError),
    lib.PE_C_EBACKEND: ("BackendError", RuntimeError),
    lib.PE_C_EINTERNAL: ("InternalError", RuntimeError),
    lib.PE_C_EALREADY: ("AlreadyAppliedError", RuntimeError),
    lib.PE_C_EPERM: ("PermissionDeniedError", PermissionError),
    lib.PE_C_EEXHAUSTED: ("ResourceExhaustedError", RuntimeError),
    lib.PE_C_EDEADLINE: ("DeadlineExceededError", TimeoutError),
    lib.PE_C_ESHUTDOWN: ("ShuttingDownError", ConnectionError),
    lib.PE_C_ETIMEDOUT: ("TimedOutError", TimeoutError),
    lib.PE_C_ECONNECT: ("DaemonConnectionError", ConnectionError),
    lib.PE_C_ETOOBIG: ("MessageTooLargeError", ValueError),
    lib.PE_C_EPROTO: ("ProtocolError", RuntimeError),
    lib.PE_C_EARG: ("ClientArgumentError", ValueError),
    lib.PE_C_EROLLEDBACK: ("RolledBackError", RuntimeError),
}

#: code -> its PeError subclass
BY_CODE = {}
for _code, (_name, _base) in _CODES.items():
    # KeyError's str() quotes its argument: PeError's __str__ comes first.
    _cls = type(_name, (PeError, _base), {"code": _code, "__module__": __name__})
    _cls.__doc__ = "libpeclient code %d, %s." % (_code, string(lib.pe_client_code_name(_code)))
    BY_CODE[_code] = _cls
    globals()[_name] = _cls
del _code, _name, _base, _cls

__all__ = ["PeError", "BuilderError", "error_for"] + [n for n, _ in _CODES.values()]


def error_for(code, message):
    """The exception for a libpeclient code and message."""
    cls = BY_CODE.get(code)
    # One argument: OSError's subclasses read (errno, strerror) from two.
    return cls(message) if cls else PeError(message, code)
