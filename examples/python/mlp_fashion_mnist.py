"""The MLP on Fashion-MNIST through pe-executord ($PE_SOCKET or the default).
Usage: python3 mlp_fashion_mnist.py [EPOCHS]"""
import sys

import numpy as np

import peclient as pe

x = pe.data("image", [-1, 784])
y = pe.data("label", [-1, 1], "int64")
h = pe.layers.fc(x, 256, act="relu")
h = pe.layers.fc(h, 128, act="relu")
logits = pe.layers.fc(h, 10)
loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, y))
acc = pe.layers.accuracy(logits, y)
pe.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(loss)

data = pe.io.FashionMNIST()  # standardised with the training split's statistics
with pe.Client() as c:
    train = c.register(pe.default_main_program(), model="fashion_mlp")
    test = c.register(pe.default_main_program(), model="fashion_mlp", for_test=True)
    train.init()
    for epoch in range(1, (int(sys.argv[1]) if len(sys.argv) > 1 else 2) + 1):
        losses = [train.run({"image": xb, "label": yb}, fetch=[loss])[0]
                  for xb, yb in data.train.batches(128, steps=16, epoch=epoch, client=c)]
        print("epoch %d: mean loss %.4f" % (epoch, np.concatenate(losses).mean()))
    correct = sum(test.run({"image": xb, "label": yb}, fetch=[acc.correct])[0][0]
                  for xb, yb in data.test.batches(500, shuffle=False))
    print("test accuracy %.4f" % (correct / len(data.test)))
