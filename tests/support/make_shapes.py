"""Plain models of other shapes than the project's fixtures, built on the spot with fixed seeds
(a plain MLP from another project's benchmark served 50-100x slower while every
fixture-based test and bench passed). Used by tests/threads.rs and `scripts/bench --only shapes`.

    make_shapes.py DIR NAME...

writes, for each NAME, DIR/NAME.pt (TorchScript), DIR/NAME.json (app metadata pointing at it)
and DIR/NAME.body (a `POST /` JSON body of one request, deterministic values), and prints
{NAME: {"shape": [...], "label": "..."}} as JSON. NAME is one of SHAPES below.
"""

import json
import os
import sys

import torch
from torch import nn


def mlp(hidden):
    """The plain MLP of other projects' benchmarks: Linear(64, h)-ReLU-Linear(h, h)-ReLU-
    Linear(h, 16); `mlp(256)` is the one inline passes were found with."""
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 16))


class Conv1d(nn.Module):
    """A small 1-D convolutional classifier over 16 channels x 256 samples (audio/sensor
    style): two conv+ReLU layers, average pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(16, 64, 5, padding=2)
        self.c2 = nn.Conv1d(64, 64, 5, padding=2)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.head(x.mean(dim=2))


class Attention(nn.Module):
    """One transformer encoder block (PyTorch's own layer: multi-head self-attention over 32
    tokens of width 128, 4 heads, a 256-wide feed-forward), mean-pooled to a 128-vector."""

    def __init__(self):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(128, 4, dim_feedforward=256, dropout=0.0,
                                                batch_first=True)

    def forward(self, x):
        return self.block(x).mean(dim=1)


SHAPES = {
    "mlp64": (lambda: mlp(64), [1, 64], "MLP 64-64-64-16"),
    "mlp256": (lambda: mlp(256), [1, 64], "MLP 64-256-256-16 (the inline-pass case)"),
    "mlp1024": (lambda: mlp(1024), [1, 64], "MLP 64-1024-1024-16"),
    "conv1d": (Conv1d, [1, 16, 256], "1-D conv net, 16x256 input"),
    "attention": (Attention, [1, 32, 128], "transformer encoder block, 32x128 tokens"),
}


def values(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g).mul(2).sub(1).tolist()


def build(out, name):
    make, shape, label = SHAPES[name]
    torch.manual_seed(0)
    with torch.no_grad():
        torch.jit.script(make().eval()).save(os.path.join(out, f"{name}.pt"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"name": name, "model": f"{name}.pt",
                   "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1] + shape[1:]}]}, f)
    with open(os.path.join(out, f"{name}.body"), "w") as f:
        json.dump({"inputs": values(shape, 1)}, f)
    return {"shape": shape, "label": label}


def main():
    out, names = sys.argv[1], sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    print(json.dumps({n: build(out, n) for n in names}))


if __name__ == "__main__":
    main()
