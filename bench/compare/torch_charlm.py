#!/usr/bin/env python3
"""conf/models/charlm, the character transformer, in PyTorch: validation bits per char.

Why: a reference figure for `pe-client train --model conf/models/charlm --data
FILE.txt` on the same text, from a framework users know. The script prints one
JSON line like the other compare scripts (compare_common.py), with the
validation loss in bits per character.

Kept the same as pe-executord (conf/models/README.md, "Sequence models"):
  - data: the bytes of the text are the ids (vocabulary 256); the first 90% is
    the training text, the last 10% the validation text; an example is a
    window of T + 1 bytes, its first T the tokens and its last T the targets;
    training windows start at uniform random offsets of the training text
    (numpy's default_rng(--seed));
  - model: byte embedding [256, 128] plus a learned position table [128, 128];
    4 pre-LN blocks (h = x + attention(layer_norm(x)), out = h +
    fc(gelu(fc(layer_norm(h)))), 4 heads, inner size 512, exact erf gelu,
    causal mask -1e9 added to the scores scaled by 1/sqrt(32), q, k, v and
    output projections with bias); a final layer_norm and an fc to 256 logits;
    layer_norm epsilon 1e-5;
  - initialisation as pe's builder: every fc weight and both tables
    Xavier-uniform, limit sqrt(6 / (fan_in + fan_out)) (a table's fan_in is its
    rows), biases 0, layer-norm scale 1 and shift 0;
  - loss: softmax cross-entropy averaged over batch and positions (nats);
  - AdamW lr 1e-3, betas (0.9, 0.99), eps 1e-8, decoupled weight decay 0.1 on
    the parameters of 2 or more dims only (pe's no_decay_1d), batch 32;
  - schedule (proto/program.proto, LrSchedule): with s the updates done, lr *
    (s + 1) / warmup while s < warmup, then min_lr + (lr - min_lr) * (1 +
    cos(pi * min(t, D) / D)) / 2 with t = s - warmup and D = steps - warmup - 1
    (the last step runs at min_lr 1e-4);
  - validation: the mean loss of the windows at offsets 0, T, 2T, ... of the
    validation text (each byte after the first predicted once), divided by ln 2.
Not the same: the random draws (initial weights, window offsets), so the
figures agree to the noise of a run, not exactly.

--data: a file, or a directory whose regular files (by sorted name, without
fortune's .dat and .u8 index files) are read one after another; the default is
Debian's `fortunes` package (/usr/share/games/fortunes; `./pe compare` installs
it). For pe: `cat` the same files into one FILE.txt.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_common as cc  # noqa: E402

DATA = "/usr/share/games/fortunes"
T, VOCAB, DIM, HEADS, FFN, LAYERS = 128, 256, 128, 4, 512, 4
LR, MIN_LR, BETAS, EPS, DECAY, BATCH = 1e-3, 1e-4, (0.9, 0.99), 1e-8, 0.1, 32


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DATA, help="a text file or a directory of them")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--eval-windows", type=int, default=0,
                    help="validate on the first N windows only (0: all)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.steps < 1 or not 0 <= a.warmup < a.steps:
        ap.error(f"--warmup {a.warmup} must be in [0, --steps {a.steps})")
    a.threads = a.threads or os.cpu_count()
    return a


ARGS = parse_args()
cc.set_thread_env(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def read_text(path):
    """The bytes of a file, or of a directory's text files in sorted name order."""
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            return f.read()
    parts = []
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        if os.path.isfile(p) and not name.endswith((".dat", ".u8")):
            with open(p, "rb") as f:
                parts.append(f.read())
    return b"".join(parts)


def xavier(w, fan_in, fan_out):
    lim = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(w, -lim, lim)


class Fc(nn.Linear):
    """pe's fc: Xavier-uniform weight, zero bias."""

    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out)
        xavier(self.weight, n_in, n_out)
        nn.init.zeros_(self.bias)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.out = (Fc(DIM, DIM) for _ in range(4))
        self.ffn1, self.ffn2 = Fc(DIM, FFN), Fc(FFN, DIM)

    def attention(self, x, mask):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, HEADS, d // HEADS).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d // HEADS)) + mask
        ctx = torch.softmax(scores, -1) @ v
        return self.out(ctx.transpose(1, 2).reshape(b, t, d))

    def forward(self, x, mask):
        h = x + self.attention(self.ln1(x), mask)
        return h + self.ffn2(F.gelu(self.ffn1(self.ln2(h))))


class CharLm(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Parameter(torch.empty(VOCAB, DIM))
        self.pos = nn.Parameter(torch.empty(T, DIM))
        xavier(self.embed, VOCAB, DIM)
        xavier(self.pos, T, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = Fc(DIM, VOCAB)
        self.register_buffer("mask", torch.triu(torch.full((T, T), -1e9), diagonal=1))

    def forward(self, ids):
        x = self.embed[ids] + self.pos
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln(x))


def lr_at(s, a):
    if s < a.warmup:
        return LR * (s + 1) / a.warmup
    d = a.steps - a.warmup - 1
    t = s - a.warmup
    return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * min(t, d) / max(d, 1))) / 2


def windows(data, offsets):
    """tokens and targets (int64 [n, T]) of the windows at offsets."""
    idx = offsets[:, None] + np.arange(T + 1)[None, :]
    w = torch.from_numpy(data[idx].astype(np.int64))
    return w[:, :T], w[:, 1:]


def main(a):
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    data = np.frombuffer(read_text(a.data), dtype=np.uint8)
    n_train = len(data) * 9 // 10
    train, val = data[:n_train], data[n_train:]
    if len(val) < T + 1:
        sys.exit(f"torch_charlm: {a.data}: {len(data)} bytes, too few for a validation window")
    net = CharLm()
    n_params = sum(p.numel() for p in net.parameters())
    decay = [p for p in net.parameters() if p.dim() > 1]
    others = [p for p in net.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": DECAY},
                             {"params": others, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    rng = np.random.default_rng(a.seed)
    losses = []
    net.train()
    t0 = time.perf_counter()
    for s in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, a)
        x, y = windows(train, rng.integers(0, len(train) - T, size=a.batch))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    train_seconds = time.perf_counter() - t0
    net.eval()
    t0 = time.perf_counter()
    offsets = np.arange(0, len(val) - T, T)
    if a.eval_windows:
        offsets = offsets[:a.eval_windows]
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(offsets), 64):
            x, y = windows(val, offsets[i:i + 64])
            total += F.cross_entropy(net(x).reshape(-1, VOCAB), y.reshape(-1),
                                     reduction="sum").item()
    val_loss = total / (len(offsets) * T)
    tail = losses[-max(1, a.steps // 10):]
    print(json.dumps({
        "bench": "train", "framework": "pytorch", "framework_version": torch.__version__,
        "model": "charlm", "device": "cpu", "data": a.data, "data_bytes": len(data),
        "parameters": n_params, "batch": a.batch, "steps": a.steps, "warmup": a.warmup,
        "seed": a.seed, "threads": a.threads,
        "samples_per_sec": round(a.steps * a.batch / train_seconds, 1),
        "train_seconds": round(train_seconds, 3),
        "eval_seconds": round(time.perf_counter() - t0, 3),
        "final_loss": round(sum(tail) / len(tail), 5), "final_loss_window": "last_10pct_steps",
        "val_windows": len(offsets), "val_loss": round(val_loss, 5),
        "val_bits_per_char": round(val_loss / math.log(2), 4),
    }, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
