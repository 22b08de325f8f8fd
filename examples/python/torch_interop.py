"""pe-trained weights in PyTorch: the MLP trains on Fashion-MNIST through
pe-executord, its parameters go to a .safetensors file, a torch.nn.Module
loads them and classifies the test set. Both accuracies are printed; the
script fails if they differ by more than a few images (float sums in
another order can flip a near tie, nothing more).
Usage: python3 torch_interop.py [EPOCHS] [FILE.safetensors]"""
import sys
import tempfile

import numpy as np
import torch

import peclient as pe

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
PATH = sys.argv[2] if len(sys.argv) > 2 else tempfile.mktemp(suffix=".safetensors")

x = pe.data("image", [-1, 784])
y = pe.data("label", [-1, 1], "int64")
h = pe.layers.fc(x, 256, act="relu", name="fc1")
h = pe.layers.fc(h, 128, act="relu", name="fc2")
logits = pe.layers.fc(h, 10, name="fc3")
loss = pe.layers.mean(pe.layers.softmax_with_cross_entropy(logits, y))
acc = pe.layers.accuracy(logits, y)
pe.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(loss)

data = pe.io.FashionMNIST()
with pe.Client() as c:
    train = c.register(pe.default_main_program(), model="torch_interop_mlp", seed=1)
    test = c.register(pe.default_main_program(), model="torch_interop_mlp", for_test=True)
    train.init()
    for epoch in range(1, EPOCHS + 1):
        for xb, yb in data.train.batches(128, steps=16, epoch=epoch, client=c):
            train.run({"image": xb, "label": yb}, fetch=[loss])
    pe_correct = sum(int(test.run({"image": xb, "label": yb}, fetch=[acc.correct])[0][0])
                     for xb, yb in data.test.batches(500, shuffle=False))
    train.export(PATH)
    train.deregister()
    test.deregister()

# PyTorch's side: only the file. pe's fc weight is [in, out] (x @ W);
# nn.Linear keeps [out, in] (x @ W.T).
params = pe.io.load_params(PATH)
net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                          torch.nn.Linear(256, 128), torch.nn.ReLU(),
                          torch.nn.Linear(128, 10))
state = {}
for i, layer in ((1, 0), (2, 2), (3, 4)):
    state["%d.weight" % layer] = torch.from_numpy(params["fc%d.w" % i].T.copy())
    state["%d.bias" % layer] = torch.from_numpy(params["fc%d.b" % i].reshape(-1).copy())
net.load_state_dict(state)
net.eval()
with torch.no_grad():
    images = torch.from_numpy(np.ascontiguousarray(data.test.x, dtype=np.float32))
    labels = torch.from_numpy(np.asarray(data.test.y).reshape(-1))
    torch_correct = int((net(images).argmax(1) == labels).sum())

n = len(data.test)
print("pe-executord test accuracy %.4f (%d of %d)" % (pe_correct / n, pe_correct, n))
print("PyTorch      test accuracy %.4f (%d of %d)" % (torch_correct / n, torch_correct, n))
if abs(pe_correct - torch_correct) > 3:
    sys.exit("the accuracies differ by %d images" % abs(pe_correct - torch_correct))
