"""Scaling of a job across nodes on one machine: 1, 2 and 3 daemons, each
pinned to one core (taskset; cores are reused round-robin when there are
fewer than daemons), each training pe-client's MLP (784-256-128-10) or CNN
(conv 5x5x32, pool, conv 5x5x64, pool, fc 1024, dropout, fc 10), momentum, on
its own batch of --batch rows for --steps steps (weak scaling: the global
batch is nodes x batch).

Prints, per model, network and number of nodes: samples/s of the job, the
efficiency (samples/s over nodes x one daemon's samples/s), and from the
daemon's timeline (run(trace=True) on --trace-steps more steps, rank 0):
the step time, the time spent summing across nodes per step ("across
nodes" spans of engine/parallel/cross.c) and the overlap, the fraction of
that time during which the node computed something else.

--net veth runs each daemon in its own network namespace, the namespaces
joined by veth pairs on a bridge, each node's link shaped by tc on its
egress: tbf (--rate, e.g. 1gbit) and, where the kernel has the netem qdisc,
a delay (--delay, e.g. 200us). Without netem the delay is left out (said on
stdout): tbf limits the bandwidth only. Needs root (ip netns, tc).

usage: /usr/bin/python3 bench/job_scaling.py [--models mlp,cnn] [--net loopback,veth]
       [--steps 40] [--batch 64] [--nodes 1,2,3] [--workers 1] [--fuse] [--repeat 1]
       [--json FILE]
(PE_BUILD_DIR: the build tree, default build/)"""
import argparse
import json
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

COMM_SPAN = "across nodes "  # how cross.c names its spans (then the node's name)


def model(name):
    """pe-client's built-in model (pe_models.h): its program, the feeds'
    names, one row's shape and the loss."""
    prog = pe.load_model(name)
    return prog, prog.image_name, prog.label_name, list(prog.feeds[prog.image_name][1][1:]), \
        prog.loss_name


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


class Veth:
    """Namespaces ns0..nsN-1 on a bridge, node r at 10.78.0.(r+1), each
    node's egress shaped (tbf, and netem's delay where the kernel has it)."""

    def __init__(self, nodes, rate, delay):
        tag = "%x" % (os.getpid() & 0xfff)
        self.br = "pejsbr" + tag
        self.ns = ["pejs%s-%d" % (tag, r) for r in range(nodes)]
        self.addr = ["10.78.0.%d" % (r + 1) for r in range(nodes)]
        self.delay_applied = False
        try:
            sh("ip", "link", "add", self.br, "type", "bridge")
            sh("ip", "link", "set", self.br, "up")
            for r, ns in enumerate(self.ns):
                inner, outer = "pejsi%s%d" % (tag, r), "pejso%s%d" % (tag, r)
                sh("ip", "netns", "add", ns)
                sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
                sh("ip", "link", "set", inner, "netns", ns)
                sh("ip", "link", "set", outer, "master", self.br, "up")
                sh("ip", "-n", ns, "addr", "add", self.addr[r] + "/24", "dev", inner)
                sh("ip", "-n", ns, "link", "set", inner, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                self.delay_applied = self.shape(ns, inner, rate, delay)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def shape(ns, dev, rate, delay):
        """netem delay with tbf under it where netem exists, else tbf alone;
        whether the delay is applied."""
        tbf = ["tbf", "rate", rate, "burst", "32kb", "latency", "50ms"]
        if delay and sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                        "handle", "1:", "netem", "delay", delay, check=False).returncode == 0:
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "parent", "1:1",
               "handle", "10:", *tbf)
            return True
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *tbf)
        return False

    def close(self):
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.br, check=False)


def start_daemon(tmp, core, host, workers, ns=None):
    conf = Path(tmp) / "d.conf"
    conf.write_text("[runtime]\nworker_threads = %d\n[job]\nhost = %s\n" % (workers, host))
    addr = "ipc://%s/sock" % tmp  # a unix socket: reachable from any namespace
    cmd = ["taskset", "-c", str(core), str(BUILD / "pe-executord"), "--socket", addr,
           "--state-dir", str(Path(tmp) / "state"), "--places", "cpu:1", "--config", str(conf)]
    if ns:
        cmd = ["ip", "netns", "exec", ns] + cmd
    proc = subprocess.Popen(cmd, stderr=open(Path(tmp) / "log", "wb"))
    for _ in range(300):
        try:
            with pe.Client(addr, timeout_ms=500) as c:
                c.ping()
            return proc, addr
        except pe.PeError:
            time.sleep(0.1)
    raise RuntimeError("daemon did not start: see %s/log" % tmp)


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covered(spans, by):
    """Microseconds of the union of spans that the union of by covers."""
    total, j = 0.0, 0
    for a, b in spans:
        while j < len(by) and by[j][1] <= a:
            j += 1
        k = j
        while k < len(by) and by[k][0] < b:
            total += min(b, by[k][1]) - max(a, by[k][0])
            k += 1
    return total


def trace_figures(traces):
    """Per step: wall (first span to last), time across nodes, and the
    fraction of it that overlaps other spans (the node's computation)."""
    step, comm, over = [], [], []
    for tr in traces:
        ev = [e for e in json.loads(tr)["traceEvents"] if e.get("ph") == "X"]
        if not ev:
            continue
        step.append(max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev))
        spans = [(e["ts"], e["ts"] + e["dur"], e["name"].startswith(COMM_SPAN)) for e in ev]
        c = union([(a, b) for a, b, x in spans if x])
        o = union([(a, b) for a, b, x in spans if not x])
        comm.append(sum(b - a for a, b in c))
        over.append(covered(c, o))
    if not step:
        return None
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    return {"step_ms": mean(step) / 1e3, "comm_ms": mean(comm) / 1e3,
            "overlap": sum(over) / sum(comm) if sum(comm) else 0.0}


def run(name, nodes, a, cores, veth):
    prog, xname, yname, shape, loss = model(name)
    rng = np.random.default_rng(0)
    x = rng.standard_normal([a.batch] + shape, dtype=np.float32)
    y = rng.integers(0, 10, (a.batch, 1))
    tmps = [tempfile.mkdtemp(prefix="pe-scal-") for _ in range(nodes)]
    hosts = veth.addr if veth else ["127.0.0.1"] * nodes
    daemons = []
    try:
        for r, t in enumerate(tmps):
            daemons.append(start_daemon(t, r % cores, hosts[r], a.workers,
                                        veth.ns[r] if veth else None))
        port = free_port()
        times = [0.0] * nodes
        traces = []
        errors = []
        barrier = threading.Barrier(nodes)

        def node(r):
            try:
                with pe.Client(daemons[r][1], timeout_ms=300000) as c:
                    job = None
                    if nodes > 1:
                        job = dict(name="scal", world=nodes, rank=r, token="t",
                                   rendezvous="%s:%d" % (hosts[0], port))
                    m = c.register(prog, model="m", places="cpu:1", job=job,
                                   fuse_allreduce=a.fuse)
                    m.init()
                    feed = {xname: x, yname: y}
                    for _ in range(3):  # warm-up
                        m.run(feed=feed, fetch=[loss])
                    barrier.wait()
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        m.run(feed=feed, fetch=[loss])
                    times[r] = time.perf_counter() - t0
                    for _ in range(a.trace_steps):
                        m.run(feed=feed, fetch=[loss], trace=True)
                        if r == 0:
                            traces.append(m.last_run["trace"])
            except Exception as e:  # reported below
                errors.append("rank %d: %s" % (r, e))
                barrier.abort()

        threads = [threading.Thread(target=node, args=(r,)) for r in range(nodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p, _ in daemons:
            p.terminate()
            p.wait()
    if errors:
        raise RuntimeError("; ".join(errors) + " (daemon logs: %s)" % ", ".join(tmps))
    res = {"samples_s": nodes * a.batch * a.steps / max(times),
           "wall_step_ms": max(times) / a.steps * 1e3}
    res.update(trace_figures(traces) or {})
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--net", default="loopback", help="loopback, veth or both (comma list)")
    ap.add_argument("--rate", default="1gbit", help="veth: tbf rate of each node's egress")
    ap.add_argument("--delay", default="200us", help="veth: netem delay, where netem exists")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--trace-steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--nodes", default="1,2,3")
    ap.add_argument("--workers", type=int, default=1, help="each daemon's worker_threads")
    ap.add_argument("--fuse", action="store_true", help="fuse the gradients into buckets")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the median is shown")
    ap.add_argument("--json", help="append one JSON line per run to this file")
    a = ap.parse_args()
    cores = os.cpu_count()
    node_counts = [int(v) for v in a.nodes.split(",")]
    print("cores %d (daemon r on core r %% %d), workers %d, batch %d per node, %d steps"
          % (cores, cores, a.workers, a.batch, a.steps))
    for net in a.net.split(","):
        veth = None
        if net == "veth":
            veth = Veth(max(node_counts), a.rate, a.delay)
            print("veth: tbf %s per node's egress; delay %s" % (
                a.rate, a.delay if veth.delay_applied else
                "not applied (no netem qdisc in this kernel)"))
        try:
            for name in a.models.split(","):
                base = None
                for n in node_counts:
                    runs = sorted((run(name, n, a, cores, veth) for _ in range(a.repeat)),
                                  key=lambda v: v["samples_s"])
                    r = runs[len(runs) // 2]
                    base = base or r["samples_s"]
                    r.update(model=name, net=net, nodes=n, efficiency=r["samples_s"] / (n * base))
                    print("%-3s %-8s nodes %d: %7.0f samples/s  efficiency %.2f  step %6.1f ms  "
                          "traced step %6.1f ms  across nodes %6.1f ms/step  overlap %.2f"
                          % (name, net, n, r["samples_s"], r["efficiency"], r["wall_step_ms"],
                             r.get("step_ms", 0.0), r.get("comm_ms", 0.0), r.get("overlap", 0.0)),
                          flush=True)
                    if a.json:
                        with open(a.json, "a") as f:
                            f.write(json.dumps(r) + "\n")
        finally:
            if veth:
                veth.close()


if __name__ == "__main__":
    main()
