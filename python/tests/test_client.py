"""The connection: every Client and Model call against a real daemon, and
the error paths (bad shape, missing feed, unknown op, daemon down)."""
import time

import numpy as np
import pytest

from helpers import batch, mlp, pe


@pytest.fixture
def model(client):
    prog, loss, acc = mlp()
    m = client.register(prog, model="t_client", places="cpu:2", seed=7)
    assert m.init()
    yield m, loss, acc
    client.drop_model("t_client")


def test_ping_status_and_identity(client):
    client.ping()
    st = client.status()
    assert st["version"] == pe.__version__
    assert st["clients"] >= 1 and [p["place"] for p in st["places"]] == ["cpu:0", "cpu:1"]
    assert {lane["name"] for lane in st["lanes"]} == {"work", "control", "run"}
    assert client.id != 0 and client.address.startswith("ipc://")
    assert client.max_message > 1 << 20


def test_default_socket_is_pe_socket(daemon):
    with pe.Client() as c:  # PE_SOCKET, set by the daemon fixture
        assert c.address == daemon.address
    assert pe.default_address().startswith("ipc://")


def test_register_init_run(client, model):
    m, loss, acc = model
    assert m.places == "cpu:2" and not m.existed and not m.has_values
    assert {"name": "fc_0.w", "dtype": "f32", "shape": (784, 32)} in m.params
    assert not m.init()  # the values exist: nothing to do
    x, y = batch()
    first = m.run({"x": x, "y": y}, fetch=[loss, acc])
    assert [a.shape for a in first] == [(1,), (1,)] and first[0].dtype == np.float32
    for _ in range(5):
        last, = m.run({"x": x, "y": y.reshape(-1, 1)}, fetch=["mean_0.out"])
    assert last[0] < first[0][0]
    assert m.last_run["steps"] == 1 and m.last_run["run_ms"] > 0
    assert m.run({"x": x, "y": y}) == []


def test_several_batches_per_request(client):
    # Three models of one seed take the same 4 steps three ways.
    x, y = batch(4 * 16)
    xs, ys = x.reshape(4, 16, 784), y.reshape(4, 16)
    losses = []
    for way in ("steps", "list", "batches"):
        prog, loss, _ = mlp()
        m = client.register(prog, model="t_" + way, seed=3)
        m.init()
        if way == "steps":
            out, = m.run({"x": xs, "y": ys}, fetch=[loss])
        elif way == "list":
            out, = m.run([{"x": xs[i], "y": ys[i]} for i in range(4)], fetch=[loss])
        else:
            out, = m.run({"x": x, "y": y}, fetch=[loss], batches=4)
        assert out.shape == (4, 1) and m.last_run["steps"] == 4
        losses.append(out)
        client.drop_model("t_" + way)
    assert np.array_equal(losses[0], losses[1]) and np.array_equal(losses[0], losses[2])


def test_one_step_of_the_stepped_forms_keeps_its_axis(client, model):
    m, loss, _ = model
    x, y = batch(16)
    assert m.run({"x": x[None], "y": y[None]}, fetch=[loss])[0].shape == (1, 1)
    assert m.run([{"x": x, "y": y}], fetch=[loss])[0].shape == (1, 1)
    assert m.run({"x": x, "y": y}, fetch=[loss], batches=1)[0].shape == (1, 1)
    assert m.run({"x": x, "y": y}, fetch=[loss])[0].shape == (1,)


def test_state_dict_round_trip(client, model):
    m, loss, _ = model
    sd = m.state_dict()
    assert sd["fc_0.w"].shape == (784, 32) and "fc_0.w@VELOCITY" in sd
    new = {"fc_0.b": np.arange(32, dtype=np.float32)}
    m.load_state_dict(new)
    assert np.array_equal(m.state_dict(["fc_0.b"])["fc_0.b"], new["fc_0.b"])
    with pytest.raises(pe.UnknownVariableError, match="nonexistent"):
        m.load_state_dict({"nonexistent": np.zeros(1, np.float32)})


def test_save_load_checkpoint(client, model):
    m, loss, _ = model
    path, nbytes = m.save("ck")
    assert path.endswith("ck.ckpt") and nbytes > 0
    before = m.state_dict()
    x, y = batch()
    m.run({"x": x, "y": y}, fetch=[loss])
    assert not np.array_equal(m.state_dict()["fc_0.w"], before["fc_0.w"])
    m.load("ck")
    after = m.state_dict()
    assert all(np.array_equal(after[k], before[k]) for k in before)
    with pytest.raises(pe.NotFoundError):
        m.load("no_such_checkpoint")


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
def test_export_import(client, model, tmp_path, ext):
    m, _, _ = model
    path = tmp_path / ("p." + ext)
    m.export(path)
    saved = pe.io.load_params(path)
    assert set(saved) == set(m.state_dict())
    m.load_state_dict({"fc_1.w": np.zeros((32, 10), np.float32)})
    assert m.import_params(path, names=["fc_1.w"]) == ["fc_1.w"]
    assert np.array_equal(m.state_dict(["fc_1.w"])["fc_1.w"], saved["fc_1.w"])


def test_deregister_and_drop(client):
    prog, loss, _ = mlp()
    m = client.register(prog, model="t_drop")
    m.init()
    m.deregister()
    with pytest.raises(pe.NotFoundError):
        m.run({"x": batch()[0], "y": batch()[1]}, fetch=[loss])
    with pytest.raises(pe.NotFoundError):
        client.drop_model("t_never_was")


def test_with_block_ends_the_session(daemon):
    prog, _, _ = mlp()
    with daemon.client() as c:
        c.register(prog, model="t_session").init()
        with daemon.client() as other:
            assert "fc_0.w" in other.get_params("t_session")
    with daemon.client() as other:
        # The session's non-persistent model went with it.
        with pytest.raises(pe.NotFoundError):
            other.get_params("t_session")


def test_bad_shape(client, model):
    m, loss, _ = model
    x, y = batch()
    with pytest.raises(pe.ShapeMismatchError, match=r"'x'.*\[64,783\].*\[-1,784\]") as e:
        m.run({"x": x[:, :783], "y": y}, fetch=[loss])
    assert e.value.code == 8 and e.value.code_name == "SHAPE_MISMATCH"
    assert isinstance(e.value, pe.PeError) and isinstance(e.value, ValueError)


def test_missing_feed(client, model):
    m, loss, _ = model
    with pytest.raises(pe.MissingFeedError, match="'y'"):
        m.run({"x": batch()[0]}, fetch=[loss])


def test_unknown_fetch(client, model):
    m, _, _ = model
    with pytest.raises(pe.UnknownVariableError, match="no_such_var"):
        m.run({"x": batch()[0], "y": batch()[1]}, fetch=["no_such_var"])


def test_unknown_op(client):
    prog, _, _ = mlp()
    data = prog.to_bytes()
    assert data.count(b"relu") == 1  # one relu op: rename it, same length
    with pytest.raises(pe.UnknownOpError, match="relv"):
        client.register(data.replace(b"relu", b"relv"), model="t_unknown_op")


def test_bad_places(client):
    prog, _, _ = mlp()
    with pytest.raises(pe.PeError, match="gpu:9"):
        client.register(prog, model="t_places", places="gpu:9")


def test_no_daemon_fails_at_once(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(pe.DaemonConnectionError, match="nothing.sock") as e:
        pe.Client("ipc://%s/nothing.sock" % tmp_path)
    assert isinstance(e.value, ConnectionError) and time.monotonic() - t0 < 5


def test_dead_daemon_raises_within_the_timeout(spare_daemon):
    c = spare_daemon.client(timeout_ms=1500, no_recover=True)
    prog, loss, _ = mlp(hidden=4, features=8)
    m = c.register(prog, model="doomed")
    m.init()
    spare_daemon.kill()
    t0 = time.monotonic()
    # A killed daemon leaves its socket file with nobody listening: the
    # request ends as the daemon's going away (a ConnectionError), after the
    # wait for a restart that does not come, not after a hang.
    with pytest.raises(pe.ShuttingDownError, match=r"run .*went away before answering"):
        m.run({"x": batch(4, 8)[0], "y": batch(4, 8)[1]}, fetch=[loss])
    assert time.monotonic() - t0 < 30  # the restart wait and the send's, not a hang
    # The session cannot be closed: said, not raised, at the end of a with block.
    with pytest.warns(RuntimeWarning, match="close"):
        with c:
            pass
