"""Shared-memory feeds: views into a region travel by reference, other
large feeds through the staging region, and both give the results the
socket gives. A feed larger than the client's max_message shows which way
it went: through the socket it is refused (MESSAGE_TOO_LARGE)."""
import numpy as np
import pytest

from helpers import batch, mlp, pe

LIMIT = 256 << 10  # max_message of the clients below
ROWS = 128  # 128 x 784 x 4 bytes = 392 KiB of x: more than LIMIT


def train_once(c, x, y, name):
    prog, loss, _ = mlp()
    m = c.register(prog, model=name, seed=5)
    m.init()
    out, = m.run({"x": x, "y": y}, fetch=[loss])
    params = m.state_dict()
    c.drop_model(name)
    return out, params


def test_large_feed_through_the_socket_is_refused(daemon):
    x, y = batch(ROWS)
    with daemon.client(max_message=LIMIT, shm=False) as c:
        with pytest.raises(pe.MessageTooLargeError):
            train_once(c, x, y, "shm_refused")


def test_region_views_travel_by_reference(daemon):
    x, y = batch(ROWS)
    with daemon.client(shm=False) as c:  # the reference, through the socket
        want, want_params = train_once(c, x, y, "shm_ref")
    with daemon.client(max_message=LIMIT, shm=False) as c:
        region = c.shm(x.nbytes + y.nbytes)
        xs = region.array(x.shape, np.float32)
        ys = region.array(y.shape, np.int64, offset=x.nbytes)
        xs[...], ys[...] = x, y
        assert c.region_of(xs) == (region.region, 0)
        got, params = train_once(c, xs, ys, "shm_views")
    assert np.array_equal(got, want)
    assert all(np.array_equal(params[k], want_params[k]) for k in want_params)


def test_staging_region_for_large_feeds(daemon):
    x, y = batch(ROWS)
    with daemon.client(shm=False) as c:
        want, _ = train_once(c, x, y, "stage_ref")
    with daemon.client(max_message=LIMIT, shm=True, shm_threshold=64 << 10) as c:
        got, _ = train_once(c, x, y, "stage")
        assert c._staging is not None and c._staging.size >= x.nbytes + y.nbytes
    assert np.array_equal(got, want)


def test_dataset_batches_in_shared_memory(daemon):
    x, y = batch(ROWS * 4)
    ds = pe.io.ArrayDataset(x, y)
    with daemon.client(max_message=LIMIT) as c:
        prog, loss, _ = mlp()
        m = c.register(prog, model="shm_ds", seed=5)
        m.init()
        steps = 0
        for xb, yb in ds.batches(ROWS, steps=2, client=c):
            assert c.region_of(xb) is not None and xb.shape == (2, ROWS, 784)
            out, = m.run({"x": xb, "y": yb}, fetch=[loss])
            steps += out.shape[0]
        assert steps == 4
        c.drop_model("shm_ds")


def test_region_close(daemon):
    with daemon.client() as c:
        region = c.shm(4096)
        a = region.array((16,), np.float64)
        a[:] = 1.5
        region.close()
        assert c.region_of(a) is None
        assert a.sum() == 24.0  # the mapping stays while an array uses it
