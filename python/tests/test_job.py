"""A job across nodes from Python: two daemons on loopback, each trainer
registers with job=dict(...) and feeds its half of the batch; both nodes
hold the same parameters after every step; a job dict without a field is a
ClientArgumentError naming it."""
import socket
import threading

import numpy as np
import pytest

from helpers import Daemon, batch, mlp, pe

CONF = "[job]\nhost = 127.0.0.1\ntimeout = 10\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_hold_the_same_parameters(tmp_path):
    for r in range(2):
        (tmp_path / ("d%d" % r)).mkdir()
    daemons = [Daemon(tmp_path / ("d%d" % r), places="cpu:1", conf=CONF) for r in range(2)]
    prog, loss, _ = mlp()
    x, y = batch(32, seed=3)
    port = free_port()
    after = [[], []]
    errors = []

    def node(r):
        try:
            with daemons[r].client(timeout_ms=60000) as c:
                m = c.register(prog, model="job", seed=5,
                               job=dict(name="py", world=2, rank=r, token="t",
                                        rendezvous="127.0.0.1:%d" % port))
                m.init()
                for _ in range(3):
                    m.run({"x": x[r * 16:(r + 1) * 16], "y": y[r * 16:(r + 1) * 16]},
                          fetch=[loss])
                    after[r].append(c.get_params("job"))
        except Exception as e:  # reported below
            errors.append("rank %d: %s" % (r, e))

    try:
        threads = [threading.Thread(target=node, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for d in daemons:
            d.stop()
    assert not errors, errors
    for step in range(3):
        a, b = after[0][step], after[1][step]
        assert sorted(a) == sorted(b)
        for name in a:
            assert np.array_equal(a[name], b[name]), (step, name)
    assert not np.array_equal(after[0][0]["fc_0.w"], after[0][2]["fc_0.w"])


def test_job_without_a_field_is_refused(client):
    prog, _, _ = mlp()
    with pytest.raises(pe.ClientArgumentError, match="job lacks rendezvous, token"):
        client.register(prog, model="nojob", job=dict(name="j", world=2, rank=0))
