"""Two trainer processes sharing one pe-executord, and an evaluation
process that reads one of their models while it trains.

The trainers train the MLP on Fashion-MNIST under their own model names,
one with momentum SGD and one with Adam; the models are persistent, so
they outlive the trainers' sessions. The evaluator registers the
evaluation program under the momentum trainer's model name (it shares
that model's parameters) and prints its test accuracy every few seconds,
then both models' final ones, and drops them.
Usage: python3 two_trainers_and_eval.py [EPOCHS]"""
import multiprocessing as mp
import sys
import time

import numpy as np

import peclient as pe

MODELS = {"fm_momentum": lambda: pe.optimizer.Momentum(learning_rate=0.1, momentum=0.9),
          "fm_adam": lambda: pe.optimizer.Adam(learning_rate=1e-3)}


def mlp(optimizer=None):
    prog = pe.Program()
    with pe.program_guard(prog):
        x = pe.data("image", [-1, 784])
        y = pe.data("label", [-1, 1], "int64")
        h = pe.layers.fc(pe.layers.fc(x, 256, act="relu"), 128, act="relu")
        logits = pe.layers.fc(h, 10)
        loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, y))
        acc = pe.layers.accuracy(logits, y)
        if optimizer:
            optimizer.minimize(loss)
    return prog, loss, acc


def trainer(name, epochs, started):
    prog, loss, _ = mlp(MODELS[name]())
    data = pe.io.FashionMNIST()
    with pe.Client() as c:
        m = c.register(prog, model=name, persistent=True, seed=1)
        m.init(force=True)
        started.set()
        for epoch in range(1, epochs + 1):
            t0, n, losses = time.monotonic(), 0, []
            for xb, yb in data.train.batches(128, steps=16, epoch=epoch, client=c):
                losses.append(m.run({"image": xb, "label": yb}, fetch=[loss])[0])
                n += xb.shape[0] * xb.shape[1]
            print("[%s] epoch %d: mean loss %.4f, %.0f samples/s"
                  % (name, epoch, np.concatenate(losses).mean(), n / (time.monotonic() - t0)),
                  flush=True)


def accuracy(c, name, test, prog, acc):
    ev = c.register(prog, model=name, for_test=True)
    correct = sum(ev.run({"image": xb, "label": yb}, fetch=[acc.correct])[0][0]
                  for xb, yb in test.batches(1000, shuffle=False))
    ev.deregister()
    return correct / len(test)


def evaluator(started, finished):
    prog, _, acc = mlp()
    test = pe.io.FashionMNIST().test
    started.wait()
    t0 = time.monotonic()
    with pe.Client() as c:
        while not finished.wait(2):
            print("[eval] fm_momentum after %4.1f s: test accuracy %.4f"
                  % (time.monotonic() - t0, accuracy(c, "fm_momentum", test, prog, acc)), flush=True)
        for name in MODELS:
            print("[eval] %s final: test accuracy %.4f"
                  % (name, accuracy(c, name, test, prog, acc)), flush=True)
            c.drop_model(name)


if __name__ == "__main__":
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = mp.get_context("spawn")
    started = {name: ctx.Event() for name in MODELS}
    finished = ctx.Event()
    trainers = [ctx.Process(target=trainer, args=(name, epochs, started[name])) for name in MODELS]
    ev = ctx.Process(target=evaluator, args=(started["fm_momentum"], finished))
    for p in trainers + [ev]:
        p.start()
    for p in trainers:
        p.join()
    started["fm_momentum"].set()  # a trainer that failed early: the evaluator still ends
    finished.set()
    ev.join()
    sys.exit(max(p.exitcode for p in trainers + [ev]))
