#!/usr/bin/env python3
"""The pe-bench training benchmark, written for Apache MXNet 1.9 (CPU, Gluon).

The same contract as torch_train.py (compare_common.py: data, normalisation,
batch order, timed loop, JSON line with pe-bench's keys) in MXNet's idiomatic
API: Gluon HybridBlocks, hybridize()d (one cached graph per model, static
memory), gluon.Trainer; `./pe compare --framework mxnet` runs it from a
virtual environment that holds the pinned wheel (MXNet 1.9.1 needs numpy
< 1.24: it imports numpy.bool, removed in 1.24).

The models are compare_common.py's. MXNet's BatchNorm momentum is the old
value's weight, so 0.9 as in pe; epsilon 1e-5; the resnet's wd 5e-4 is kept
off the biases and batch-norm parameters by wd_mult 0.
The loss is per example (SoftmaxCrossEntropyLoss); trainer.step(batch size)
scales the summed gradient by 1 / batch, so the update is that of the mean.
MXNet's sgd with momentum and wd is PyTorch's SGD with momentum and
weight_decay at a constant learning rate.
Threads: set before mxnet is imported (the engine reads them at start-up):
OMP_NUM_THREADS=--threads, the OpenMP team inside each operator (the wheel's
oneDNN and OpenBLAS kernels), and MXNET_CPU_WORKER_NTHREADS=1, one engine
worker, so operators run one at a time with that team, as in PyTorch and
pe-bench's sequential executor.
Not the same: the initial weights (Xavier uniform, mx.init.Xavier(), the usual
Gluon choice; MXNet's default is uniform(-0.07, 0.07)), so accuracies agree to
about a percent.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_common as cc  # noqa: E402

ARGS = cc.parse_args(__doc__)
cc.set_thread_env(ARGS.threads, MXNET_CPU_WORKER_NTHREADS=1)

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from mxnet.gluon import nn  # noqa: E402


def mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu", in_units=784),
            nn.Dense(128, activation="relu", in_units=256), nn.Dense(10, in_units=128))
    return net


class Cnn(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2D(32, 5, padding=2, in_channels=1, activation="relu")
        self.conv1 = nn.Conv2D(64, 5, padding=2, in_channels=32, activation="relu")
        self.pool = nn.MaxPool2D(2)
        self.fc0 = nn.Dense(1024, activation="relu", in_units=64 * 7 * 7)
        self.drop = nn.Dropout(0.4)
        self.fc1 = nn.Dense(10, in_units=1024)

    def hybrid_forward(self, F, x):
        x = self.pool(self.conv1(self.pool(self.conv0(F.reshape(x, shape=(-1, 1, 28, 28))))))
        return self.fc1(self.drop(self.fc0(x)))


def conv_bn(cin, cout, kernel, stride):
    """A convolution without bias and its batch norm."""
    seq = nn.HybridSequential()
    seq.add(nn.Conv2D(cout, kernel, strides=stride, padding=kernel // 2, use_bias=False,
                      in_channels=cin),
            nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=cout))
    return seq


class Block(nn.HybridBlock):
    """conv-bn-relu-conv-bn plus the shortcut (a strided 1x1 conv + bn when the
    shape changes), then relu: the model file's save / from / add block."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = conv_bn(cin, cout, 3, stride)
        self.b = conv_bn(cout, cout, 3, 1)
        self.proj = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def hybrid_forward(self, F, x):
        y = self.b(F.relu(self.a(x)))
        return F.relu(y + (self.proj(x) if self.proj is not None else x))


class ResNet(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(1, 16, 3, 1)
        self.blocks = nn.HybridSequential()
        self.blocks.add(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.pool = nn.GlobalAvgPool2D()
        self.fc = nn.Dense(10, in_units=64)

    def hybrid_forward(self, F, x):
        x = F.relu(self.stem(F.reshape(x, shape=(-1, 1, 28, 28))))
        return self.fc(self.pool(self.blocks(x)))


def main(a):
    ctx = mx.cpu()
    mx.random.seed(a.seed)
    x_train, y_train, x_test, y_test = cc.load_data(a.data)
    x_train, x_test = mx.nd.array(x_train, ctx=ctx), mx.nd.array(x_test, ctx=ctx)
    y_train = mx.nd.array(y_train, ctx=ctx, dtype="float32")

    net = {"mlp": mlp, "cnn": Cnn, "resnet": ResNet}[a.model]()
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    params = net.collect_params()
    for p in params.values():
        if len(p.shape) <= 1:
            p.wd_mult = 0.0
    trainer = gluon.Trainer(params, "sgd",
                            {"learning_rate": a.lr, "momentum": cc.MOMENTUM, "wd": a.decay})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step(idx):
        idx = mx.nd.array(idx, ctx=ctx, dtype="int32")
        xb, yb = mx.nd.take(x_train, idx), mx.nd.take(y_train, idx)
        with autograd.record():
            loss = loss_fn(net(xb), yb)
        loss.backward()
        trainer.step(len(idx))
        return float(loss.mean().asscalar())

    run = cc.train(a, x_train.shape[0], step)
    accuracy, eval_seconds = cc.evaluate(lambda i, j: net(x_test[i:j]).asnumpy(), x_test, y_test)
    cc.emit(a, "mxnet", mx.__version__, run, accuracy, eval_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
