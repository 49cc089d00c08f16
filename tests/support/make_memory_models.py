"""Writes the host-memory tests' TorchScript models (tests/host_memory.rs, scripts/bench
--only leak) and prints {"path": ..., "bytes": ...}. Each takes [1, 1] float32.

usage: make_memory_models.py leak PATH
         keeps what it is given: input [[mb]] appends a tensor of mb MB (written, so its
         pages are the worker's own) to a module attribute, never freed; returns [[MB kept]]
       make_memory_models.py scratch PATH MB
         writes MB MB of scratch memory per forward pass (freed after it), whatever the
         input; returns [[x + 1]]"""
import json
import os
import sys
from typing import List

import torch

# 262144 float32 elements make one MB (TorchScript reads no module-level constant).


class Leak(torch.nn.Module):
    kept: List[torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.kept = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mb = int(x.flatten()[0].item())
        if mb > 0:
            self.kept.append(torch.full([mb * 262144], 1.0))
        total = 0
        for t in self.kept:
            total += t.numel()
        return torch.tensor([[total / 262144]])


class Scratch(torch.nn.Module):
    def __init__(self, mb: int) -> None:
        super().__init__()
        self.mb = mb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.full([self.mb * 262144], 1.0)
        return x + (t.sum() / t.numel())


kind, path = sys.argv[1], sys.argv[2]
if kind == "leak":
    model = Leak()
elif kind == "scratch":
    model = Scratch(int(sys.argv[3]))
else:
    sys.exit(f"unknown model {kind!r}: leak or scratch")
torch.jit.script(model).save(path)
print(json.dumps({"path": path, "bytes": os.path.getsize(path)}))
