"""The regression losses beside mse_loss: the daemon's values equal numpy's
on the same predictions, a model trained on them fits, and bad inputs name
the layer, the variables and their shapes."""
import numpy as np
import pytest

from helpers import pe


def numpy_loss(kind, h, y, beta):
    d = np.abs(h.astype(np.float64) - y)
    if kind == "l1":
        return d.mean()
    return np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta).mean()


@pytest.mark.parametrize("kind", ["l1", "smooth_l1"])
def test_regression_losses_match_numpy_and_train(client, kind):
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, 5])
        y = pe.data("y", [-1, 3])
        h = pe.layers.fc(x, 3, name="fc")
        if kind == "l1":
            loss = pe.layers.l1_loss(h, y)
        else:
            loss = pe.layers.smooth_l1_loss(h, y, beta=0.5)
        pe.optimizer.Adam(learning_rate=0.05).minimize(loss)
    assert loss.name == kind + "_loss_0.out"
    m = client.register(prog, model="loss_" + kind)
    assert m.init()
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((16, 5)).astype(np.float32)
    # a linear target: the fc can fit it, through both sides of beta
    ys = (xs @ rng.standard_normal((5, 3))).astype(np.float32)
    first, hv = m.run({"x": xs, "y": ys}, fetch=[loss, h])
    assert abs(first[0] - numpy_loss(kind, hv, ys, 0.5)) <= 1e-5 * max(1.0, first[0])
    for _ in range(150):
        last, = m.run({"x": xs, "y": ys}, fetch=[loss])
    assert np.isfinite(last).all() and last[0] < 0.2 * first[0], (first, last)
    client.drop_model("loss_" + kind)


def test_regression_loss_errors_name_the_problem():
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, 3])
        y = pe.data("y", [-1, 4])
        with pytest.raises(pe.BuilderError,
                           match=r"l1_loss 'l1_loss_0': prediction 'x' \[-1,3\] and label 'y' "
                                 r"\[-1,4\] must be f32 of one shape"):
            pe.layers.l1_loss(x, y)
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("x", [-1, 3])
        with pytest.raises(pe.BuilderError, match=r"smooth_l1_loss .*beta 0 must be positive"):
            pe.layers.smooth_l1_loss(x, x, beta=0)
