"""The builder: the bytes are the C builder's, every layer and optimizer
builds (and the daemon takes it), errors name what was wrong."""
import os

import numpy as np
import pytest

from helpers import batch, mlp, pe


def build_mlp_as_models_c():
    """pe_models.c's mlp, written with the Python API."""
    prog = pe.Program()
    with pe.program_guard(prog):
        image = pe.data("image", [-1, 784])
        label = pe.data("label", [-1, 1], "int64")
        h = pe.layers.fc(image, 256, act="relu")
        h = pe.layers.fc(h, 128, act="relu")
        logits = pe.layers.fc(h, 10)
        loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, label))
        pe.layers.accuracy(logits, label)
        pe.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(loss)
    return prog


def build_cnn_as_models_c():
    """pe_models.c's cnn, written with the Python API."""
    prog = pe.Program()
    with pe.program_guard(prog):
        image = pe.data("image", [-1, 1, 28, 28])
        label = pe.data("label", [-1, 1], "int64")
        x = pe.layers.conv2d(image, 32, 5, padding=2, act="relu")
        x = pe.layers.pool2d(x, 2)
        x = pe.layers.conv2d(x, 64, 5, padding=2, act="relu")
        x = pe.layers.pool2d(x, 2)
        x = pe.layers.fc(x, 1024, act="relu")
        x = pe.layers.dropout(x, 0.4)
        logits = pe.layers.fc(x, 10)
        loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, label))
        pe.layers.accuracy(logits, label)
        pe.optimizer.Momentum(lr=0.01, momentum=0.9).minimize(loss)
    return prog


@pytest.mark.parametrize("name, build", [("mlp", build_mlp_as_models_c),
                                         ("cnn", build_cnn_as_models_c)])
def test_bytes_equal_the_c_builders(name, build):
    c_bytes = pe.load_model(name).to_bytes()  # pe_model_spec_build, in C
    py_bytes = build().to_bytes()
    assert len(py_bytes) > 1000
    assert py_bytes == c_bytes


def test_bytes_equal_a_model_files():
    text = ("input image 784\nlabel label\nfc 256 act=relu\nfc 128 act=relu\nfc 10\n"
            "loss softmax_with_cross_entropy\naccuracy\noptimizer momentum lr=0.1 mu=0.9\n")
    assert pe.parse_model(text, "mlp").to_bytes() == build_mlp_as_models_c().to_bytes()


def test_model_file_error_names_the_line():
    with pytest.raises(pe.BuilderError, match=r"net:3: unknown layer 'conv3d'"):
        pe.parse_model("input image 784\nlabel label\nconv3d 3\n", "net")


def test_load_model_knows_feeds_and_metrics():
    p = pe.load_model("cnn")
    assert p.feeds == {"image": ("float32", (-1, 1, 28, 28)), "label": ("int64", (-1, 1))}
    assert p.loss == p.loss_name and p.default_batch == 64
    assert p.correct_name.endswith(".correct") and p.optimizer == "momentum"


def test_load_model_knows_sequence_feeds():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = pe.load_model(os.path.join(root, "conf", "models", "charlm"))
    assert p.feeds == {"tokens": ("int64", (-1, 128)), "next": ("int64", (-1, 128))}
    assert p.default_batch == 32 and p.optimizer == "adamw"


def test_every_layer_builds_and_registers(client):
    prog = pe.Program()
    with pe.program_guard(prog):
        img = pe.data("img", [-1, 3, 8, 8])
        label = pe.data("label", [-1, 1], "int64")
        c1 = pe.layers.conv2d(img, 4, 3, padding=1, act="relu",
                              weight_init=pe.initializer.Normal(0, 0.1, seed=5))
        bn = pe.layers.batch_norm(c1, act="relu")
        c2 = pe.layers.conv2d(bn, 4, (3, 3), stride=1, padding=(1, 1), bias=False,
                              weight_init=pe.initializer.Kaiming())
        res = bn + c2  # residual add
        act = pe.layers.relu(pe.layers.tanh(pe.layers.sigmoid(res)))
        pooled = pe.layers.pool2d(act, 2, pool_type="avg", exclusive=False)
        g = pe.layers.pool2d(pooled, 1, global_pooling=True)
        flat = pe.layers.flatten(g, 1)
        d = pe.layers.dropout(flat, 0.1, seed=3)
        logits = pe.layers.fc(d, 5, weight_init=pe.initializer.Xavier(),
                              bias_init=pe.initializer.Constant(0.5))
        probs = pe.layers.softmax(logits)
        ce = pe.layers.mean(pe.layers.cross_entropy(probs, label))
        loss, sm = pe.layers.softmax_with_cross_entropy(logits, label, return_softmax=True)
        total = pe.layers.add(pe.layers.mean(loss), ce, name="total")
        acc = pe.layers.accuracy(logits, label, k=2)
        pe.optimizer.Momentum(learning_rate=0.05).minimize(total)
    assert total.name == "total.out" and acc.correct.name.endswith(".correct")
    m = client.register(prog, model="every_layer", keep=[sm])
    assert m.init()
    x = np.random.default_rng(1).standard_normal((6, 3, 8, 8)).astype(np.float32)
    y = np.arange(6) % 5
    out = m.run({"img": x, "label": y}, fetch=[total, acc, sm])
    assert out[0].shape == (1,) and np.isfinite(out[0]).all()
    assert out[2].shape == (6, 5) and np.allclose(out[2].sum(1), 1, atol=1e-5)
    names = {p["name"] for p in m.params}
    assert {"batch_norm_0.scale", "batch_norm_0.mean", "conv2d_0.w"} <= names
    assert "conv2d_1.b" not in names  # bias=False


@pytest.mark.parametrize("opt, state", [
    (lambda: pe.optimizer.SGD(learning_rate=0.1, weight_decay=1e-4), None),
    (lambda: pe.optimizer.Momentum(lr=0.1, momentum=0.8, use_nesterov=True), "@VELOCITY"),
    (lambda: pe.optimizer.Adam(learning_rate=1e-3, grad_clip=pe.ClipGradByGlobalNorm(1.0)),
     "@MOMENT1"),
    (lambda: pe.optimizer.AdamW(learning_rate=pe.optimizer.lr.CosineAnnealingDecay(
        1e-3, T_max=10, eta_min=1e-5, warmup_steps=2), no_weight_decay="1d"), "@MOMENT2"),
    (lambda: pe.optimizer.SGD(learning_rate=pe.optimizer.lr.MultiStepDecay(0.1, [2, 4])), None),
    (lambda: pe.optimizer.SGD(learning_rate=pe.optimizer.lr.StepDecay(0.1, 2), grad_clip=5.0,
                              weight_decay=1e-3, no_weight_decay=["fc_0.b"]), None),
    (lambda: pe.optimizer.SGD(learning_rate=pe.optimizer.lr.ExponentialDecay(0.1, 0.9)), None),
    (lambda: pe.optimizer.SGD(learning_rate=pe.optimizer.lr.LinearDecay(0.1, 10, 0.01)), None),
    (lambda: pe.optimizer.SGD(learning_rate=pe.optimizer.lr.LinearWarmup(0.1, 3)), None),
])
def test_optimizers_train(client, opt, state):
    prog, loss, _ = mlp(hidden=8, features=16, optimizer=opt())
    m = client.register(prog, model="opt")
    m.init()
    x, y = batch(32, 16)
    first, = m.run({"x": x, "y": y}, fetch=[loss])
    for _ in range(4):
        last, = m.run({"x": x, "y": y}, fetch=[loss])
    assert last[0] < first[0]
    names = set(m.state_dict())
    if state:
        assert any(n.endswith(state) for n in names), names
    client.drop_model("opt")


def test_schedule_moves_the_rate(client):
    sched = pe.optimizer.lr.StepDecay(0.1, step_size=2, gamma=0.5)
    prog, loss, _ = mlp(hidden=8, features=16, optimizer=pe.optimizer.SGD(learning_rate=sched))
    m = client.register(prog, model="sched")
    m.init()
    x, y = batch(8, 16)
    m.run({"x": x, "y": y}, fetch=[], batches=None)
    m.run([{"x": x, "y": y}] * 4)
    assert m.state_dict(["learning_rate"])["learning_rate"][0] == pytest.approx(0.025)
    client.drop_model("sched")


def test_builder_errors_name_the_problem():
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, 4])
        with pytest.raises(pe.BuilderError, match="'nope'"):
            pe.layers.fc(pe.Variable(prog, "nope"), 3)
        # The first error sticks: later calls fail with it.
        with pytest.raises(pe.BuilderError, match="'nope'"):
            pe.layers.fc(x, 3)
    with pytest.raises(pe.BuilderError, match="act 'gelu' unknown"):
        pe.layers.fc(pe.data("z", [-1, 2]), 2, act="gelu")
    with pytest.raises(TypeError, match="float16"):
        pe.data("h", [-1, 2], "float16")
    with pytest.raises(pe.BuilderError, match="learning_rate is required"):
        pe.optimizer.SGD()


def test_program_from_bytes_round_trip():
    prog, loss, _ = mlp()
    data = prog.to_bytes()
    back = pe.Program.from_bytes(data, prog.feeds, loss)
    assert back.to_bytes() == data and back.loss == loss.name and back.optimizer == "momentum"
    with pytest.raises(pe.BuilderError, match="made from bytes"):
        back.builder


def test_default_program_and_guard():
    outer = pe.default_main_program()
    inner = pe.Program()
    with pe.program_guard(inner):
        assert pe.default_main_program() is inner
        v = pe.data("only_here", [-1, 3])
    assert pe.default_main_program() is outer and v.program is inner
    assert "only_here" in inner.feeds and "only_here" not in outer.feeds


T, D = 5, 8


def build_sequence_py():
    """Every sequence layer, with the Python API."""
    prog = pe.Program()
    with pe.program_guard(prog):
        ids = pe.data("ids", [-1, T], "int64")
        mask = pe.data("mask", [-1, 1, T, T])  # feeds share the batch dim
        target = pe.data("target", [-1, T, D])
        e = pe.layers.embedding(ids, (30, D), padding_idx=0, name="emb")
        a, b2 = pe.layers.split(e, [3, 5], dim=2)
        j = pe.layers.concat([b2, a], axis=-1)
        n = pe.layers.layer_norm(j, begin_norm_axis=2)
        g = pe.layers.gelu(n, approximate=True)
        t = pe.layers.transpose(g, [0, 2, 1])
        s = pe.layers.slice(t, [1], [0], [D])
        m = pe.layers.matmul(t, s, transpose_x=True)  # [-1, T, T]
        h = pe.layers.multi_head_attention(pe.layers.matmul(m, g), 2, mask=mask)
        blk = pe.layers.transformer_block(h, 2, 16, mask=mask, name="blk")
        loss = pe.layers.mse_loss(blk, target)
        pe.optimizer.Adam(learning_rate=0.01).minimize(loss)
    return prog, loss


def build_sequence_c():
    """The same program through the C builder's calls."""
    prog = pe.Program()
    b = prog.builder
    L = pe._ffi.lib
    ffi = pe._ffi.ffi
    s = pe._ffi.string
    ids = L.pe_builder_data(b, b"ids", L.PE_B_I64, 2, [-1, T])
    mask = L.pe_builder_data(b, b"mask", L.PE_B_F32, 4, [-1, 1, T, T])
    target = L.pe_builder_data(b, b"target", L.PE_B_F32, 3, [-1, T, D])
    e = L.pe_builder_embedding(b, ids, 30, D, 0, b"emb")
    outs = ffi.new("const char *[]", 2)
    assert L.pe_builder_split(b, e, 2, [3, 5], 2, outs) == 0
    j = L.pe_builder_concat(b, 2, ffi.new("const char *[]", [outs[1], outs[0]]), -1)
    n = L.pe_builder_layer_norm(b, j, 2, 1e-5, ffi.NULL)
    g = L.pe_builder_gelu(b, n, True)
    t = L.pe_builder_transpose(b, g, 3, [0, 2, 1])
    sl = L.pe_builder_slice(b, t, 1, [1], [0], [D])
    m = L.pe_builder_matmul(b, t, sl, True, False, ffi.NULL)
    m = L.pe_builder_matmul(b, m, g, False, False, ffi.NULL)
    h = L.pe_builder_multi_head_attention(b, m, 2, mask, ffi.NULL)
    blk = L.pe_builder_transformer_block(b, h, 2, 16, mask, b"blk")
    loss = L.pe_builder_mse_loss(b, blk, target)
    assert loss != ffi.NULL, s(L.pe_builder_error(b))
    assert L.pe_builder_append_backward(b, loss) == 0
    assert L.pe_builder_adam(b, 0.01, 0.9, 0.999, 1e-8) == 0
    return prog


def test_sequence_layers_bytes_equal_the_c_builders():
    prog, loss = build_sequence_py()
    assert loss.name == "mse_loss_0.out"
    py_bytes = prog.to_bytes()
    assert len(py_bytes) > 1000
    assert py_bytes == build_sequence_c().to_bytes()


def test_attention_fused_or_composed():
    progs = {}
    for fused in (True, False):
        prog = pe.Program()
        with pe.program_guard(prog):
            x = pe.data("x", [-1, T, D])
            h = pe.layers.multi_head_attention(x, 2, fused=fused)
            pe.layers.transformer_block(h, 2, 16, fused=fused)
        progs[fused] = prog.to_bytes()
    assert progs[True].count(b"scaled_dot_product_attention") == 2
    assert b"softmax" not in progs[True]
    assert b"scaled_dot_product_attention" not in progs[False]
    assert progs[False].count(b"softmax") >= 2


def test_transformer_block_trains(client):
    prog, loss = build_sequence_py()
    m = client.register(prog, model="transformer")
    assert m.init()
    rng = np.random.default_rng(3)
    feed = {"ids": rng.integers(1, 30, (4, T)),
            "mask": np.broadcast_to(np.triu(np.full((T, T), -1e9, np.float32), 1), (4, 1, T, T)),
            "target": rng.standard_normal((4, T, D)).astype(np.float32)}
    first, = m.run(feed, fetch=[loss])
    for _ in range(20):
        last, = m.run(feed, fetch=[loss])
    assert np.isfinite(last).all() and last[0] < 0.5 * first[0], (first, last)
    client.drop_model("transformer")


def test_sequence_layer_errors_name_the_problem():
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, 4, 6])
        with pytest.raises(pe.BuilderError, match=r"attention 'attention_0': input 'x' \[-1,4,6\]"):
            pe.layers.multi_head_attention(x, 4)
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, 4, 3])
        with pytest.raises(pe.BuilderError, match=r"split 'split_0': 'x' \[-1,4,3\] dim 2"):
            pe.layers.split(x, 2)
    with pytest.raises(pe.BuilderError, match="slice: axes, starts and ends differ"):
        pe.layers.slice(pe.data("y", [-1, 3]), [1], [0, 1], [2])


def build_embedding_py(is_sparse):
    prog = pe.Program()
    with pe.program_guard(prog):
        ids = pe.data("ids", [-1, T], "int64")
        target = pe.data("target", [-1, T, D])
        e = pe.layers.embedding(ids, (30, D), padding_idx=0, is_sparse=is_sparse, name="emb")
        loss = pe.layers.mse_loss(e, target)
        pe.optimizer.SGD(learning_rate=0.5).minimize(loss)
    return prog, loss


def test_embedding_is_sparse_bytes_equal_the_c_builders():
    prog = pe.Program()
    b, L, ffi = prog.builder, pe._ffi.lib, pe._ffi.ffi
    ids = L.pe_builder_data(b, b"ids", L.PE_B_I64, 2, [-1, T])
    target = L.pe_builder_data(b, b"target", L.PE_B_F32, 3, [-1, T, D])
    o = ffi.new("pe_b_embedding_opts *")
    name = ffi.new("char[]", b"emb")
    o.name, o.is_sparse = name, True
    e = L.pe_builder_embedding_ex(b, ids, 30, D, 0, o)
    loss = L.pe_builder_mse_loss(b, e, target)
    assert L.pe_builder_append_backward(b, loss) == 0
    assert L.pe_builder_sgd(b, 0.5) == 0
    sparse, dense = build_embedding_py(True)[0].to_bytes(), build_embedding_py(False)[0].to_bytes()
    assert sparse == prog.to_bytes()
    assert b"is_sparse" in sparse and b"is_sparse" not in dense


def test_sparse_embedding_trains_as_dense(client):
    """is_sparse=True gives the dense run's table (within summation order);
    the padding row and the rows no batch uses stay."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((30, D)).astype(np.float32)
    batches = [{"ids": rng.integers(0, 20, (4, T)),
                "target": rng.standard_normal((4, T, D)).astype(np.float32)} for _ in range(6)]
    got = {}
    for sparse in (False, True):
        prog, loss = build_embedding_py(sparse)
        name = "emb_sparse" if sparse else "emb_dense"
        m = client.register(prog, model=name, places="cpu:1")
        assert m.init()
        m.load_state_dict({"emb.w": table})
        for feed in batches:
            m.run(feed, fetch=[loss])
        got[sparse] = m.state_dict(["emb.w"])["emb.w"]
        client.drop_model(name)
    np.testing.assert_allclose(got[True], got[False], rtol=1e-6, atol=1e-7)
    assert not np.array_equal(got[True][1:20], table[1:20])
    np.testing.assert_array_equal(got[True][0], table[0])
    np.testing.assert_array_equal(got[True][20:], table[20:])
