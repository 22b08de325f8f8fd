"""What the reference runs of `./pe compare` share (standard library and numpy only).

Each framework's script (torch_train.py, paddle_train.py, mxnet_train.py) keeps
only its model, optimizer and one training step; this module gives all of them
the same command line, data, normalisation, batch order, timed loop,
evaluation and JSON line, so that their figures differ only by the framework.

The contract, the same as `pe-bench train` (bench/bench_train.c):
  - data: Debian's dataset-fashion-mnist files, pixels / 255, then normalised
    with the training set's pixel mean and standard deviation (one scalar
    each, computed in double as pe_dataset_stats does);
  - mlp: 784-256-128-10, ReLU, momentum SGD lr 0.1, momentum 0.9, batch 128;
  - cnn: conv 5x5 32 (pad 2) ReLU, max pool 2, conv 5x5 64 (pad 2) ReLU,
    max pool 2, fc 1024 ReLU, dropout 0.4, fc 10; momentum SGD lr 0.01,
    momentum 0.9, batch 64;
  - resnet: conf/models/resnet, a 3x3 conv 16 stem and three residual
    blocks (16, 32, 64 channels; conv 3x3, batch norm, ReLU, conv 3x3, batch
    norm, plus the input or its strided 1x1 conv + batch norm projection,
    ReLU), global average pooling, fc 10; convolutions without bias; batch
    norm with a running-average weight of 0.9 for the old value (pe's
    momentum 0.9), eps 1e-5; momentum SGD lr 0.05, momentum 0.9, L2 weight
    decay 5e-4 on the weights only (no_decay_1d: none on biases and
    batch-norm parameters), batch 64 (MODELS below);
  - the loss is softmax cross-entropy averaged over the batch; each epoch
    visits the training set in a fresh random order (the same order in every
    framework for a given --seed); the last batch of an epoch may be short;
  - samples_per_sec counts the training steps only (batch gather, forward,
    backward, update, and reading the loss value, which pe-bench fetches every
    step); start-up and evaluation are not timed;
  - final_loss is the mean training loss of the last epoch;
  - the test accuracy is over the whole test set, in chunks of 1000.
"""
import argparse
import gzip
import json
import os
import struct
import time

import numpy as np

DATA_DIR = "/usr/share/datasets/fashion-mnist"
# default batch, learning rate, weight decay (of the weights: none on 1-D parameters)
MODELS = {"mlp": (128, 0.1, 0.0), "cnn": (64, 0.01, 0.0), "resnet": (64, 0.05, 5e-4)}
MOMENTUM = 0.9
EVAL_CHUNK = 1000


def parse_args(doc, devices=("cpu",), loops=None):
    """The common command line; fills in batch, lr, decay and threads (0: all cores).
    devices: what --device accepts (the first is the default); loops: what --loop
    accepts (the first is the default), None: no --loop."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", choices=devices, default=devices[0])
    if loops:
        ap.add_argument("--loop", choices=loops, default=loops[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch", type=int, default=0, help="mlp 128, cnn and resnet 64")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="cap on steps per epoch (0: none)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DATA_DIR)
    a = ap.parse_args()
    default_batch, a.lr, a.decay = MODELS[a.model]
    a.batch = a.batch or default_batch
    a.threads = a.threads or os.cpu_count()
    return a


def set_thread_env(threads, **extra):
    """Thread counts for the OpenMP, MKL and OpenBLAS runtimes, plus the framework's
    own variables (extra). Call before the framework is imported: most read them once."""
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "OPENBLAS_NUM_THREADS": threads, **extra}
    for k, v in env.items():
        os.environ[k] = str(v)


def read_idx(path):
    """An IDX file (gzip), as a numpy array of its dims."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _split(data_dir, split):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    return images.reshape(len(images), -1).astype(np.float32) / 255.0, labels.astype(np.int64)


def load_data(data_dir):
    """(x_train, y_train, x_test, y_test): float32 [n, 784] normalised with the
    training set's mean and population standard deviation, int64 [n] labels."""
    x_train, y_train = _split(data_dir, "train")
    x_test, y_test = _split(data_dir, "t10k")
    mean = x_train.mean(dtype=np.float64)
    std = np.sqrt(max(np.square(x_train, dtype=np.float64).mean() - mean * mean, 0.0))
    mean, std = np.float32(mean), np.float32(std)
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def train(a, n, step, place=None):
    """Runs a.epochs epochs of at most a.steps steps over n examples in batches of
    a.batch; step(idx) trains on the examples idx (int64 numpy) and returns the
    batch's mean loss as a Python float. Only this loop is timed.
    place (optional): moves each epoch's permutation where the step wants its
    indices (a GPU); idx is then a slice of what it returns, and step may return
    the loss as a device scalar: the epoch's sum stays on the device and is read
    once at the end of the epoch (float())."""
    rng = np.random.default_rng(a.seed)
    steps = samples = 0
    final_loss = 0.0
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        perm = rng.permutation(n)
        if place is not None:
            perm = place(perm)
        loss_sum, ep_samples = 0.0, 0
        for k, i in enumerate(range(0, n, a.batch)):
            if a.steps and k >= a.steps:
                break
            idx = perm[i:i + a.batch]
            loss_sum += step(idx) * len(idx)
            ep_samples += len(idx)
            steps += 1
        samples += ep_samples
        final_loss = float(loss_sum) / max(ep_samples, 1)
    return {"steps": steps, "samples": samples, "final_loss": final_loss,
            "train_seconds": time.perf_counter() - t0}


def evaluate(predict, x_test, y_test):
    """(accuracy, seconds); predict(first, last) returns the logits of
    x_test[first:last] as a numpy array (the framework holds its own copy)."""
    t0 = time.perf_counter()
    correct = 0
    for i in range(0, len(x_test), EVAL_CHUNK):
        j = min(i + EVAL_CHUNK, len(x_test))
        correct += int((np.asarray(predict(i, j)).argmax(1) == y_test[i:j]).sum())
    return correct / len(x_test), time.perf_counter() - t0


def emit(a, framework, version, run, accuracy, eval_seconds, extra=None):
    """The JSON line, with pe-bench train --json's keys (and extra's, appended)."""
    print(json.dumps({
        "bench": "train", "framework": framework, "framework_version": version,
        "model": a.model, "device": a.device, "batch": a.batch, "epochs": a.epochs, "steps": run["steps"],
        "samples": run["samples"], "seed": a.seed, "threads": a.threads,
        "samples_per_sec": round(run["samples"] / run["train_seconds"], 1),
        "train_seconds": round(run["train_seconds"], 3), "eval_seconds": round(eval_seconds, 3),
        "test_accuracy": round(accuracy, 4), "final_loss": round(run["final_loss"], 5),
        "final_loss_window": "last_epoch", **(extra or {}),
    }, separators=(",", ":")), flush=True)
