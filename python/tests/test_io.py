"""pe.io: ArrayDataset (arrays, .npy/.npz, CSV; shuffled batches from the C
batcher and prefetch thread), Fashion-MNIST, and parameter files (.npz,
safetensors; the daemon's format: test_params_file.py)."""
import json
import os
import struct

import numpy as np
import pytest

from helpers import pe


def dataset(n=10, dim=3):
    x = np.arange(n * dim, dtype=np.float32).reshape(n, dim)
    return pe.io.ArrayDataset(x, np.arange(n)), x


def epoch_order(ds, **kw):
    # A batch is valid until the next one is asked for: copied.
    return np.concatenate([yb.ravel().copy() for _, yb in ds.batches(**kw)])


def test_batches_cover_an_epoch_once():
    ds, x = dataset(10)
    seen = []
    for xb, yb in ds.batches(4, seed=3):
        assert xb.shape[1:] == (3,) and len(xb) == len(yb) <= 4
        assert np.array_equal(xb, x[yb])  # each row travels with its label
        seen += list(yb)
    assert sorted(seen) == list(range(10)) and seen != list(range(10))
    assert [len(yb) for _, yb in ds.batches(4)] == [4, 4, 2]


def test_order_depends_on_seed_and_epoch_only():
    ds, _ = dataset(50)
    a = epoch_order(ds, batch_size=7, seed=11, epoch=2)
    assert np.array_equal(a, epoch_order(ds, batch_size=7, seed=11, epoch=2))
    # The order does not depend on the batch size (pe-client groups batches).
    assert np.array_equal(a, epoch_order(ds, batch_size=5, steps=3, seed=11, epoch=2))
    assert not np.array_equal(a, epoch_order(ds, batch_size=7, seed=11, epoch=3))
    assert not np.array_equal(a, epoch_order(ds, batch_size=7, seed=12, epoch=2))
    assert np.array_equal(epoch_order(ds, batch_size=7, shuffle=False), np.arange(50))


def test_groups_of_steps():
    ds, _ = dataset(23)
    shapes = [(xb.shape, yb.shape) for xb, yb in ds.batches(4, steps=2, shuffle=False)]
    # 23 = 2 groups of 2x4, then 7 rows: one batch of 4 and the short 3.
    assert shapes == [((2, 4, 3), (2, 4))] * 2 + [((1, 4, 3), (1, 4)), ((1, 3, 3), (1, 3))]
    assert len(list(ds.batches(4, steps=2, limit=1))) == 1


def test_example_shape_is_kept():
    x = np.zeros((6, 1, 2, 2), np.uint8)
    ds = pe.io.ArrayDataset(x, np.zeros((6, 1), np.int32))
    xb, yb = next(iter(ds.batches(4)))
    assert xb.shape == (4, 1, 2, 2) and xb.dtype == np.float32 and yb.dtype == np.int64


def test_without_labels():
    ds = pe.io.ArrayDataset(np.ones((5, 2)))
    assert [b.shape for b in ds.batches(2)] == [(2, 2), (2, 2), (1, 2)]


def test_bad_labels_are_named():
    with pytest.raises(ValueError, match=r"y \(4,\).*x \(5, 2\)"):
        pe.io.ArrayDataset(np.ones((5, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="non-integer"):
        pe.io.ArrayDataset(np.ones((2, 2)), np.array([0.5, 1.0]))


def test_from_files(tmp_path):
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    y = np.arange(8) % 2
    np.savez(tmp_path / "d.npz", feats=x, labels=y)
    ds = pe.io.ArrayDataset.from_npz(tmp_path / "d.npz", x="feats", y="labels")
    assert np.array_equal(ds.x, x) and np.array_equal(ds.y, y)
    with pytest.raises(KeyError, match="no array x"):
        pe.io.ArrayDataset.from_npz(tmp_path / "d.npz")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    assert np.array_equal(pe.io.ArrayDataset.from_npy(tmp_path / "x.npy", tmp_path / "y.npy").y, y)
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,label,c\n" + "".join("%g,%g,%d,%g\n" % (r[0], r[1], l, r[2])
                                             for r, l in zip(x, y)))
    ds = pe.io.ArrayDataset.from_csv(csv, label_column=2, skiprows=1)
    assert np.allclose(ds.x, x, atol=1e-5) and np.array_equal(ds.y, y)


def test_split():
    ds, _ = dataset(10)
    a, b = ds.split(0.3, seed=1)
    assert len(a) == 3 and len(b) == 7
    assert sorted(np.concatenate([a.y, b.y])) == list(range(10))


def test_fashion_mnist():
    if not os.path.exists(os.path.join(pe.string(pe.lib.pe_dataset_default_dir()),
                                       "train-images-idx3-ubyte.gz")):
        pytest.skip("no Fashion-MNIST (Debian's dataset-fashion-mnist)")
    fm = pe.io.FashionMNIST(limit=1000)
    assert fm.train.x.shape == (1000, 784) and fm.test.y.shape == (1000,)
    assert abs(float(fm.train.x.mean())) < 0.2 and fm.std > 0
    assert set(np.unique(fm.train.y)) == set(range(10))
    with pytest.raises(OSError, match="nowhere"):
        pe.io.FashionMNIST(dir="/nowhere")


def test_safetensors_round_trip(tmp_path):
    params = {"fc_0.w": np.arange(12, dtype=np.float32).reshape(3, 4),
              "@LR_DECAY_COUNTER@": np.array([7], np.int64),
              "u8": np.array([1, 2, 3], np.uint8), "scalar": np.float64(2.5)}
    path = tmp_path / "p.safetensors"
    pe.io.save_params(path, params)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert n % 8 == 0 and header["fc_0.w"] == {"dtype": "F32", "shape": [3, 4],
                                               "data_offsets": header["fc_0.w"]["data_offsets"]}
    back = pe.io.load_params(path)
    assert set(back) == set(params)
    for k in params:
        assert back[k].dtype == np.asarray(params[k]).dtype and np.array_equal(back[k], params[k])


def test_safetensors_damage_is_named(tmp_path):
    path = tmp_path / "p.safetensors"
    pe.io.save_params(path, {"w": np.zeros(4, np.float32)})
    raw = path.read_bytes()
    (tmp_path / "short.safetensors").write_bytes(raw[:-4])
    with pytest.raises(ValueError, match=r"'w' F32 \[4\]"):
        pe.io.load_params(tmp_path / "short.safetensors")
    (tmp_path / "long.safetensors").write_bytes(raw + b"\0" * 4)
    with pytest.raises(ValueError, match="20 data bytes, the tensors cover 16"):
        pe.io.load_params(tmp_path / "long.safetensors")


def test_npz_round_trip(tmp_path):
    params = {"a.w": np.ones((2, 2), np.float32), "b@VELOCITY": np.zeros(3, np.float32)}
    pe.io.save_params(tmp_path / "p.npz", params)
    back = pe.io.load_params(tmp_path / "p.npz")
    assert set(back) == set(params) and np.array_equal(back["a.w"], params["a.w"])
