#!/usr/bin/env python3
"""The pe-bench training benchmark, written for PyTorch (CPU).

Why: users compare pe-executord with the frameworks they know, on their own
machine. This script trains the same models as `pe-bench train` (bench/,
client/lib/models.c) on the same data, with the same optimizer, batch size
and thread count, and prints one JSON line with the same keys
(samples_per_sec, train_seconds, test_accuracy, final_loss), so the two lines
can be compared as ratios measured on the same machine in the same minute.
`./pe compare` runs both.

Kept the same as pe-bench:
  - data: Debian's dataset-fashion-mnist files, pixels / 255, then normalised
    with the training set's mean and standard deviation (one scalar each);
  - mlp: 784-256-128-10, ReLU, momentum SGD lr 0.1, momentum 0.9, batch 128;
  - cnn: conv 5x5 32 (pad 2) ReLU, max pool 2, conv 5x5 64 (pad 2) ReLU,
    max pool 2, fc 1024 ReLU, dropout 0.4, fc 10; momentum SGD lr 0.01,
    momentum 0.9, batch 64;
  - resnet: conf/models/resnet, a 3x3 conv 16 stem and three residual
    blocks (16, 32, 64 channels; conv 3x3, batch norm, ReLU, conv 3x3, batch
    norm, plus the input or its strided 1x1 conv + batch norm projection,
    ReLU), global average pooling, fc 10; convolutions without bias; batch
    norm momentum 0.1 (pe's 0.9 is the same running-average weight), eps
    1e-5; momentum SGD lr 0.05, momentum 0.9, weight decay 5e-4 on the
    weights only (no_decay_1d: none on biases and batch-norm parameters),
    batch 64;
  - the loss is softmax cross-entropy averaged over the batch; each epoch
    visits the training set in a fresh random order; the last batch of an
    epoch may be short;
  - samples_per_sec counts the training steps only (batch gather, forward,
    backward, update, and reading the loss value, which pe-bench fetches
    every step); start-up and evaluation are not timed;
  - final_loss is the mean training loss of the last epoch.
Not the same: the initial weights (PyTorch's defaults, not pe-executord's
Xavier/Kaiming draws), so accuracies agree to about a percent, not exactly.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"
# default batch, learning rate, weight decay (of the weights: none on 1-D parameters)
MODELS = {"mlp": (128, 0.1, 0.0), "cnn": (64, 0.01, 0.0), "resnet": (64, 0.05, 5e-4)}


def read_idx(path):
    """An IDX file (gzip), as a numpy array of its dims."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).reshape(len(images), -1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0, self.fc1, self.fc2 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(F.relu(self.fc0(x)))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv1 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc0, self.fc1 = nn.Linear(64 * 7 * 7, 1024), nn.Linear(1024, 10)
        self.drop = nn.Dropout(0.4)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv0(x)), 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc1(self.drop(F.relu(self.fc0(x.flatten(1)))))


class Block(nn.Module):
    """conv-bn-relu-conv-bn plus the shortcut (a strided 1x1 conv + bn when the
    shape changes), then relu: the model file's save / from / add block."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv0 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(cout)
        self.conv1 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn1(self.conv1(F.relu(self.bn0(self.conv0(x)))))
        return F.relu(y + (self.proj(x) if self.proj is not None else x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x.view(-1, 1, 28, 28))))
        return self.fc(F.adaptive_avg_pool2d(self.blocks(x), 1).flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch", type=int, default=0, help="mlp 128, cnn and resnet 64")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="cap on steps per epoch (0: none)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DATA_DIR)
    a = ap.parse_args()
    default_batch, lr, decay = MODELS[a.model]
    batch = a.batch or default_batch
    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(a.seed)

    x_train, y_train = load(a.data, "train")
    x_test, y_test = load(a.data, "t10k")
    mean, std = x_train.mean().item(), x_train.std().item()
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std

    net = {"mlp": Mlp, "cnn": Cnn, "resnet": ResNet}[a.model]()
    weights = [p for p in net.parameters() if p.dim() > 1]
    others = [p for p in net.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": weights, "weight_decay": decay},
                           {"params": others, "weight_decay": 0.0}], lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(a.seed)
    n = len(x_train)
    steps = samples = 0
    final_loss = 0.0
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        net.train()
        perm = torch.randperm(n, generator=gen)
        loss_sum, ep_samples = 0.0, 0
        for k, i in enumerate(range(0, n, batch)):
            if a.steps and k >= a.steps:
                break
            idx = perm[i:i + batch]
            xb, yb = x_train.index_select(0, idx), y_train.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
            ep_samples += len(idx)
            steps += 1
        samples += ep_samples
        final_loss = loss_sum / max(ep_samples, 1)
    train_seconds = time.perf_counter() - t0

    t1 = time.perf_counter()
    net.eval()
    with torch.no_grad():
        correct = sum((net(x_test[i:i + 1000]).argmax(1) == y_test[i:i + 1000]).sum().item()
                      for i in range(0, len(x_test), 1000))
    eval_seconds = time.perf_counter() - t1
    print(json.dumps({
        "bench": "train", "framework": "pytorch", "framework_version": torch.__version__,
        "model": a.model, "batch": batch, "epochs": a.epochs, "steps": steps, "samples": samples,
        "seed": a.seed, "threads": threads,
        "samples_per_sec": round(samples / train_seconds, 1),
        "train_seconds": round(train_seconds, 3), "eval_seconds": round(eval_seconds, 3),
        "test_accuracy": round(correct / len(x_test), 4), "final_loss": round(final_loss, 5),
        "final_loss_window": "last_epoch",
    }, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
