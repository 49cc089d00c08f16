#!/usr/bin/env python3
"""Builds the torch.export fixtures (.pt2) the process tests serve, from the same modules and
weights as the TorchScript fixtures of make_models.py, so that a test can hold the two
formats' answers side by side.

Run with the project's torch venv, after make_models.py (it reads mlp.pt's weights):
    source scripts/env.sh && $VRAMFORK_PYTHON scripts/make_pt2_models.py
Writes into tests/fixtures/ and prints what it wrote. The outputs are committed so tests need
no Python at run time:

- mlp.pt2: mlp.pt's module and weights, exported with torch.export.Dim("batch", max=64) for
  the rows of x ([-1, 4] float32 -> [-1, 3]);
- mlp_fixed.pt2: the same, exported without a Dim (the batch is fixed at 2 rows);
- pair.pt2: pair.pt's module (two inputs, a tuple of two outputs), rows dynamic and tied;
- mlp256.pt2: an MLP 64-256-256-16 (random weights, fixed seed), rows up to 1024: large
  enough that a pass of many rows runs on an OpenMP team (the fork tests).

AOTInductor packages are compiled for this machine's CPU (-march=native) and this torch, so
they are not committed: `aoti_package` below makes them, and the tests cache what it makes
(tests/support/make_aoti_package.py). Compiling one takes about a minute on two cores.
"""
import collections
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures")
sys.path.insert(0, HERE)

from make_models import Mlp, Pair  # noqa: E402


class MlpDict(torch.nn.Module):
    """An MLP's scores and their softmax as a dict (an OrderedDict, as torchvision's
    segmentation models return): [-1, 4] float32 -> {"scores": [-1, 3], "probs": [-1, 3]}."""

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, x: torch.Tensor):
        scores = self.mlp(x)
        return collections.OrderedDict([("scores", scores), ("probs", scores.softmax(-1))])


class Mlp256(torch.nn.Module):
    """[-1, 64] float32 -> [-1, 16]."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 16),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def save(program: torch.export.ExportedProgram, name: str, written: list) -> None:
    # Each node's stack trace names the file that defined its module by its path on the
    # machine that exported it: dropped, so that a committed archive names no machine's path.
    for node in program.graph.nodes:
        node.meta.pop("stack_trace", None)
    path = os.path.join(OUT, name)
    torch.export.save(program, path)
    written.append(path)


def aoti_package(module: str, path: str, dynamic_threads: bool) -> None:
    """An AOTInductor package of `module` at `path`: "mlp" (mlp.pt's module and weights,
    Dim("batch", max=64)), "dict" (the same returning a dict, MlpDict) or "mlp256" (as
    mlp256.pt2, rows up to 1024). With
    `dynamic_threads` its kernels take their OpenMP team from the calling thread
    (TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1, what vramfork serves); without, they are compiled as
    torch's default does on a machine of 4 cores: `num_threads(4)` written into the kernels
    (what vramfork refuses)."""
    import torch._inductor.config as inductor

    if module in ("mlp", "dict"):
        model = Mlp().eval()
        model.load_state_dict(torch.jit.load(os.path.join(OUT, "mlp.pt")).state_dict())
        model = MlpDict(model).eval() if module == "dict" else model
        x, rows = torch.zeros(2, 4), torch.export.Dim("batch", max=64)
    else:
        torch.manual_seed(0)
        model = Mlp256().eval()
        # An example of 512 rows: Inductor sizes its parallel loops by the example's sizes.
        x, rows = torch.zeros(512, 64), torch.export.Dim("rows", max=1024)
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: rows}})
    settings = {"cpp.dynamic_threads": dynamic_threads}
    if not dynamic_threads:
        settings["cpp.threads"] = 4
    with inductor.patch(settings):
        torch._inductor.aoti_compile_and_package(program, package_path=path)


def main() -> None:
    written: list = []
    mlp = Mlp().eval()
    mlp.load_state_dict(torch.jit.load(os.path.join(OUT, "mlp.pt")).state_dict())
    x = torch.zeros(2, 4)
    batch = torch.export.Dim("batch", max=64)
    save(torch.export.export(mlp, (x,), dynamic_shapes={"x": {0: batch}}), "mlp.pt2", written)
    save(torch.export.export(mlp, (x,)), "mlp_fixed.pt2", written)

    rows = torch.export.Dim("rows", max=1024)
    features, scale = torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64)
    pair = torch.export.export(
        Pair(), (features, scale),
        dynamic_shapes={"features": {0: rows}, "scale": {0: rows}},
    )
    save(pair, "pair.pt2", written)

    torch.manual_seed(0)
    wide = Mlp256().eval()
    rows = torch.export.Dim("rows", max=1024)
    save(torch.export.export(wide, (torch.zeros(2, 64),), dynamic_shapes={"x": {0: rows}}),
         "mlp256.pt2", written)

    for p in written:
        print(f"wrote {os.path.relpath(p, os.path.dirname(HERE))} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
