"""A Python training loop over pe.io and the built-in MLP ends where
`pe-client train` ends with the same seed and data order: the same
parameters, bit for bit, and the same last-epoch loss."""
import json
import os
import subprocess

import numpy as np
import pytest

from helpers import BUILD, pe

LIMIT, EPOCHS, SEED = 1024, 2, 3


def fashion_mnist_or_skip():
    path = os.path.join(pe.string(pe.lib.pe_dataset_default_dir()), "train-images-idx3-ubyte.gz")
    if not os.path.exists(path):
        pytest.skip("no Fashion-MNIST (Debian's dataset-fashion-mnist)")
    return pe.io.FashionMNIST(limit=LIMIT)


def test_same_parameters_and_loss_as_pe_client_train(daemon, client):
    fm = fashion_mnist_or_skip()
    out = subprocess.run(
        [str(BUILD / "pe-client"), "--socket", daemon.address, "--json", "train", "--model", "mlp",
         "--model-name", "equiv_cli", "--persistent", "--quiet", "--limit", str(LIMIT),
         "--epochs", str(EPOCHS), "--seed", str(SEED)],
        check=True, capture_output=True, text=True)
    cli = json.loads(out.stdout.strip().splitlines()[-1])
    assert cli["steps_per_request"] == 16 and cli["batch"] == 128

    prog = pe.load_model("mlp")
    m = client.register(prog, model="equiv_py", seed=SEED)
    m.init()
    for epoch in range(1, EPOCHS + 1):
        loss_sum = n = 0
        for xb, yb in fm.train.batches(128, steps=16, seed=SEED, epoch=epoch, client=client):
            losses, = m.run({"image": xb, "label": yb}, fetch=[prog.loss])
            loss_sum += float(losses.astype(np.float64).sum()) * xb.shape[1]
            n += xb.shape[0] * xb.shape[1]
    assert "%.5f" % (loss_sum / n) == "%.5f" % cli["final_loss"]

    mine, theirs = m.state_dict(), client.get_params("equiv_cli")
    assert set(mine) <= set(theirs) and "fc_2.w@VELOCITY" in mine
    for name in mine:
        assert np.array_equal(mine[name], theirs[name]), name
    client.drop_model("equiv_cli")
