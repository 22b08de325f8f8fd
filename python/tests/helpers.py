"""Shared by the tests: the build tree, a daemon on a private socket, a
small MLP and its batches. peclient is imported from this checkout, with
libpeclient.so.0 from $PE_BUILD_DIR (default: the checkout's build/)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent.parent.parent
BUILD = Path(os.environ.get("PE_BUILD_DIR") or SOURCE / "build")
os.environ.setdefault("PE_BUILD_DIR", str(BUILD))
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
sys.path.insert(0, str(SOURCE / "python"))

import peclient as pe  # noqa: E402


class Daemon:
    """pe-executord on ipc://<dir>/sock with its state in <dir>/state."""

    def __init__(self, tmp, places="cpu:2", conf=None):
        """conf: the text of a config file for it (None: none)."""
        self.dir = Path(tmp)
        self.address = "ipc://%s/sock" % self.dir
        self.log = self.dir / "daemon.log"
        args = [str(BUILD / "pe-executord"), "--socket", self.address, "--state-dir",
                str(self.dir / "state"), "--places", places]
        if conf is not None:
            (self.dir / "d.conf").write_text(conf)
            args += ["--config", str(self.dir / "d.conf")]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with pe.Client(self.address, timeout_ms=1000) as c:
                    c.ping()
                return
            except pe.PeError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("pe-executord did not start: %s" % self.log.read_text())
                time.sleep(0.1)

    def client(self, **kw):
        return pe.Client(self.address, **kw)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def mlp(hidden=32, classes=10, features=784, optimizer=None):
    """A small MLP in a Program of its own: (program, loss, accuracy)."""
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, features])
        y = pe.data("y", [-1, 1], "int64")
        h = pe.layers.fc(x, hidden, act="relu")
        logits = pe.layers.fc(h, classes)
        loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, y))
        acc = pe.layers.accuracy(logits, y)
        (optimizer or pe.optimizer.Momentum(learning_rate=0.1, momentum=0.9)).minimize(loss)
    return prog, loss, acc


def batch(n=64, features=784, seed=0):
    """Random features and labels."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, features), dtype=np.float32), rng.integers(0, 10, n)
