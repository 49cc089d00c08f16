#!/usr/bin/env python3
"""The models of `scripts/bench --only pt2`, each in the three formats vramfork serves, and
each artifact's own loop.

    pt2_models.py build DIR          writes DIR/<model>.{pt,pt2,aoti.pt2,json…} (once)
    pt2_models.py loop PATH KIND MODEL SECONDS
                                     passes/s of the artifact's own loop, one thread: KIND
                                     torchscript (torch.jit.load), program (the Native
                                     Runtime, torch._C._nativert.PyModelRunner: what the
                                     worker runs) or aoti (torch._inductor.aoti_load_package)

Every format is served with `max_batch_size` 8 (an AOTInductor package's batch starts at 2
rows, and the server pads a lone row only with batching on; the CNN's package bounds its batch at 15); the package's own loop runs the
2-row pass a lone request becomes.

Models (random weights, fixed seeds): `mlp256` (64-256-256-16, one row of 64) and `cnn`
(scripts/bench.d/make_real.py's CIFAR-style CNN, one 3x32x32 image). Exported with
torch.export.Dim for the batch; the AOTInductor packages with
TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1 (what vramfork serves).
"""
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def modules():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 16)).eval()

    def block(i, o):
        return [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU()]

    cnn = torch.nn.Sequential(*(
        block(3, 96) + block(96, 96) + [torch.nn.MaxPool2d(2)] + block(96, 192)
        + block(192, 192) + [torch.nn.MaxPool2d(2)] + block(192, 384) + block(384, 384)
        + block(384, 384) + [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                             torch.nn.Linear(384, 10)])).eval()
    return {"mlp256": (mlp, [64]), "cnn": (cnn, [3, 32, 32])}


def example(name):
    shape = modules()[name][1]
    return torch.randn(1, *shape, generator=torch.Generator().manual_seed(1))


def build(out):
    os.makedirs(out, exist_ok=True)
    import torch._inductor.config as inductor
    for name, (m, shape) in modules().items():
        if not os.path.exists(os.path.join(out, f"{name}.done")):
            x2 = torch.zeros(2, *shape)
            torch.jit.trace(m, x2).save(os.path.join(out, f"{name}.pt"))
            program = torch.export.export(
                m, (x2,), dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
            torch.export.save(program, os.path.join(out, f"{name}.pt2"))
            with inductor.patch({"cpp.dynamic_threads": True}):
                torch._inductor.aoti_compile_and_package(
                    program, package_path=os.path.join(out, f"{name}.aoti.pt2"))
            open(os.path.join(out, f"{name}.done"), "w").close()
        x = example(name)
        for kind, file in (("torchscript", f"{name}.pt"), ("program", f"{name}.pt2"),
                           ("aoti", f"{name}.aoti.pt2")):
            with open(os.path.join(out, f"{name}.{kind}.json"), "w") as f:
                # Batching on for every format: an AOTInductor package's dynamic batch starts
                # at 2 rows (Dim(max=64) compiles as 2..64), and the server pads a lone row
                # only with batching on.
                json.dump({"name": f"{name}-{kind}", "model": os.path.join(out, file),
                           "max_batch_size": 8,
                           "input": {"shape": [-1, *shape], "dtype": "float32"}}, f)
        with open(os.path.join(out, f"{name}.body"), "w") as f:
            json.dump({"inputs": x.tolist()}, f)
    print(json.dumps({"built": out}))


def loop(path, kind, name, seconds):
    torch.set_num_threads(1)
    x = example(name)
    if kind == "torchscript":
        m = torch.jit.load(path)
        run = lambda: m(x)  # noqa: E731
    elif kind == "program":
        r = torch._C._nativert.PyModelRunner(path, "model")
        run = lambda: r.run_with_flat_inputs_and_outputs(x)  # noqa: E731
    else:
        m = torch._inductor.aoti_load_package(path)
        # Its batch starts at 2 rows: a lone row runs as two (what the server pads it to).
        x = torch.cat([x, x])
        run = lambda: m(x)  # noqa: E731
    with torch.inference_mode():
        for _ in range(20):
            run()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            run()
            n += 1
        print(json.dumps({"per_s": n / (time.perf_counter() - t0)}))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        loop(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
