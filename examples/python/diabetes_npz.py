"""A regression through pe-client: scikit-learn's bundled diabetes data
(442 patients, ten features; Debian's python3-sklearn) written as the .npz
that conf/models/diabetes reads (arrays x and y, named after its feeds; a
random fifth as the test/ arrays), features and target standardised with
the training rows' statistics. Then:
  pe-client train --model conf/models/diabetes --data diabetes.npz --epochs 20
prints the test split's mean squared error in units of the target's
variance (about 1: no better than predicting the mean): 0.52 (pe-client
0.1.0, seed 1; scikit-learn's LinearRegression on the same split: 0.48).
Usage: python3 diabetes_npz.py [OUT.npz]"""
import sys

import numpy as np
from sklearn.datasets import load_diabetes

out = sys.argv[1] if len(sys.argv) > 1 else "diabetes.npz"
x, y = load_diabetes(return_X_y=True)
order = np.random.default_rng(0).permutation(len(x))
test, train = order[: len(x) // 5], order[len(x) // 5 :]
mx, sx = x[train].mean(0), x[train].std(0)
my, sy = y[train].mean(), y[train].std()
xs, ys = (x - mx) / sx, (y - my) / sy
np.savez(out, **{"x": xs[train], "y": ys[train], "test/x": xs[test], "test/y": ys[test]})
print("%s: %d training and %d test rows (f64, read as f32)" % (out, len(train), len(test)))
