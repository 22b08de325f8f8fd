"""A plain Python training loop of the MLP on Fashion-MNIST, for the
throughput against `pe-client train --model mlp` on the same daemon
($PE_SOCKET): one epoch, batch 128, one run call per 16 mini-batches,
samples/s over the step loop only (as pe-client counts it).

  --feed numpy: the user's own loop (a numpy permutation, fancy-indexed
                batches; large feeds go through the client's staging region)
  --feed pe.io: pe.io.FashionMNIST batches from libpeclient's prefetch
                thread, in shared memory (passed by reference)
Prints one JSON line. Usage: python3 bench/python_loop.py [--feed numpy|pe.io] [--epochs N]"""
import argparse
import json
import time

import numpy as np

import peclient as pe

ap = argparse.ArgumentParser()
ap.add_argument("--feed", choices=["numpy", "pe.io"], default="numpy")
ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--steps-per-request", type=int, default=16)
args = ap.parse_args()
b, k = args.batch, args.steps_per_request

data = pe.io.FashionMNIST()
x, y = data.train.x, data.train.y
prog = pe.load_model("mlp")
with pe.Client() as c:
    m = c.register(prog, model="python_loop_mlp", seed=1)
    m.init(force=True)
    samples, t0 = 0, time.monotonic()
    for epoch in range(1, args.epochs + 1):
        if args.feed == "pe.io":
            groups = data.train.batches(b, steps=k, seed=1, epoch=epoch, client=c)
        else:
            order = np.random.default_rng(epoch).permutation(len(x))
            groups = ((x[idx].reshape(-1, b, 784), y[idx].reshape(-1, b))
                      for idx in (order[i:i + b * k] for i in range(0, len(x) - b + 1, b * k))
                      if len(idx) % b == 0)
        for xb, yb in groups:
            losses, = m.run({"image": xb, "label": yb}, fetch=[prog.loss])
            samples += xb.shape[0] * xb.shape[1]
    secs = time.monotonic() - t0
    c.drop_model("python_loop_mlp")
print(json.dumps({"feed": args.feed, "samples": samples, "train_seconds": round(secs, 3),
                  "samples_per_sec": round(samples / secs, 1), "final_loss": float(losses[-1][0])}))
