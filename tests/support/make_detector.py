"""Makes the artefacts of tests/torchserve_detector.rs in OUTDIR, on the spot: TorchServe
model archives with the default handler `object_detector`, written as torch-model-archiver
writes them, and the answers TorchServe's own handler gives.

- detector.mar: torchvision's Faster R-CNN (its RPN and RoI heads, FasterRCNN's own
  transform) on a small convolutional backbone, random weights, 3 classes, images resized
  inside to 128..256 pixels, scripted (`forward(images: List[Tensor])` returning
  `(losses, detections)`), with index_to_name.json ({"0": "__background__", "1": "cat",
  "2": "dog"}), its box head small (64 features). Random weights score the three classes
  about alike, each below TorchServe's 0.5: the box classifier's bias for the background
  (`cls_score.bias[0]`) is set to -4, so that a box's best class scores about 0.8 and its
  other about 0.1 — some detections kept, others dropped, none near the threshold;
- plain.mar: the same model without index_to_name.json (TorchServe names labels by index);
- exported.mar: `object_detector` naming a .pt2;
- notdetector.mar: `object_detector` with a scripted model that takes one tensor;
- wide.png, tall.png: images written by Pillow, of two sizes;
- expected.json: what ts.torch_handler.object_detector.ObjectDetector answers for each image
  (its preprocess, the model, its postprocess), with and without the mapping. TorchServe
  calls the model with the preprocess's stacked tensor, which the eager torchvision model
  takes as its list of images (the scripted one takes a list only): the expected answers are
  the eager model's, the archive holds the same model scripted.

Usage: make_detector.py OUTDIR README
"""
import io
import json
import os
import sys
import zipfile

import numpy as np
import torch
from PIL import Image
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.ops import MultiScaleRoIAlign
from ts.torch_handler.object_detector import ObjectDetector
from ts.utils.util import load_label_mapping

out = sys.argv[1]
torch.manual_seed(0)
backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 3, stride=2, padding=1), torch.nn.ReLU())
backbone.out_channels = 16
model = FasterRCNN(
    backbone, min_size=128, max_size=256,
    rpn_anchor_generator=AnchorGenerator(((16, 32, 64),), ((0.5, 1.0, 2.0),)),
    box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
    box_head=TwoMLPHead(16 * 7 * 7, 64), box_predictor=FastRCNNPredictor(64, 3),
    rpn_pre_nms_top_n_test=200, rpn_post_nms_top_n_test=50, box_detections_per_img=100,
).eval()
with torch.no_grad():
    model.roi_heads.box_predictor.cls_score.bias.copy_(torch.tensor([-4.0, 0.0, 0.0]))
scripted = torch.jit.script(model)
buf = io.BytesIO()
torch.jit.save(scripted, buf)
model_pt = buf.getvalue()


class NotDetector(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean()


buf = io.BytesIO()
torch.jit.save(torch.jit.script(NotDetector()), buf)
not_detector_pt = buf.getvalue()
index_to_name = {"0": "__background__", "1": "cat", "2": "dog"}


def manifest(serialized="model.pt", handler="object_detector"):
    m = {"modelName": "det", "serializedFile": serialized, "handler": handler,
         "modelVersion": "1.0"}
    return json.dumps({"createdOn": "29/11/2026 06:00:00", "runtime": "python",
                       "model": m, "archiverVersion": "0.12.0"}, indent=2)


def mar(name, files):
    with zipfile.ZipFile(os.path.join(out, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files.items():
            z.writestr(arc, data)


labels = json.dumps(index_to_name)
mar("detector.mar", {"MAR-INF/MANIFEST.json": manifest(), "model.pt": model_pt,
                     "index_to_name.json": labels})
mar("plain.mar", {"MAR-INF/MANIFEST.json": manifest(handler="ts.torch_handler.object_detector"),
                  "model.pt": model_pt})
mar("exported.mar", {"MAR-INF/MANIFEST.json": manifest("model.pt2"), "model.pt2": b"PK"})
mar("notdetector.mar", {"MAR-INF/MANIFEST.json": manifest(), "model.pt": not_detector_pt})

# Images: photo-like gradients with noise, of two sizes.
rng = np.random.default_rng(0)
for name, (h, w) in (("wide.png", (150, 260)), ("tall.png", (230, 140))):
    yy, xx = np.mgrid[0:h, 0:w]
    a = np.stack([xx * 255 // w, yy * 255 // h, (xx * yy) % 97 * 2], -1).astype(np.uint8)
    a = (a + rng.integers(0, 60, a.shape)).clip(0, 255).astype(np.uint8)
    Image.fromarray(a).save(os.path.join(out, name))

with open(os.path.join(out, "index_to_name.json"), "w") as f:
    f.write(labels)
expected = {}
for mapping in ("labels", "index"):
    handler = ObjectDetector()
    handler.model = model
    handler.device = torch.device("cpu")
    handler.mapping = load_label_mapping(os.path.join(out, "index_to_name.json")) \
        if mapping == "labels" else None
    for f in ("wide.png", "tall.png"):
        with open(os.path.join(out, f), "rb") as fh:
            body = fh.read()
        with torch.no_grad():
            x = handler.preprocess([{"body": bytearray(body)}])
            answer = handler.postprocess(handler.model(x))
        expected.setdefault(mapping, {})[f] = answer[0]
        # The scripted model in the archive gives the same detections.
        with torch.no_grad():
            _, scripted_out = scripted(list(x))
        assert handler.postprocess(scripted_out)[0] == answer[0], f
os.remove(os.path.join(out, "index_to_name.json"))
# The test is only worth its name if the threshold kept some detections and dropped others.
kept = sum(len(v) for v in expected["labels"].values())
with torch.no_grad():
    everything = sum(len(d["scores"]) for f in ("wide.png", "tall.png")
                     for d in model([torch.from_numpy(np.asarray(
                         Image.open(os.path.join(out, f)).convert("RGB"))).permute(2, 0, 1)
                         .float() / 255]))
assert 0 < kept < everything, (kept, everything)
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)
print(json.dumps({"ok": True, "kept": kept, "detections": everything}))
