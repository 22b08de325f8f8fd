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
--loop (how the training loop drives the device; the model, data and updates
are the same in all three):
  sync     eager, the batch's indices copied in and loss.item() every step
           (the default, and the only loop on cpu before this option);
  nosync   eager, each epoch's permutation on the device, the losses summed
           there and read once per epoch: no host sync inside the epoch;
  graph    PyTorch's documented whole-network capture: three eager warm-up
           steps on a side stream, then one training step (gather from the
           static index tensor, forward, backward, optimizer step) captured
           with torch.cuda.graph and replayed for every later full batch, the
           batch's indices copied into the static index tensor first (a short
           last batch runs eagerly: a graph has fixed shapes). SGD with momentum
           captures as it is (an Adam would need capturable=True). On cpu the
           same loop runs without capture (a check of its logic).
Not the same: the initial weights (PyTorch's defaults, not pe-executord's
Xavier/Kaiming draws), so accuracies agree to about a percent, not exactly.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_common as cc  # noqa: E402

ARGS = cc.parse_args(__doc__, devices=("cpu", "cuda"), loops=("sync", "nosync", "graph"))
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


class GraphStep:
    """The --loop graph step: eager warm-up, then one captured training step
    replayed with the batch's indices copied into its static index tensor.
    Captures only on cuda (capture false on cpu: the static step is called
    directly, the same tensors and order)."""

    WARMUP = 3

    def __init__(self, a, dev, eager, opt, net, x_train, y_train):
        self.a, self.dev, self.eager, self.opt, self.net = a, dev, eager, opt, net
        self.x, self.y = x_train, y_train
        self.capture = dev.type == "cuda"
        self.static_idx = torch.zeros(a.batch, dtype=torch.int64, device=dev)
        self.graph = self.static_loss = None
        self.done = 0
        if self.capture:
            self.side = torch.cuda.Stream()

    def static_step(self):
        xb = self.x.index_select(0, self.static_idx)
        yb = self.y.index_select(0, self.static_idx)
        loss = F.cross_entropy(self.net(xb), yb)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def __call__(self, idx):
        if len(idx) != self.a.batch:  # fixed shapes: a short batch runs eagerly
            return self.eager(idx, set_to_none=self.graph is None)  # the graph owns .grad
        if self.done < self.WARMUP:  # warm-up steps are real steps, on a side stream
            self.done += 1
            if not self.capture:
                return self.eager(idx)
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                loss = self.eager(idx)
            torch.cuda.current_stream().wait_stream(self.side)
            return loss
        self.static_idx.copy_(idx, non_blocking=True)
        if self.graph is None and self.capture:
            self.opt.zero_grad(set_to_none=True)  # backward allocates .grad in the graph's pool
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_loss = self.static_step()
        if self.capture:
            self.graph.replay()
            return self.static_loss  # read (loss_sum +=) before the next replay, stream-ordered
        self.opt.zero_grad(set_to_none=True)
        return self.static_step()


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

    def step_nosync(idx, set_to_none=True):
        """One step on device indices; the loss stays on the device."""
        xb, yb = x_train.index_select(0, idx), y_train.index_select(0, idx)
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        return loss.detach()

    def step(idx):
        return step_nosync(torch.from_numpy(idx).to(dev)).item()

    def on_device(perm):
        return torch.from_numpy(perm).to(dev)

    net.train()
    if a.loop == "sync":
        run = cc.train(a, len(x_train), step)
    elif a.loop == "nosync":
        run = cc.train(a, len(x_train), step_nosync, place=on_device)
    else:
        run = cc.train(a, len(x_train), GraphStep(a, dev, step_nosync, opt, net, x_train, y_train),
                       place=on_device)
    net.eval()
    with torch.no_grad():
        accuracy, eval_seconds = cc.evaluate(lambda i, j: net(x_test[i:j]).cpu().numpy(),
                                             x_test, y_test.cpu().numpy())
    cc.emit(a, "pytorch", torch.__version__, run, accuracy, eval_seconds,
            None if a.loop == "sync" else {"loop": a.loop})
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
