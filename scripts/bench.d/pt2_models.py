#!/usr/bin/env python3
"""The models of `scripts/bench --only pt2`, each in the three formats vramfork serves, and
each artifact's own loop.

    pt2_models.py build DIR [MODELS] writes DIR/<model>.{pt,pt2,aoti.pt2,json…} (once), for
                                     the comma list MODELS (default: all)
    pt2_models.py loop PATH KIND MODEL SECONDS
                                     passes/s of the artifact's own loop, one thread: KIND
                                     torchscript (torch.jit.load), program (the Native
                                     Runtime, torch._C._nativert.PyModelRunner: what the
                                     worker runs) or aoti (torch._inductor.aoti_load_package)

Every format is served with `max_batch_size` 8 (an AOTInductor package's batch starts at 2
rows, and the server pads a lone row only with batching on; the CNN's package bounds its batch at 15); the package's own loop runs the
2-row pass a lone request becomes.

Models (random weights, fixed seeds, made here): `mlp256` (64-256-256-16, one row of 64),
`cnn` (scripts/bench.d/make_real.py's CIFAR-style CNN, one 3x32x32 image), `resnet50`
(torchvision's, one 3x224x224 image) and `bert_base` (transformers' BertModel with its
default config, one sequence of 128 token ids; it answers last_hidden_state and
pooler_output). Compiling the larger packages takes minutes on two cores: each model is built
once (`<model>.done`). Exported with
torch.export.Dim for the batch; the AOTInductor packages with
TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1 (what vramfork serves).
"""
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def mlp256():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 16)).eval()


def cnn():
    torch.manual_seed(0)

    def block(i, o):
        return [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU()]

    return torch.nn.Sequential(*(
        block(3, 96) + block(96, 96) + [torch.nn.MaxPool2d(2)] + block(96, 192)
        + block(192, 192) + [torch.nn.MaxPool2d(2)] + block(192, 384) + block(384, 384)
        + block(384, 384) + [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                             torch.nn.Linear(384, 10)])).eval()


def resnet50():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


def bert_base():
    """BERT-base (transformers' BertModel, its default config: 12 layers, hidden 768), random
    weights; returns the tuple (last_hidden_state, pooler_output) (`torchscript=True`)."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    return BertModel(BertConfig(torchscript=True)).eval()


# name: (module maker, one row's shape, dtype, the export's batch bound)
MODELS = {
    "mlp256": (mlp256, [64], torch.float32, 64),
    "cnn": (cnn, [3, 32, 32], torch.float32, 64),
    "resnet50": (resnet50, [3, 224, 224], torch.float32, 64),
    # token ids of a 128-token sequence (BertConfig's vocabulary: 30522)
    "bert_base": (bert_base, [128], torch.int64, 64),
}


def example(name, rows=1):
    _, shape, dtype, _ = MODELS[name]
    g = torch.Generator().manual_seed(1)
    if dtype == torch.int64:
        return torch.randint(0, 30522, (rows, *shape), generator=g)
    return torch.randn(rows, *shape, generator=g)


def build_one(out, name):
    import torch._inductor.config as inductor
    make, shape, dtype, bound = MODELS[name]
    m = make()
    x2 = example(name, 2)
    torch.jit.trace(m, x2).save(os.path.join(out, f"{name}.pt"))
    program = torch.export.export(
        m, (x2,), dynamic_shapes=({0: torch.export.Dim("batch", max=bound)},))
    torch.export.save(program, os.path.join(out, f"{name}.pt2"))
    with inductor.patch({"cpp.dynamic_threads": True}):
        torch._inductor.aoti_compile_and_package(
            program, package_path=os.path.join(out, f"{name}.aoti.pt2"))
    open(os.path.join(out, f"{name}.done"), "w").close()


def build(out, names):
    os.makedirs(out, exist_ok=True)
    for name in names:
        if not os.path.exists(os.path.join(out, f"{name}.done")):
            build_one(out, name)
        _, shape, dtype, _ = MODELS[name]
        dt = "int64" if dtype == torch.int64 else "float32"
        for kind, file in (("torchscript", f"{name}.pt"), ("program", f"{name}.pt2"),
                           ("aoti", f"{name}.aoti.pt2")):
            with open(os.path.join(out, f"{name}.{kind}.json"), "w") as f:
                # Batching on for every format: an AOTInductor package's dynamic batch starts
                # at 2 rows (Dim(max=64) compiles as 2..64), and the server pads a lone row
                # only with batching on.
                json.dump({"name": f"{name}-{kind}", "model": os.path.join(out, file),
                           "max_batch_size": 8,
                           "input": {"shape": [-1, *shape], "dtype": dt}}, f)
        with open(os.path.join(out, f"{name}.body"), "w") as f:
            json.dump({"inputs": example(name).tolist()}, f)
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
        build(sys.argv[2], sys.argv[3].split(",") if len(sys.argv) > 3 else list(MODELS))
    else:
        loop(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
