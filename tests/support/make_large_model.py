"""Writes a TorchScript model holding one tensor of MB megabytes (a stand-in for real weights:
ResNet-50 is ~100 MB, a BERT-base encoder ~420 MB) and prints {"path": ..., "bytes": ...}.
Its forward takes [-1, 4] float32 and returns [-1, 4]: x + (the weights' first element).

usage: make_large_model.py PATH MB"""
import json
import os
import sys

import torch


class Large(torch.nn.Module):
    def __init__(self, mb: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((mb * 1024 * 256,), 0.5), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w[0]


path, mb = sys.argv[1], int(sys.argv[2])
torch.jit.script(Large(mb)).save(path)
print(json.dumps({"path": path, "bytes": os.path.getsize(path)}))
