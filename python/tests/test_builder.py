"""The builder: the bytes are the C builder's, every layer and optimizer
builds (and the daemon takes it), errors name what was wrong."""
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
