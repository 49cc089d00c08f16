"""Writes an AOTInductor package of mlp.pt's module and weights (torch.export with a Dim for
the batch, then torch._inductor.aoti_compile_and_package) to PATH, and prints
{"path": ..., "bytes": ...}. Compiling takes about a minute on two cores: callers cache it.

usage: make_aoti_package.py PATH"""
import json
import os
import sys

import torch

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(FIXTURES)), "scripts"))

from make_models import Mlp  # noqa: E402

path = sys.argv[1]
mlp = Mlp().eval()
mlp.load_state_dict(torch.jit.load(os.path.join(FIXTURES, "mlp.pt")).state_dict())
batch = torch.export.Dim("batch", max=64)
program = torch.export.export(mlp, (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
torch._inductor.aoti_compile_and_package(program, package_path=path)
print(json.dumps({"path": path, "bytes": os.path.getsize(path)}))
