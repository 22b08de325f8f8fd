"""The connection to pe-executord: Client (one libpeclient handle) and Model
(a registered program of it).

    with pe.Client() as c:                       # $PE_SOCKET or the default
        m = c.register(program, model="mnist", places="cpu:2")
        m.init()
        loss, = m.run({"x": xb, "y": yb}, fetch=[loss_var])

libpeclient does the work: the requests and their resends, recovery after
a daemon restart, shared memory. A Client is used by one thread at a time
(a lock serialises its requests); handles share nothing, so threads or
processes that train at once each make their own. Every failure raises a
PeError subclass (peclient.errors) with the code and libpeclient's message;
a daemon that does not answer raises TimedOutError after timeout_ms, and
one that goes away (exits or dies) before answering ShuttingDownError once
no daemon came back on its socket.

Feeds: a dict of arrays (one mini-batch each, or a leading steps dimension
when the program declares the feed: [steps, batch, ...] runs `steps`
mini-batches in one request), or a list of such dicts. An array that is a
view into one of the client's shared-memory regions travels by reference;
on a local (ipc://) daemon, other feeds of at least shm_threshold bytes
together are copied into a staging region rather than into the request.
"""
import atexit
import threading
import warnings
import weakref

import numpy as np

from . import _interrupt
from ._ffi import ffi, lib, string
from ._tensor import fill_tensor, tensors_to_dict
from .errors import ClientArgumentError, PeError, error_for
from .framework import DTYPES, Program, var_name
from .shm import ShmRegion

STRATEGIES = {"auto": 0, "allreduce": 1, "reduce": 2, "sharded": 3}
STRATEGY_NAMES = {v: k for k, v in STRATEGIES.items()}

_live = weakref.WeakSet()  # clients whose session atexit ends


def struct_dict(s):
    """A libpeclient result struct as a dict: strings as str, an array
    field `x` with its count `n_x` as a list (of dicts, for structs)."""
    out = {}
    t = ffi.typeof(s)
    if t.kind == "pointer":
        t = t.item
    names = [n for n, _ in t.fields]
    for name, field in t.fields:
        ft = field.type
        v = getattr(s, name)
        if name.startswith("n_") and name[2:] in names:
            continue
        if ft.kind == "pointer" and ft.item.cname == "char":
            out[name] = string(v)
        elif ft.kind == "array" and ft.item.cname == "char":
            out[name] = string(v)
        elif ft.kind == "pointer" and "n_" + name in names:
            n = getattr(s, "n_" + name)
            if ft.item.kind == "struct":
                out[name] = [struct_dict(v[i]) for i in range(n)]
            else:
                out[name] = [string(v[i]) if ft.item.kind == "pointer" else v[i] for i in range(n)]
        elif ft.kind == "array":
            out[name] = list(v)
        elif ft.kind == "pointer":
            continue
        else:
            out[name] = v
    return out


def _param_dict(p):
    return {
        "name": string(p.name),
        "dtype": string(lib.pe_client_dtype_name(p.dtype)),
        "shape": tuple(p.shape[i] for i in range(p.ndim)),
    }


class Client:
    """A connection to pe-executord (pe_client_connect).

    socket: "ipc://PATH" or "tcp://HOST:PORT"; None: $PE_SOCKET, else the
    daemon's default. timeout_ms: the reply wait per request (None:
    $PE_TIMEOUT_MS or 60 s). shm: "auto" (staging for large feeds on an
    ipc:// socket), True (that on any socket) or False (feeds only in the
    requests, views into regions made with shm() still by reference).
    The other options are pe_client_opts's.
    """

    def __init__(self, socket=None, timeout_ms=None, send_timeout_ms=None, max_message=None,
                 resend_ivl_ms=0, no_recover=False, fail_on_rollback=False,
                 outlive_process=False, shm="auto", shm_threshold=1 << 20):
        self._lock = threading.RLock()
        self._regions = []
        self._staging = None
        self._c = ffi.gc(lib.pe_client_new(), lib.pe_client_free)
        if self._c == ffi.NULL:
            raise MemoryError("pe_client_new: out of memory")
        o = ffi.new("pe_client_opts *")
        addr = ffi.new("char[]", socket.encode()) if socket else ffi.NULL
        o.address = addr
        o.timeout_ms = timeout_ms or 0
        o.send_timeout_ms = send_timeout_ms or 0
        o.resend_ivl_ms = resend_ivl_ms
        o.max_message = max_message or 0
        o.no_recover = no_recover
        o.fail_on_rollback = fail_on_rollback
        o.outlive_process = outlive_process
        self._check(lib.pe_client_connect(self._c, o))
        self.address = string(lib.pe_client_address(self._c))
        self.shm_threshold = shm_threshold
        self.use_shm = shm is True or (shm == "auto" and self.address.startswith("ipc://"))
        self.closed = False
        _interrupt.install()
        _live.add(self)

    # --- plumbing ----------------------------------------------------------------

    def _check(self, code):
        if code != 0:
            raise error_for(code, string(lib.pe_client_error(self._c)))

    def _call(self, fn, *args):
        """fn(handle, *args) under the lock, marked busy for Ctrl-C."""
        with self._lock, _interrupt.busy(self):
            self._check(fn(self._c, *args))

    def _interrupt(self, wait_ms, close_ms):
        """End the session from the signal watcher's thread."""
        err = ffi.new("char[]", 512)
        if lib.pe_client_interrupt(self._c, wait_ms, close_ms, err, 512) == 0:
            self.closed = True

    @property
    def id(self):
        """The random 64-bit id the daemon knows this client by."""
        return lib.pe_client_id(self._c)

    @property
    def max_message(self):
        return lib.pe_client_max_message(self._c)

    def set_timeout(self, timeout_ms):
        """The reply timeout of later requests (ms, > 0)."""
        self._check(lib.pe_client_set_timeout(self._c, int(timeout_ms)))

    # --- requests -----------------------------------------------------------------

    def ping(self):
        self._call(lib.pe_client_ping)

    def status(self):
        """The daemon's status (pe_client_status) as a dict: version, uptime_s,
        places, models, runs, lanes, counters."""
        st = ffi.new("pe_client_status *")
        with self._lock:
            self._call(lib.pe_client_get_status, st)
            return struct_dict(st)

    def register(self, program, model, places=None, strategy="auto", seed=None, for_test=False,
                 persistent=False, keep=None, no_op_fusion=False, loss=None, sync=None,
                 fuse_allreduce=False, fuse_bucket_bytes=0, job=None):
        """Register program (a Program or ProgramDesc bytes) under parameter
        namespace `model`; returns its Model. places: "cpu:2", "sim:4",
        "cuda:0" (None: the model's, else the daemon's). seed: initialisation
        and dropout (None: 1). for_test: an evaluation program (no backward,
        no optimizer). keep: the variables besides the loss and the metrics
        that run() may fetch (the daemon reuses the others' buffers).
        job: train as one node of a job across nodes (docs/multinode.md), a
        dict with name, world, rank, rendezvous ("HOST:PORT" of rank 0's
        daemon) and token; the call returns once every node joined."""
        if not isinstance(program, Program):
            program = Program.from_bytes(program)
        if strategy not in STRATEGIES:
            raise ClientArgumentError("register: strategy %r unknown (%s)"
                                      % (strategy, ", ".join(STRATEGIES)))
        data = program.to_bytes()
        keep = program.fetchable() + [var_name(k) for k in (keep or ())]
        keep_c = [ffi.new("char[]", k.encode()) for k in keep]
        a = ffi.new("pe_client_register_args *")
        strs = [ffi.new("char[]", model.encode())]
        program_c = ffi.from_buffer("uint8_t[]", data)
        a.program = program_c
        a.program_len = len(data)
        a.model = strs[0]
        if places:
            strs.append(ffi.new("char[]", places.encode()))
            a.places = strs[-1]
        if loss is not None:
            strs.append(ffi.new("char[]", var_name(loss).encode()))
            a.loss = strs[-1]
        if sync:
            strs.append(ffi.new("char[]", sync.encode()))
            a.sync = strs[-1]
        keep_arr = ffi.new("const char *[]", keep_c) if keep_c else ffi.NULL
        a.keep, a.n_keep = keep_arr, len(keep_c)
        a.strategy = STRATEGIES[strategy]
        a.seed = seed or 0
        a.for_test, a.persistent = for_test, persistent
        a.fuse_allreduce, a.fuse_bucket_bytes = fuse_allreduce, fuse_bucket_bytes
        a.no_op_fusion = no_op_fusion
        if job:
            missing = [k for k in ("name", "world", "rank", "rendezvous", "token") if k not in job]
            if missing:
                raise ClientArgumentError("register: job lacks %s" % ", ".join(missing))
            for field, key in (("job", "name"), ("job_rendezvous", "rendezvous"),
                               ("job_token", "token")):
                strs.append(ffi.new("char[]", str(job[key]).encode()))
                setattr(a, field, strs[-1])
            a.job_world, a.job_rank = int(job["world"]), int(job["rank"])
        out = ffi.new("pe_client_program *")
        with self._lock:
            self._call(lib.pe_client_register, a, out)
            params = [_param_dict(out.params[i]) for i in range(out.n_params)]
        return Model(self, program, model, out, params, for_test)

    def get_params(self, model, names=None):
        """{name: array} of model's variables (names None: all parameters)."""
        names_c = [ffi.new("char[]", var_name(n).encode()) for n in (names or ())]
        arr = ffi.new("const char *[]", names_c) if names_c else ffi.NULL
        values = ffi.new("const pe_client_tensor **")
        n = ffi.new("size_t *")
        with self._lock:
            self._call(lib.pe_client_get_params, model.encode(), arr, len(names_c), values, n)
            return tensors_to_dict(values[0], n[0])

    def set_params(self, model, params):
        """Set model's variables from {name: array} (names the model's
        programs declare; all or nothing)."""
        items = [(k, np.ascontiguousarray(v)) for k, v in params.items()]
        ts = ffi.new("pe_client_tensor[]", max(len(items), 1))
        names = [ffi.new("char[]", k.encode()) for k, _ in items]
        for i, (_, a) in enumerate(items):
            fill_tensor(ts[i], names[i], a)
        self._call(lib.pe_client_set_params, model.encode(), ts, len(items))

    def _checkpoint(self, fn, model, name):
        path = ffi.new("const char **")
        nbytes = ffi.new("uint64_t *")
        with self._lock:
            self._call(fn, model.encode(), name.encode(), path, nbytes)
            return string(path[0]), nbytes[0]

    def save(self, model, name):
        """Checkpoint model under the daemon's state directory; (path, bytes)."""
        return self._checkpoint(lib.pe_client_save, model, name)

    def load(self, model, name):
        """Restore model from checkpoint `name`; (path, bytes)."""
        return self._checkpoint(lib.pe_client_load, model, name)

    def drop_model(self, model):
        """Free model in the daemon and remove its restart checkpoint."""
        out = ffi.new("pe_client_drop_result *")
        with self._lock:
            self._call(lib.pe_client_drop_model, model.encode(), out)
            return struct_dict(out)

    def shm(self, size):
        """A shared-memory region of size bytes (ShmRegion)."""
        r = ShmRegion(self, size)
        self._regions.append(r)
        return r

    def _forget_region(self, r):
        if r in self._regions:
            self._regions.remove(r)
        if not self.closed:
            self._call(lib.pe_client_unregister_shm, r.region)

    def staging(self, nbytes):
        """The staging region, grown to at least nbytes."""
        if self._staging is None or self._staging.size < nbytes:
            if self._staging is not None:
                self._staging.close()
            self._staging = self.shm(max(nbytes, 2 * (self._staging.size if self._staging else 0)))
        return self._staging

    def region_of(self, a):
        """(region id, offset) of an array inside one of this client's regions."""
        for r in self._regions:
            off = r.offset_of(a)
            if off is not None:
                return r.region, off
        return None

    def close(self):
        """End the session: the daemon deregisters this client's programs
        (freeing a non-persistent model only they use) and its regions.
        Idempotent; later requests open a new session."""
        if self.closed:
            return
        self.closed = True
        self._staging = None
        self._regions = []
        with self._lock:
            self._check(lib.pe_client_close(self._c))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        except PeError as e:
            # As pe-client: the daemon ends the session itself (the process
            # exiting, or its TTL); the block's own exception, if any, wins.
            warnings.warn("peclient: %s; the daemon drops the session after its TTL" % e,
                          RuntimeWarning, stacklevel=2)

    def __repr__(self):
        return "<Client %s id %016x%s>" % (self.address, self.id, " closed" if self.closed else "")


@atexit.register
def _close_live():
    for c in list(_live):
        try:
            if not c.closed:
                c.set_timeout(2000)
                c.close()
        except Exception:
            pass


class Model:
    """A program registered under a model name: .handle, .params (name,
    dtype, shape of each persistable), .existed, .has_values, .strategy,
    .places."""

    def __init__(self, client, program, name, reg, params, for_test):
        self.client = client
        self.program = program
        self.name = name
        self.handle = reg.handle
        self.existed = reg.existed
        self.has_values = reg.has_values
        self.strategy = STRATEGY_NAMES.get(reg.strategy, "auto")
        self.places = string(reg.places)
        self.params = params
        self.for_test = for_test
        self.last_run = {}

    def init(self, force=False):
        """Run the startup program for the values the model lacks (force: all
        of them). True when it ran."""
        done = ffi.new("bool *")
        self.client._call(lib.pe_client_init, self.handle, force, done)
        return bool(done[0])

    # --- run ----------------------------------------------------------------------

    def _prepare(self, name, value, steps):
        """value as a C-contiguous array of the declared dtype: [rows, ...],
        its steps dimension (steps not None) merged into the rows."""
        decl = self.program.feeds.get(name)
        a = np.asarray(value)
        if not decl:
            if a.dtype.name not in DTYPES:
                raise ClientArgumentError("run: feed '%s' has dtype %s (peclient takes %s)"
                                          % (name, a.dtype, ", ".join(DTYPES)))
            return np.ascontiguousarray(a)
        dtype, shape = decl
        if a.dtype != np.dtype(dtype) and a.dtype.kind in "biuf":
            a = a.astype(dtype)
        column = len(shape) == 2 and shape[1] == 1  # labels [-1, 1]
        if steps is not None and a.ndim == len(shape) + 1:
            a = a.reshape((-1,) + a.shape[2:])
        if column and a.ndim == 1 or (steps is not None and column and a.ndim == 2):
            a = a.reshape(-1, 1)  # labels [N] or [steps, batch]
        return np.ascontiguousarray(a)

    def _steps_of(self, feed):
        """The leading steps dimension of a feed dict: the first dim of
        feeds with one dim more than the program declares (None: none)."""
        steps = None
        for name, v in feed.items():
            decl = self.program.feeds.get(name)
            nd = np.ndim(v)
            if decl and nd == len(decl[1]) + 1:
                s = np.shape(v)[0]
                if steps is not None and s != steps:
                    raise ClientArgumentError("run: feed '%s' has %d steps, another feed %d"
                                              % (name, s, steps))
                steps = s
        return steps

    def run(self, feed, fetch=(), batches=None, repeat=1, trace=False, timeout_ms=0, priority=0,
            check_nan_inf=False):
        """Run the program on feed; returns the fetched arrays, in fetch's
        order. Several mini-batches in one request: a list of feed dicts, a
        leading steps dimension, or batches=K with K mini-batches stacked
        along dim 0; a fetched tensor is then [K, ...], each step's value
        (K = 1 included).
        repeat=N runs N steps on the same feed. timeout_ms: the daemon stops
        the run there (DeadlineExceededError; the steps before stay applied).
        .last_run has the request's run_ms, queue_ms, steps (and trace)."""
        if isinstance(feed, (list, tuple)):
            if not feed:
                raise ClientArgumentError("run: an empty list of feeds")
            batches = len(feed)
            feed = {k: np.concatenate([np.asarray(f[k]) for f in feed]) for k in feed[0]}
            steps = None
        else:
            steps = None if batches else self._steps_of(feed)
            batches = batches or steps
        names = [var_name(k) for k in feed]
        arrays = [self._prepare(k, feed[k], steps) for k in names]
        fetch = [var_name(f) for f in fetch]
        opts = ffi.new("pe_client_run_opts *")
        opts.steps = repeat if repeat > 1 else 0
        opts.batches = batches if batches and batches > 1 else 0
        opts.trace, opts.timeout_ms, opts.priority = trace, timeout_ms, priority
        opts.check_nan_inf = check_nan_inf
        out = self._run(names, arrays, fetch, opts)
        if batches == 1:  # one step of the stepped forms: its [1, ...] too
            out = [a[np.newaxis] for a in out]
        return out

    def _place_feeds(self, ts, arrays):
        """Feeds by reference: views into a region as they are, the others
        through the staging region when there are enough bytes of them."""
        c = self.client
        loose = []
        for i, a in enumerate(arrays):
            where = c.region_of(a)
            if where:
                ts[i].shm_region, ts[i].shm_offset = where
            else:
                loose.append(i)
        total = sum(arrays[i].nbytes for i in loose)
        if not c.use_shm or total < c.shm_threshold:
            return
        st = c.staging(total + 64 * len(loose))
        off = 0
        for i in loose:
            a = arrays[i]
            view = st.array(a.shape, a.dtype, off)
            view[...] = a
            ts[i].shm_region, ts[i].shm_offset = st.region, off
            off += (a.nbytes + 63) // 64 * 64

    def _run(self, names, arrays, fetch, o):
        c = self.client
        ts = ffi.new("pe_client_tensor[]", max(len(arrays), 1))
        names_c = [ffi.new("char[]", n.encode()) for n in names]
        for i, a in enumerate(arrays):
            fill_tensor(ts[i], names_c[i], a)
        fetch_c = [ffi.new("char[]", f.encode()) for f in fetch]
        fetch_arr = ffi.new("const char *[]", fetch_c) if fetch_c else ffi.NULL
        res = ffi.new("pe_client_run_result *")
        with c._lock:
            self._place_feeds(ts, arrays)
            c._call(lib.pe_client_run, self.handle, ts, len(arrays), fetch_arr, len(fetch_c), o,
                    res)
            got = tensors_to_dict(res.fetched, res.n_fetched)
            self.last_run = {"run_ms": res.run_ms, "queue_ms": res.queue_ms, "steps": res.steps}
            if res.trace_json != ffi.NULL:
                self.last_run["trace"] = ffi.string(res.trace_json, res.trace_len).decode()
        missing = [f for f in fetch if f not in got]
        if missing:
            raise ClientArgumentError("run: the reply lacks %s" % ", ".join(missing))
        return [got[f] for f in fetch]

    # --- state --------------------------------------------------------------------

    def state_dict(self, names=None):
        """{name: array} of the model's parameters and state (names None: all)."""
        return self.client.get_params(self.name, names)

    def load_state_dict(self, params):
        """Set the model's variables from {name: array}."""
        self.client.set_params(self.name, params)

    def save(self, name):
        """A checkpoint in the daemon's state directory; (path, bytes)."""
        return self.client.save(self.name, name)

    def load(self, name):
        """Restore the checkpoint `name`; (path, bytes)."""
        return self.client.load(self.name, name)

    def export(self, path, format=None):
        """The parameters to a file of one's own: .npz, .safetensors, or any
        other name the daemon's checkpoint format, as `pe-client export`
        writes it (format=: io.save_params)."""
        from . import io

        io.save_params(path, self.state_dict(), format=format)

    def import_params(self, path, names=None, format=None):
        """Set the parameters from a file export or `pe-client export` wrote
        (names: only those; format=: io.load_params); returns the names set."""
        from . import io

        params = io.load_params(path, format=format)
        if names is not None:
            params = {k: v for k, v in params.items() if k in set(names)}
        self.load_state_dict(params)
        return sorted(params)

    def deregister(self):
        self.client._call(lib.pe_client_deregister, self.handle)

    def __repr__(self):
        return "<Model %s handle %#x places %s>" % (self.name, self.handle, self.places)
