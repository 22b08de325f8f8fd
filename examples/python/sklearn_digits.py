"""Training on your own data: scikit-learn's bundled digits (8x8 images,
1797 examples; Debian's python3-sklearn), a random 80/20 split, an MLP
with Adam and a cosine schedule, the test accuracy at the end.
Usage: python3 sklearn_digits.py [EPOCHS]"""
import sys

import numpy as np
from sklearn.datasets import load_digits

import peclient as pe

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
BATCH = 32

digits = load_digits()
x = digits.data.astype(np.float32) / 16.0  # pixels 0..16
train, test = pe.io.ArrayDataset(x, digits.target).split(0.8, seed=0)
steps = EPOCHS * -(-len(train) // BATCH)

image = pe.data("pixels", [-1, 64])
label = pe.data("digit", [-1, 1], "int64")
h = pe.layers.fc(image, 128, act="relu")
h = pe.layers.dropout(h, 0.2)
logits = pe.layers.fc(h, 10)
loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, label))
acc = pe.layers.accuracy(logits, label)
pe.optimizer.AdamW(learning_rate=pe.optimizer.lr.CosineAnnealingDecay(3e-3, T_max=steps),
                   weight_decay=1e-4, no_weight_decay="1d").minimize(loss)

with pe.Client() as c:
    model = c.register(pe.default_main_program(), model="digits", seed=1)
    evaluate = c.register(pe.default_main_program(), model="digits", for_test=True)
    model.init()
    for epoch in range(1, EPOCHS + 1):
        losses = [model.run({"pixels": xb, "digit": yb}, fetch=[loss])[0][0]
                  for xb, yb in train.batches(BATCH, seed=1, epoch=epoch)]
        if epoch % 10 == 0:
            print("epoch %d: mean loss %.4f" % (epoch, np.mean(losses)))
    correct, = evaluate.run({"pixels": test.x, "digit": test.y}, fetch=[acc.correct])
    print("test accuracy %.4f (%d of %d digits)" % (correct[0] / len(test), correct[0], len(test)))
