"""Processes: two trainers on one daemon at once, and Ctrl-C in the middle
of a run ends the session at once."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import pe

HERE = Path(__file__).resolve().parent

# A trainer: registers model NAME, says so in MINE, waits until OTHER is
# there too, counts the daemon's sessions, trains, and keeps its session
# until the other is done too (MINE.done, OTHER.done); prints its losses.
TRAINER = r"""
import json, os, sys, time
sys.path.insert(0, %(here)r)
from helpers import batch, mlp, pe
name, mine, other = sys.argv[1:4]

def mark_and_wait(mine, other):
    open(mine, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(other) and time.monotonic() < deadline:
        time.sleep(0.05)

with pe.Client() as c:
    prog, loss, _ = mlp()
    m = c.register(prog, model=name, seed=9)
    m.init()
    mark_and_wait(mine, other)
    clients = c.status()["clients"]
    x, y = batch(256, seed=1)
    losses = [float(m.run({"x": x[i::4], "y": y[i::4]}, fetch=[loss])[0][0]) for i in range(4)]
    losses += list(map(float, m.run({"x": x.reshape(4, 64, 784), "y": y.reshape(4, 64)},
                                    fetch=[loss])[0].ravel()))
    mark_and_wait(mine + ".done", other + ".done")
print(json.dumps({"clients": clients, "losses": losses}))
"""

# A run of many steps, to be interrupted.
LONG_RUN = r"""
import signal, sys
# A trainer at a terminal: Python's own SIGINT handler, even when the suite
# runs in a background job that inherited SIGINT ignored (sh without job
# control), where Ctrl-C could not reach this process at all.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, %(here)r)
from helpers import batch, mlp, pe
c = pe.Client(timeout_ms=120000)
prog, loss, _ = mlp(hidden=256)
m = c.register(prog, model="ctrl_c")
m.init()
print("running", flush=True)
m.run({"x": batch(256)[0], "y": batch(256)[1]}, fetch=[loss], repeat=1000000)
print("run ended", flush=True)
"""


def python(script, *args, **kw):
    return subprocess.Popen([sys.executable, "-c", script % {"here": str(HERE)}] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_two_trainers_at_once(daemon, tmp_path):
    marks = [str(tmp_path / "a"), str(tmp_path / "b")]
    procs = [python(TRAINER, "proc_a", marks[0], marks[1]),
             python(TRAINER, "proc_b", marks[1], marks[0])]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["clients"] >= 2 for r in results), results  # both sessions at once
    # One program, seed and data: both models trained alike, bit for bit.
    assert results[0]["losses"] == results[1]["losses"]
    assert results[0]["losses"][-1] < results[0]["losses"][0]
    with daemon.client() as c:
        for name in ("proc_a", "proc_b"):  # their sessions ended with them
            with pytest.raises(pe.NotFoundError):
                c.get_params(name)


def test_ctrl_c_ends_the_session(daemon):
    with daemon.client() as watcher:
        p = python(LONG_RUN)
        try:
            ctrl_c(watcher, p)
        finally:
            p.kill()
            p.wait()


def ctrl_c(watcher, p):
    """SIGINT once p's run is in flight: p ends soon, its session with it."""
    assert p.stdout.readline().strip() == "running"
    deadline = time.monotonic() + 60
    while not watcher.status()["runs_in_flight"]:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - t0
    assert p.returncode != 0 and "KeyboardInterrupt" in err, err
    assert "run ended" not in out
    assert took < 30  # not the run's million steps
    with pytest.raises(pe.NotFoundError):
        watcher.get_params("ctrl_c")  # the session and its model are gone
    assert watcher.status()["runs_in_flight"] == 0
