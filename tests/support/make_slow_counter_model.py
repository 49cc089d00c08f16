#!/usr/bin/env python3
"""Builds tests/fixtures/slowcount.pt: slow.pt's loop with a count of the passes it ran, so
that a test can ask the model itself whether a request ran (tests/deadlines.rs: a request
whose deadline passed is not run).

x [-1, 1] float32 (n = x[0, 0]) -> [rows, 2] float32: every row is [passes before this one,
n]; the pass runs n iterations of a 64x64 matmul (about 22 µs each), like slow.pt.

Run with the project's torch venv:
    source scripts/env.sh && $VRAMFORK_PYTHON tests/support/make_slow_counter_model.py
The output is committed, so tests need no Python at run time.
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "fixtures")


class SlowCounter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.passes = 0
        self.register_buffer("m", torch.eye(64) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.flatten()[0].item())
        acc = torch.ones(64, 64)
        for _ in range(n):
            acc = torch.tanh(acc @ self.m + 1.0)
        before = float(self.passes)
        self.passes += 1
        row = torch.tensor([before, float(n)]) + acc.sum() * 0.0
        return row.unsqueeze(0).expand(x.size(0), 2).contiguous()


def main() -> None:
    model = torch.jit.script(SlowCounter())
    path = os.path.join(OUT, "slowcount.pt")
    model.save(path)
    m = torch.jit.load(path)
    assert m(torch.tensor([[3.0]])).tolist() == [[0.0, 3.0]]
    assert m(torch.tensor([[5.0], [1.0]])).tolist() == [[1.0, 5.0], [1.0, 5.0]]
    print(path)


if __name__ == "__main__":
    main()
