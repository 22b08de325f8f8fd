#!/usr/bin/env python3
"""The pe-bench training benchmark, written for PaddlePaddle 2.x (CPU, dygraph).

The same contract as torch_train.py (compare_common.py: data, normalisation,
batch order, timed loop, JSON line with pe-bench's keys) in Paddle's idiomatic
dygraph API (paddle.nn, paddle.optimizer.Momentum); `./pe compare --framework
paddle` runs it from a virtual environment that holds the pinned wheel.

The models are compare_common.py's. Paddle's BatchNorm2D momentum is the old
value's weight, so 0.9 as in pe; epsilon 1e-5; L2Decay(5e-4) on the resnet's
weights only.
Paddle's Momentum is PyTorch's SGD with momentum (velocity = mu * velocity +
grad, param -= lr * velocity), its L2Decay adds decay * param to the gradient.
Threads: OMP_NUM_THREADS and MKL_NUM_THREADS before paddle is imported (the
CPU wheel's matrix products are MKL's, on Intel OpenMP) and
paddle.base.core.set_num_threads(--threads) after (the same runtimes; Paddle
2.6 has no public paddle.set_num_threads). Without OMP_NUM_THREADS, Paddle
sets it to 1 at import; with more it prints a warning meant for its data
parallel mode, which does not apply here. Paddle's CPU kernels are its
defaults: oneDNN stays off in dygraph training (FLAGS_use_mkldnn), as a user
gets it.
Not the same: the initial weights (Paddle's defaults: Xavier for Linear,
Kaiming-style normal for Conv2D), so accuracies agree to about a percent.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_common as cc  # noqa: E402

ARGS = cc.parse_args(__doc__)
cc.set_thread_env(ARGS.threads)

import paddle  # noqa: E402
import paddle.nn as nn  # noqa: E402
import paddle.nn.functional as F  # noqa: E402


class Mlp(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc0, self.fc1, self.fc2 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(F.relu(self.fc0(x)))))


class Cnn(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2D(1, 32, 5, padding=2)
        self.conv1 = nn.Conv2D(32, 64, 5, padding=2)
        self.fc0, self.fc1 = nn.Linear(64 * 7 * 7, 1024), nn.Linear(1024, 10)
        self.drop = nn.Dropout(0.4)

    def forward(self, x):
        x = x.reshape([-1, 1, 28, 28])
        x = F.max_pool2d(F.relu(self.conv0(x)), 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc1(self.drop(F.relu(self.fc0(x.flatten(1)))))


class Block(nn.Layer):
    """conv-bn-relu-conv-bn plus the shortcut (a strided 1x1 conv + bn when the
    shape changes), then relu: the model file's save / from / add block."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv0 = nn.Conv2D(cin, cout, 3, stride=stride, padding=1, bias_attr=False)
        self.bn0 = nn.BatchNorm2D(cout, momentum=0.9, epsilon=1e-5)
        self.conv1 = nn.Conv2D(cout, cout, 3, padding=1, bias_attr=False)
        self.bn1 = nn.BatchNorm2D(cout, momentum=0.9, epsilon=1e-5)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2D(cin, cout, 1, stride=stride, bias_attr=False),
                                      nn.BatchNorm2D(cout, momentum=0.9, epsilon=1e-5))

    def forward(self, x):
        y = self.bn1(self.conv1(F.relu(self.bn0(self.conv0(x)))))
        return F.relu(y + (self.proj(x) if self.proj is not None else x))


class ResNet(nn.Layer):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2D(1, 16, 3, padding=1, bias_attr=False)
        self.bn = nn.BatchNorm2D(16, momentum=0.9, epsilon=1e-5)
        self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x.reshape([-1, 1, 28, 28]))))
        return self.fc(F.adaptive_avg_pool2d(self.blocks(x), 1).flatten(1))


def main(a):
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(a.threads)
    paddle.seed(a.seed)
    x_train, y_train, x_test, y_test = (paddle.to_tensor(t) for t in cc.load_data(a.data))

    net = {"mlp": Mlp, "cnn": Cnn, "resnet": ResNet}[a.model]()
    weights = [p for p in net.parameters() if len(p.shape) > 1]
    others = [p for p in net.parameters() if len(p.shape) <= 1]
    decay = paddle.regularizer.L2Decay
    opt = paddle.optimizer.Momentum(
        learning_rate=a.lr, momentum=cc.MOMENTUM,
        parameters=[{"params": weights, "weight_decay": decay(a.decay)},
                    {"params": others, "weight_decay": decay(0.0)}])

    def step(idx):
        idx = paddle.to_tensor(idx)
        xb, yb = paddle.index_select(x_train, idx), paddle.index_select(y_train, idx)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        opt.clear_grad(set_to_zero=False)
        return float(loss)

    net.train()
    run = cc.train(a, x_train.shape[0], step)
    net.eval()
    with paddle.no_grad():
        accuracy, eval_seconds = cc.evaluate(lambda i, j: net(x_test[i:j]).numpy(),
                                             x_test, y_test.numpy())
    cc.emit(a, "paddlepaddle", paddle.__version__, run, accuracy, eval_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
