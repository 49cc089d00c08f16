#!/usr/bin/env python3
"""Builds the small TorchScript fixtures the worker and process tests use.

Run with the project's torch venv:  source scripts/env.sh && $VRAMFORK_PYTHON scripts/make_models.py
Writes into tests/fixtures/ (fixed seeds, so the files are reproducible) and prints what it wrote.
The outputs are committed so tests need no Python at run time.
"""
import json
import os
from typing import List, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures")


class Mlp(torch.nn.Module):
    """[-1, 4] float32 -> [-1, 3]."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 8)
        self.l2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


class Slow(torch.nn.Module):
    """Input [[n]]: runs n iterations of a fixed 64x64 matmul loop; returns [[n]].

    Run time grows linearly with n, so a test picks n to make a request as slow as it needs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("m", torch.eye(64) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.flatten()[0].item())
        acc = torch.ones(64, 64)
        for _ in range(n):
            acc = torch.tanh(acc @ self.m + 1.0)
        return x + acc.sum() * 0.0


class Fail(torch.nn.Module):
    """Raises when the inputs sum to a negative number, else returns inputs * 2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() < 0):
            raise ValueError("negative input sum is not allowed by fail.pt")
        return x * 2


class Tuple2(torch.nn.Module):
    """Returns a tuple (x + 1, x.sum()) and so exercises tuple/scalar-tensor outputs."""

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x.sum()


class Alloc(torch.nn.Module):
    """Input [[mb]]: allocates a tensor of that many MB on the input's device; returns its MB."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mb = int(x.flatten()[0].item())
        t = torch.ones(mb * 1024 * 256, dtype=torch.float32, device=x.device)
        return (t.sum() / (1024 * 256)).reshape(1, 1)


class FakeCudaOom(torch.nn.Module):
    """Input with a positive sum: raises the message PyTorch's CUDA caching allocator raises
    when a GPU is out of memory, so the 507 path (answer, then the worker recycles) is tested
    on machines without a GPU. Other inputs are returned as they are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            raise RuntimeError(
                "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity "
                "of 79.19 GiB of which 1.00 GiB is free. (simulated by tests/fixtures/oom.pt)"
            )
        return x


class Scalars(torch.nn.Module):
    """Returns a list of outputs: a tensor, an int, a float and a bool (output conversion)."""

    def forward(self, x: torch.Tensor) -> Tuple[List[torch.Tensor], int, float, bool]:
        return [x, x * 0], int(x.numel()), float(x.sum().item()), bool(x.numel() > 0)


class Pair(torch.nn.Module):
    """Two inputs, two outputs: forward(features [-1, 3] float32, scale [-1] int64) returns
    (features scaled row by row, each row's sum plus its scale as float64)."""

    def forward(self, features: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        scaled = features * scale.unsqueeze(1).to(features.dtype)
        total = features.sum(dim=1).to(torch.float64) + scale.to(torch.float64)
        return scaled, total


class Docs(torch.nn.Module):
    """A text-document model: forward(docs: List[str]) returns, per document, its length in
    characters and in words ([n, 2] int64), and its first word in upper case (List[str])."""

    def forward(self, docs: List[str]) -> Tuple[torch.Tensor, List[str]]:
        counts: List[List[int]] = []
        firsts: List[str] = []
        for d in docs:
            words = d.split()
            counts.append([len(d), len(words)])
            firsts.append(words[0].upper() if len(words) > 0 else "")
        if len(counts) == 0:
            return torch.zeros(0, 2, dtype=torch.int64), firsts
        return torch.tensor(counts, dtype=torch.int64), firsts


class RowFail(torch.nn.Module):
    """[-1, 4] float32: raises when any element is 13, else returns x * 2 + 1, so that a test
    can check each row of a batched answer and fail one request of a batch on purpose."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x == 13).any()):
            raise ValueError("row value 13 is refused by rowfail.pt")
        return x * 2 + 1


class FakeCudaError(torch.nn.Module):
    """[-1, 4] float32: a row starting with 7 raises the text of a CUDA error that leaves the
    context usable (libtorch 2.11's for cudaErrorInvalidConfiguration), a row starting with
    666 the text of a sticky one (cudaErrorIllegalAddress); else x * 2 + 1. The error
    classes (the worker serves on, or ends) are tested on machines without a GPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The texts are joined at run time: the interpreter's traceback quotes the source
        # around the failing line, and a literal of the other class there would be read too.
        first = x[:, 0]
        if bool((first == 666).any()):
            raise RuntimeError("CUDA error: " + "an illegal memory " + "access was encountered")
        if bool((first == 7).any()):
            raise RuntimeError("CUDA error: " + "invalid configuration " + "argument")
        return x * 2 + 1


def save(module: torch.nn.Module, name: str, written: List[str]) -> None:
    path = os.path.join(OUT, name)
    torch.jit.script(module).save(path)
    written.append(path)


def write_json(name: str, doc: object, written: List[str]) -> None:
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    written.append(path)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(1234)
    written: List[str] = []

    mlp = Mlp().eval()
    save(mlp, "mlp.pt", written)
    inputs = [
        [[0.0, 0.0, 0.0, 0.0]],
        [[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 2.5, -3.0]],
        [[0.25, -0.75, 1.5, 10.0], [3.0, 3.0, 3.0, 3.0], [-2.0, -2.0, 5.0, 0.125]],
    ]
    with torch.no_grad():
        cases = [{"inputs": x, "outputs": mlp(torch.tensor(x)).tolist()} for x in inputs]
    write_json("mlp_expected.json", {"cases": cases}, written)

    pair = torch.jit.script(Pair())
    pair.save(os.path.join(OUT, "pair.pt"))
    written.append(os.path.join(OUT, "pair.pt"))
    docs = torch.jit.script(Docs())
    docs.save(os.path.join(OUT, "docs.pt"))
    written.append(os.path.join(OUT, "docs.pt"))
    features = [[1.0, 2.0, 3.0], [-0.5, 0.25, 4.0]]
    scale = [3, -2]
    texts = ["The quick brown fox", "naïve café, déjà vu", "", "  spaced   out  ", "日本語 テキスト"]
    with torch.no_grad():
        scaled, total = pair(torch.tensor(features), torch.tensor(scale))
        counts, firsts = docs(texts)
    write_json("pair_expected.json", {
        "features": features, "scale": scale,
        "scaled": scaled.tolist(), "total": total.tolist(),
    }, written)
    write_json("docs_expected.json", {
        "docs": texts, "lengths": counts.tolist(), "first_word": firsts,
    }, written)
    write_json("pair.json", {
        "name": "pair-fixture", "model": "pair.pt",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 3]},
                   {"name": "scale", "datatype": "INT64", "shape": [-1]}],
        "outputs": [{"name": "scaled", "datatype": "FP32", "shape": [-1, 3]},
                    {"name": "total", "datatype": "FP64", "shape": [-1]}],
    }, written)
    write_json("docs.json", {
        "name": "docs-fixture", "model": "docs.pt",
        "inputs": [{"name": "docs", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "lengths", "datatype": "INT64", "shape": [-1, 2]},
                    {"name": "first_word", "datatype": "BYTES", "shape": [-1]}],
    }, written)

    save(Slow(), "slow.pt", written)
    save(Fail(), "fail.pt", written)
    save(Tuple2(), "tuple.pt", written)
    save(Alloc(), "alloc.pt", written)
    save(Scalars(), "scalars.pt", written)
    save(FakeCudaOom(), "oom.pt", written)
    save(RowFail(), "rowfail.pt", written)
    save(FakeCudaError(), "cudaerr.pt", written)

    write_json("mlp.json", {
        "name": "mlp-fixture",
        "description": "small MLP for tests",
        "version": "1.0",
        "model": "mlp.pt",
        "input": {"shape": [-1, 4], "dtype": "float32"},
        "x_custom": {"kept": True},
    }, written)
    write_json("slow.json", {"name": "slow-fixture", "model": "slow.pt",
                             "input": {"shape": [1, 1], "dtype": "float32"}}, written)
    write_json("fail.json", {"name": "fail-fixture", "model": "fail.pt"}, written)
    write_json("tuple.json", {"name": "tuple-fixture", "model": "tuple.pt"}, written)
    write_json("alloc.json", {"name": "alloc-fixture", "model": "alloc.pt",
                              "est_gpu_mem_min": 100, "est_gpu_mem_typ": 200,
                              "input": {"shape": [1, 1], "dtype": "float32"}}, written)
    write_json("scalars.json", {"name": "scalars-fixture", "model": "scalars.pt"}, written)
    write_json("rowfail.json", {"name": "rowfail-fixture", "model": "rowfail.pt",
                                "input": {"shape": [-1, 4], "dtype": "float32"},
                                "max_batch_size": 8}, written)
    write_json("cudaerr.json", {"name": "cudaerr-fixture", "model": "cudaerr.pt",
                                "input": {"shape": [-1, 4], "dtype": "float32"},
                                "max_batch_size": 8}, written)
    write_json("not-a-model.json", {"name": "broken", "model": "not-a-model.pt"}, written)

    path = os.path.join(OUT, "not-a-model.pt")
    with open(path, "wb") as f:
        f.write(b"this is not a TorchScript archive\x00\x01\x02 garbage\n" * 4)
    written.append(path)

    for p in written:
        print(f"wrote {os.path.relpath(p, os.path.dirname(HERE))} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
