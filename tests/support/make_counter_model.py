#!/usr/bin/env python3
"""Builds tests/fixtures/counter.pt: a model that counts the forward passes it has run, so
that a test's first request shows how many passes (and at which shapes) came before it —
the warm-up passes a worker or the template ran (tests/warmup.rs).

x [-1, -1] float32 -> [rows, 5] float32: every row is the same
    [passes before this one, most rows of those passes, fewest rows, most columns, this pass's rows]
(0 for the shape figures when there were none). The counts live in module attributes, which
a forked worker inherits from the template with the rest of its memory.

Run with the project's torch venv:
    source scripts/env.sh && $VRAMFORK_PYTHON tests/support/make_counter_model.py
The output is committed, so tests need no Python at run time.
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "fixtures")


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.passes = 0
        self.max_rows = 0
        self.min_rows = 0
        self.max_cols = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.size(0)
        cols = x.size(1)
        seen = torch.tensor(
            [float(self.passes), float(self.max_rows), float(self.min_rows),
             float(self.max_cols), float(rows)]
        )
        if self.passes == 0 or rows < self.min_rows:
            self.min_rows = rows
        if rows > self.max_rows:
            self.max_rows = rows
        if cols > self.max_cols:
            self.max_cols = cols
        self.passes += 1
        return seen.unsqueeze(0).expand(rows, 5).contiguous()


def main() -> None:
    model = torch.jit.script(Counter())
    path = os.path.join(OUT, "counter.pt")
    model.save(path)
    # Check what the tests rely on: a fresh load counts from 0, passes are remembered.
    m = torch.jit.load(path)
    first = m(torch.zeros(4, 7))
    second = m(torch.zeros(1, 3))
    assert first[0].tolist() == [0, 0, 0, 0, 4], first
    assert second.tolist() == [[1, 4, 4, 7, 1]], second
    assert m(torch.zeros(2, 3))[1].tolist() == [2, 4, 1, 7, 2]
    print(path)


if __name__ == "__main__":
    main()
