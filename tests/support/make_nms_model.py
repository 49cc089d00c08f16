#!/usr/bin/env python3
"""Builds tests/fixtures/nms.pt: a TorchScript model calling torchvision's `nms` operator
(every torchvision detection model does), and nms_expected.json, what torch answered.

Run with the project's torch venv (torchvision installed by scripts/setup-torch):
    source scripts/env.sh && $VRAMFORK_PYTHON tests/support/make_nms_model.py
The outputs are committed; serving the model needs torchvision's operator library at run
time (the metadata's op_libraries), which is what tests/production.rs checks.
"""
import json
import os

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "fixtures")


class Nms(torch.nn.Module):
    """boxes [-1, 4] (x1, y1, x2, y2), scores [-1] -> indices kept, best first."""

    def forward(self, boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torchvision.ops.nms(boxes, scores, 0.5)


def main() -> None:
    model = torch.jit.script(Nms())
    path = os.path.join(OUT, "nms.pt")
    model.save(path)
    boxes = [[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 30.0, 30.0],
             [21.0, 19.0, 31.0, 29.0], [50.0, 50.0, 60.0, 70.0]]
    scores = [0.9, 0.8, 0.3, 0.95, 0.5]
    keep = model(torch.tensor(boxes), torch.tensor(scores)).tolist()
    with open(os.path.join(OUT, "nms_expected.json"), "w") as f:
        json.dump({"boxes": boxes, "scores": scores, "keep": keep,
                   "torch": torch.__version__, "torchvision": torchvision.__version__}, f, indent=2)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes); keep = {keep}")


if __name__ == "__main__":
    main()
