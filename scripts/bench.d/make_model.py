#!/usr/bin/env python3
"""Builds the benchmark's "medium" TorchScript model (about 5-20 ms per forward pass on one
core) with a fixed seed, and its app metadata, into the folder given (default bench/tmp);
also the v2 encoding benchmark's "image" model (see Image below).

Input [-1, 16] float32 (small, so the JSON request stays cheap); inside, the input row is
broadcast to 256 rows and pushed through four 512x512 linear layers, so the work is compute
bound (about 0.27 GFLOP per pass) rather than request-size bound. Output [-1, 8].
"""
import json
import os
import sys

import torch


class Medium(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, 512)
        self.register_buffer("pos", torch.randn(256, 512) * 0.1)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(512, 512) for _ in range(4)])
        self.out = torch.nn.Linear(512, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))  # [b, 512]
        h = h.unsqueeze(1) + self.pos  # [b, 256, 512]
        for layer in self.layers:
            h = torch.relu(layer(h))
        return self.out(h.mean(dim=1))  # [b, 8]


class Image(torch.nn.Module):
    """The v2 encoding benchmark's model: an image batch [-1, 3, 224, 224] float32 reduced to
    its per-channel means [-1, 3], so that a request's cost is its transport, not the model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=[2, 3])


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "bench/tmp"
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    m = torch.jit.script(Medium().eval())
    path = os.path.join(out, "medium.pt")
    m.save(path)
    meta = {
        "name": "bench-medium",
        "description": "benchmark model: ~5-20 ms per forward pass on one core",
        "version": "1.0",
        "model": "medium.pt",
        "input": {"shape": [-1, 16], "dtype": "float32"},
    }
    with open(os.path.join(out, "medium.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(path)
    torch.jit.script(Image()).save(os.path.join(out, "image.pt"))
    with open(os.path.join(out, "image.json"), "w") as f:
        json.dump({
            "name": "bench-image",
            "description": "benchmark model: per-channel means of a 224x224 RGB image",
            "model": "image.pt",
            "input": {"shape": [-1, 3, 224, 224], "dtype": "float32"},
        }, f, indent=2)


if __name__ == "__main__":
    main()
