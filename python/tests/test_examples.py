"""The examples in examples/python run to the end against a daemon of
their own and print the accuracies their docstrings promise (short
trainings: bounds far below what full runs reach, far above chance)."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from helpers import SOURCE, Daemon

EXAMPLES = SOURCE / "examples" / "python"
FASHION = os.path.isdir(os.environ.get("PE_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))


@pytest.fixture(scope="module")
def example_daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("examples"))
    yield d
    d.stop()


def run_example(daemon, name, *args):
    env = dict(os.environ, PE_SOCKET=daemon.address,
               PYTHONPATH=os.pathsep.join([str(SOURCE / "python"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, "%s failed (%d):\n%s\n%s" % (name, p.returncode, p.stdout, p.stderr)
    return p.stdout


def accuracies(out):
    return [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]


def test_sklearn_digits(example_daemon):
    pytest.importorskip("sklearn")
    acc = accuracies(run_example(example_daemon, "sklearn_digits.py", 10))
    assert len(acc) == 1 and acc[0] > 0.9, acc


@pytest.mark.skipif(not FASHION, reason="no Fashion-MNIST (dataset-fashion-mnist)")
def test_mlp_fashion_mnist(example_daemon):
    acc = accuracies(run_example(example_daemon, "mlp_fashion_mnist.py", 1))
    assert len(acc) == 1 and acc[0] > 0.8, acc


@pytest.mark.skipif(not FASHION, reason="no Fashion-MNIST (dataset-fashion-mnist)")
def test_two_trainers_and_eval(example_daemon):
    out = run_example(example_daemon, "two_trainers_and_eval.py", 1)
    assert re.search(r"fm_momentum", out) and re.search(r"fm_adam", out), out
    assert all(a > 0.7 for a in accuracies(out)), out


@pytest.mark.skipif(not FASHION, reason="no Fashion-MNIST (dataset-fashion-mnist)")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="no PyTorch (python3-torch; ./pe compare installs it)")
def test_torch_interop(example_daemon, tmp_path):
    out = run_example(example_daemon, "torch_interop.py", 1, tmp_path / "mlp.safetensors")
    pe_acc, torch_acc = accuracies(out)
    assert pe_acc > 0.8 and abs(pe_acc - torch_acc) <= 3e-4, out
