"""Scaling of a job across nodes on one machine: 1, 2 and 3 daemons on
loopback, each pinned to one core (taskset; cores are reused round-robin
when there are fewer than daemons), each training the MLP (784-256-128-10,
momentum SGD) on its own batch of --batch rows for --steps steps (weak
scaling: the global batch is nodes x batch). Prints samples/s of the job
and the efficiency, samples/s over nodes x one daemon's samples/s.

usage: /usr/bin/python3 bench/job_scaling.py [--steps 60] [--batch 64] [--nodes 1,2,3] [--fuse]
(PE_BUILD_DIR: the build tree, default build/)"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("PE_BUILD_DIR") or SOURCE / "build")
os.environ.setdefault("PE_BUILD_DIR", str(BUILD))
sys.path.insert(0, str(SOURCE / "python"))
import peclient as pe  # noqa: E402

CONF = "[runtime]\nworker_threads = 1\n[job]\nhost = 127.0.0.1\n"


def mlp():
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, 784])
        y = pe.data("y", [-1, 1], "int64")
        h = pe.layers.fc(x, 256, act="relu")
        h = pe.layers.fc(h, 128, act="relu")
        logits = pe.layers.fc(h, 10)
        loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, y))
        pe.optimizer.Momentum(learning_rate=0.05, momentum=0.9).minimize(loss)
    return prog, loss


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(tmp, core):
    conf = Path(tmp) / "d.conf"
    conf.write_text(CONF)
    addr = "ipc://%s/sock" % tmp
    proc = subprocess.Popen(["taskset", "-c", str(core), str(BUILD / "pe-executord"), "--socket",
                             addr, "--state-dir", str(Path(tmp) / "state"), "--places", "cpu:1",
                             "--config", str(conf)],
                            stderr=open(Path(tmp) / "log", "wb"))
    for _ in range(300):
        try:
            with pe.Client(addr, timeout_ms=500) as c:
                c.ping()
            return proc, addr
        except pe.PeError:
            time.sleep(0.1)
    raise RuntimeError("daemon did not start: see %s/log" % tmp)


def run(nodes, steps, batch, cores, fuse):
    prog, loss = mlp()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 784), dtype=np.float32)
    y = rng.integers(0, 10, (batch, 1))
    tmps = [tempfile.mkdtemp(prefix="pe-scal-") for _ in range(nodes)]
    daemons = [start_daemon(t, i % cores) for i, t in enumerate(tmps)]
    port = free_port()
    times = [0.0] * nodes
    errors = []
    barrier = threading.Barrier(nodes)

    def node(r):
        try:
            with pe.Client(daemons[r][1], timeout_ms=120000) as c:
                job = None
                if nodes > 1:
                    job = dict(name="scal", world=nodes, rank=r, token="t",
                               rendezvous="127.0.0.1:%d" % port)
                m = c.register(prog, model="m", places="cpu:1", job=job, fuse_allreduce=fuse)
                m.init()
                for _ in range(5):  # warm-up
                    m.run(feed={"x": x, "y": y}, fetch=[loss])
                barrier.wait()
                t0 = time.perf_counter()
                for _ in range(steps):
                    m.run(feed={"x": x, "y": y}, fetch=[loss])
                times[r] = time.perf_counter() - t0
        except Exception as e:  # reported below
            errors.append("rank %d: %s" % (r, e))

    threads = [threading.Thread(target=node, args=(r,)) for r in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p, _ in daemons:
        p.terminate()
        p.wait()
    if errors:
        raise RuntimeError("; ".join(errors))
    return nodes * batch * steps / max(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--nodes", default="1,2,3")
    ap.add_argument("--fuse", action="store_true", help="fuse the gradients into buckets")
    a = ap.parse_args()
    cores = os.cpu_count()
    base = None
    for n in [int(v) for v in a.nodes.split(",")]:
        sps = run(n, a.steps, a.batch, cores, a.fuse)
        base = base or sps
        print("nodes %d: %8.0f samples/s  efficiency %.2f" % (n, sps, sps / (n * base)))


if __name__ == "__main__":
    main()
