#!/usr/bin/env python3
"""Builds the benchmark's "medium" TorchScript model (about 5-20 ms per forward pass on one
core) with a fixed seed, and its app metadata, into the folder given (default bench/tmp);
also the v2 encoding benchmark's "image" model (see Image below) and the batching
benchmark's memory-bound "wide" model (see Wide below).

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


WIDE = 4096


class Wide(torch.nn.Module):
    """The batching benchmark's memory-bound model: four Linear(WIDE, WIDE) layers with ReLU,
    float32, input [-1, WIDE] (~256 MiB of weights for 4096). One row reads every weight once
    for 2 multiply-adds per weight, so a 1-row pass is bound by memory bandwidth and rows
    added to the same pass cost far less than passes of their own (on this project's 2-core
    EPYC, one process: 1 row 11 ms, 16 rows 36 ms): the case where batching matters."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(WIDE, WIDE) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


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
    wide = os.path.join(out, "wide.pt")
    torch.manual_seed(0)
    torch.jit.script(Wide().eval()).save(wide)  # ~256 MiB, about 2 s
    with open(os.path.join(out, "wide.json"), "w") as f:
        json.dump({
            "name": "bench-wide",
            "description": f"benchmark model: four {WIDE}x{WIDE} linear layers, memory bound",
            "version": "1.0",
            "model": "wide.pt",
            "input": {"shape": [-1, WIDE], "dtype": "float32"},
        }, f, indent=2)
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
