"""Makes tuple_logits.pt in OUTDIR: a classifier of 4 features into 3 classes (fixed random
weights) traced to return a one-element tuple, `(x @ w + b,)` — the form of a transformers
model traced with torchscript=True, as the README's export recipe does. tests/documents.rs
checks that `POST /` labels its output as v2 answers it.

usage: make_tuple_classifier.py OUTDIR"""
import json
import os
import sys

import torch


class TupleLogits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(47)
        self.w = torch.nn.Parameter(torch.randn(4, 3, generator=g))
        self.b = torch.nn.Parameter(torch.randn(3, generator=g))

    def forward(self, x):
        return (x @ self.w + self.b,)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    model = TupleLogits().eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, (torch.zeros(2, 4),))
    path = os.path.join(out, "tuple_logits.pt")
    traced.save(path)
    back = torch.jit.load(path)
    assert isinstance(back(torch.ones(1, 4)), tuple)
    print(json.dumps({"ok": True, "model": path}))


if __name__ == "__main__":
    main()
