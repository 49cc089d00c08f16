"""Makes, in OUTDIR, a torch.export program (.pt2) whose output nests, and torch's answer for
one input: what tests/pt2.rs serves to see such an output numbered, not named.

- nested.pt2: [-1, 4] float32 x -> {"pair": (x * 2, x + 1), "sum": x.sum(-1)}, a dict
  holding a tuple (batch dynamic);
- expected.json: {"input": [[...]], "flat": [x * 2, x + 1, x.sum(-1)]}, the outputs in the
  output spec's order.

Usage: make_nested_program.py OUTDIR README
"""
import json
import os
import sys

import torch

out = sys.argv[1]


class Nested(torch.nn.Module):
    def forward(self, x):
        return {"pair": (x * 2, x + 1), "sum": x.sum(-1)}


program = torch.export.export(Nested(), (torch.zeros(2, 4),),
                              dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})
for node in program.graph.nodes:  # no path of this machine in the archive
    node.meta.pop("stack_trace", None)
torch.export.save(program, os.path.join(out, "nested.pt2"))
x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 2.5, -3.0]])
flat = [t.tolist() for t in (x * 2, x + 1, x.sum(-1))]
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump({"input": x.tolist(), "flat": flat}, f)
print(json.dumps({"ok": True}))
