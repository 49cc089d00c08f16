#!/usr/bin/env python3
"""One AOTInductor model's own loop against its TorchScript export: the median microseconds
per pass (median of 5 runs of 300 passes, after 20) of the MLP 64-256-256-16 of
make_pt2_models.py, traced with torch.jit.trace and as each package given, at THREADS torch
threads and ROWS rows. Shows what a thread count compiled into a package's kernels costs
(docs/performance.md). Python's call overhead is in every figure alike.

usage: $VRAMFORK_PYTHON scripts/bench.d/aoti_threads.py THREADS ROWS LABEL=PACKAGE...
  e.g. dynamic=mlp256-dynamic.pt2 default=mlp256-default.pt2, made by
  tests/support/make_aoti_package.py PATH mlp256 dynamic|default
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from make_pt2_models import Mlp256  # noqa: E402


def per_pass_us(f, n=300):
    for _ in range(20):
        f()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def main():
    threads, rows = int(sys.argv[1]), int(sys.argv[2])
    packages = [a.split("=", 1) for a in sys.argv[3:]]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Mlp256().eval()
    x = torch.randn(rows, 64)
    scripted = torch.jit.trace(model, torch.zeros(2, 64))
    line = [f"threads={threads} rows={rows}"]
    with torch.no_grad():
        line.append(f"torchscript {per_pass_us(lambda: scripted(x)):.0f} us")
        for label, path in packages:
            run = torch._inductor.aoti_load_package(path)
            line.append(f"aoti {label} {per_pass_us(lambda: run(x)):.0f} us")
    print(", ".join(line))


if __name__ == "__main__":
    main()
