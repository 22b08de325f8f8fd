"""The round trip of a tiny program's run through the daemon from Python,
the loop of `pe-bench rtt` (bench/bench_rtt.c) written with peclient: relu
then mean of a [1, 4] feed, registered for evaluation, each run timed on
its own. Prints one JSON line (median, mean and 99th percentile in us).
Usage: python3 bench/python_rtt.py [--count N] ($PE_SOCKET: the daemon)"""
import argparse
import json
import time

import numpy as np

import peclient as pe

ap = argparse.ArgumentParser()
ap.add_argument("--count", type=int, default=2000)
args = ap.parse_args()

x = pe.data("x", [-1, 4])
m = pe.layers.mean(pe.layers.relu(x))
feed = {"x": np.array([[-1, 2, -3, 4]], dtype=np.float32)}
with pe.Client() as c:
    model = c.register(pe.default_main_program(), model="python_rtt", places="cpu:1",
                       for_test=True)
    us = []
    for i in range(-100, args.count):
        t0 = time.perf_counter()
        model.run(feed, fetch=[m])
        if i >= 0:
            us.append((time.perf_counter() - t0) * 1e6)
    model.deregister()
us = np.sort(np.array(us))
print(json.dumps({"bench": "rtt", "client": "python", "count": args.count,
                  "us_median": round(float(us[len(us) // 2]), 1),
                  "us_mean": round(float(us.mean()), 1),
                  "us_p99": round(float(us[int((len(us) - 1) * 0.99)]), 1)}))
