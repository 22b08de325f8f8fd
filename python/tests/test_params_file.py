"""Parameter files in the daemon's checkpoint format (pe_params_file.h):
pe.io.save_params / load_params and Model.export / import_params take it
for any name but .npz and .safetensors (or format="checkpoint"); a file
Python writes imports with `pe-client import` and loads in the daemon once
in its state directory, a `pe-client export` file loads in Python, with
equal values; a damaged file is refused naming it."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from helpers import BUILD, batch, mlp, pe

PARAMS = {
    "fc.w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "fc.b": np.array([-1.5, 2.25], np.float64),
    "step": np.array([42], np.int64),
    "ids": np.array([[1, -2], [3, 4]], np.int32),
    "mask": np.zeros((0, 5), np.uint8),
    "scalar": np.float32(0.5),
}


def assert_same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), k


def test_round_trip_by_name_and_by_format(tmp_path):
    path = tmp_path / "params.pe"
    pe.io.save_params(path, PARAMS)
    assert path.read_bytes()[:8] == b"PECKPT03"
    assert_same(pe.io.load_params(path), PARAMS)
    # format= wins over the name
    forced = tmp_path / "looks.npz"
    pe.io.save_params(forced, PARAMS, format="checkpoint")
    assert forced.read_bytes()[:8] == b"PECKPT03"
    assert_same(pe.io.load_params(forced, format="checkpoint"), PARAMS)
    with pytest.raises(ValueError, match="format 'pt' unknown"):
        pe.io.save_params(tmp_path / "p.pt", PARAMS, format="pt")


def test_bad_arrays_and_damaged_files_are_named(tmp_path):
    path = tmp_path / "p.ckpt"
    with pytest.raises(TypeError, match="float16"):
        pe.io.save_params(path, {"h": np.zeros(2, np.float16)})
    assert not path.exists()
    pe.io.save_params(path, PARAMS)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    bad = tmp_path / "flipped.ckpt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(pe.PeError, match="flipped.ckpt.*CRC mismatch"):
        pe.io.load_params(bad)
    short = tmp_path / "short.ckpt"
    short.write_bytes(path.read_bytes()[:20])
    with pytest.raises(pe.PeError, match="short.ckpt"):
        pe.io.load_params(short)
    with pytest.raises(pe.PeError, match="missing.ckpt"):
        pe.io.load_params(tmp_path / "missing.ckpt")


def pe_client(daemon, *args):
    out = subprocess.run([str(BUILD / "pe-client"), "--socket", daemon.address, "--json", *args],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def model(client):
    prog, loss, _ = mlp()
    m = client.register(prog, model="t_params_file", places="cpu:1", seed=5)
    assert m.init()
    yield m, loss
    client.drop_model("t_params_file")


def test_python_export_imports_and_loads_in_the_daemon(daemon, client, model, tmp_path):
    m, loss = model
    path = tmp_path / "exported.ckpt"
    m.export(path)
    saved = m.state_dict()
    x, y = batch()
    m.run({"x": x, "y": y}, fetch=[loss])  # the values move on
    assert not np.array_equal(m.state_dict()["fc_0.w"], saved["fc_0.w"])
    out = pe_client(daemon, "import", "--model", "t_params_file", "--in", str(path))
    assert out["tensors"] == len(saved)
    assert_same(m.state_dict(), saved)
    # the file is a checkpoint the daemon loads from its state directory
    m.run({"x": x, "y": y}, fetch=[loss])
    ck_path, _ = m.save("probe")
    shutil.copyfile(path, os.path.join(os.path.dirname(ck_path), "from_python.ckpt"))
    m.load("from_python")
    assert_same(m.state_dict(), saved)


def test_pe_client_export_loads_in_python(daemon, client, model, tmp_path):
    m, _ = model
    path = tmp_path / "by_cli.params"
    out = pe_client(daemon, "export", "--model", "t_params_file", "--out", str(path))
    theirs = m.state_dict()
    assert out["tensors"] == len(theirs)
    assert_same(pe.io.load_params(path), theirs)
    m.load_state_dict({"fc_1.w": np.zeros((32, 10), np.float32)})
    assert m.import_params(path, names=["fc_1.w"]) == ["fc_1.w"]
    assert_same(m.state_dict(["fc_1.w"]), {"fc_1.w": theirs["fc_1.w"]})
