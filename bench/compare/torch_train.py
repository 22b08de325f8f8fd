#!/usr/bin/env python3
"""The pe-bench training benchmark, written for PyTorch (CPU, or a GPU with --device cuda).

Why: users compare pe-executord with the frameworks they know, on their own
machine. This script trains the same models as `pe-bench train` (bench/,
client/lib/models.c) on the same data, with the same optimizer, batch size
and thread count, and prints one JSON line with the same keys
(samples_per_sec, train_seconds, test_accuracy, final_loss), so the two lines
can be compared as ratios measured on the same machine in the same minute.
`./pe compare` runs both.

Kept the same as pe-bench: the models, data, normalisation, batch order,
timing and JSON line (compare_common.py's docstring). PyTorch's BatchNorm2d
momentum is 0.1 (the new value's weight), the same running average as pe's 0.9.
Threads: torch.set_num_threads(--threads) (intra-op; OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS are set to the same before torch is imported).
--device cuda: the model and the whole data set on the GPU (pe-bench --places cuda:0
copies each batch in; both fetch each step's loss), cuDNN's default
algorithm choice (torch.backends.cudnn.benchmark off), TF32 off (pe's cuBLAS
and cuDNN calls use FP32 math).
Not the same: the initial weights (PyTorch's defaults, not pe-executord's
Xavier/Kaiming draws), so accuracies agree to about a percent, not exactly.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_common as cc  # noqa: E402

ARGS = cc.parse_args(__doc__, devices=("cpu", "cuda"))
cc.set_thread_env(ARGS.threads)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


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


def main(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x_train, y_train, x_test, y_test = (torch.from_numpy(t).to(dev) for t in cc.load_data(a.data))

    net = {"mlp": Mlp, "cnn": Cnn, "resnet": ResNet}[a.model]().to(dev)
    weights = [p for p in net.parameters() if p.dim() > 1]
    others = [p for p in net.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": weights, "weight_decay": a.decay},
                           {"params": others, "weight_decay": 0.0}], lr=a.lr,
                          momentum=cc.MOMENTUM)

    def step(idx):
        idx = torch.from_numpy(idx).to(dev)
        xb, yb = x_train.index_select(0, idx), y_train.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        return loss.item()

    net.train()
    run = cc.train(a, len(x_train), step)
    net.eval()
    with torch.no_grad():
        accuracy, eval_seconds = cc.evaluate(lambda i, j: net(x_test[i:j]).cpu().numpy(),
                                             x_test, y_test.cpu().numpy())
    cc.emit(a, "pytorch", torch.__version__, run, accuracy, eval_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
