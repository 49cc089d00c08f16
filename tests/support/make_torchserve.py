"""Makes the artefacts of tests/torchserve.rs in OUTDIR, on the spot: TorchServe model
archives written as torch-model-archiver writes them (a zip: MAR-INF/MANIFEST.json, the
serialized model, index_to_name.json), and the answers TorchServe's own handler gives.

- classifier.mar: a small convolutional classifier (random weights, 10 classes), scripted,
  with the default handler `image_classifier` and an index_to_name.json in ImageNet's form
  ({"0": ["n01440764", "tench"]});
- exported.mar: the same model as a torch.export program (.pt2);
- plain.mar: the same model without index_to_name.json (TorchServe names classes by index);
- custom.mar: the same model with a custom handler.py;
- eager.mar: an eager model (model.py and a state dict, .pth);
- segmenter.mar: torchvision's FCN (its FCNHead on a small convolutional backbone, random
  weights, 3 classes), scripted (it returns a dict, {"out": ..., "aux": ...}), with the
  default handler `image_segmenter`;
- segmenter_exported.mar: the same FCN and weights as a torch.export program (.pt2) of a
  module returning a plain dict of its outputs (`dict(fcn(x))`), batch and size dynamic;
- segmenter_ordered.mar: the FCN itself exported (its output an OrderedDict, whose pytree
  type libtorch's Native Runtime does not load);
- cat.jpg, wide.png: images written by Pillow;
- expected.json: what ts.torch_handler.image_classifier.ImageClassifier answers for each
  image (its preprocess, the model, its postprocess), as TorchServe would return it; and
  under "segments" what ts.torch_handler.image_segmenter.ImageSegmenter answers for wide.png.

Usage: make_torchserve.py OUTDIR README
"""
import io
import json
import os
import sys
import zipfile

import numpy as np
import torch
from PIL import Image
from torch.export import Dim
from ts.torch_handler.image_classifier import ImageClassifier
from ts.torch_handler.image_segmenter import ImageSegmenter
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.segmentation.fcn import FCN, FCNHead
from ts.utils.util import load_label_mapping

out = sys.argv[1]
torch.manual_seed(0)


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 5, stride=4)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(y) * 4.0


model = Small().eval()
scripted = torch.jit.script(model)
buf = io.BytesIO()
torch.jit.save(scripted, buf)
model_pt = buf.getvalue()
names = ["tench", "goldfish", "great white shark", "tiger shark", "hammerhead", "electric ray",
         "stingray", "cock", "hen", "ostrich"]
index_to_name = {str(i): ["n%08d" % (1440764 + i), n] for i, n in enumerate(names)}


def manifest(handler, serialized="model.pt", model_file=None, name="small"):
    m = {"modelName": name, "serializedFile": serialized, "handler": handler,
         "modelVersion": "1.0"}
    if model_file:
        m["modelFile"] = model_file
    return json.dumps({"createdOn": "29/11/2026 06:00:00", "runtime": "python",
                       "model": m, "archiverVersion": "0.12.0"}, indent=2)


def mar(name, files):
    with zipfile.ZipFile(os.path.join(out, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files.items():
            z.writestr(arc, data)


labels = json.dumps(index_to_name)
mar("classifier.mar", {"MAR-INF/MANIFEST.json": manifest("image_classifier"),
                       "model.pt": model_pt, "index_to_name.json": labels})
# The same module as a torch.export program (.pt2), archived as TorchServe 0.12 archives one.
program = torch.export.export(model, (torch.zeros(2, 3, 224, 224),),
                              dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})
pt2 = io.BytesIO()
torch.export.save(program, pt2)
mar("exported.mar", {"MAR-INF/MANIFEST.json": manifest("image_classifier", "model.pt2"),
                     "model.pt2": pt2.getvalue(), "index_to_name.json": labels})
mar("plain.mar", {"MAR-INF/MANIFEST.json": manifest("image_classifier"), "model.pt": model_pt})
mar("custom.mar", {"MAR-INF/MANIFEST.json": manifest("handler.py"), "model.pt": model_pt,
                   "handler.py": "from ts.torch_handler.base_handler import BaseHandler\n"})
torch.manual_seed(0)
backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 3, stride=2, padding=1), torch.nn.ReLU())
segmenter = FCN(IntermediateLayerGetter(backbone, {"3": "aux", "5": "out"}), FCNHead(16, 3),
                FCNHead(16, 3)).eval()
with torch.no_grad():  # scores that differ from pixel to pixel
    for m in segmenter.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.weight.mul_(4.0)


class Plain(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return dict(self.model(x))   # {"out": …, "aux": …}, a plain dict


def archive_program(name, program):
    for node in program.graph.nodes:  # no path of this machine in the archive
        node.meta.pop("stack_trace", None)
    data = io.BytesIO()
    torch.export.save(program, data)
    mar(name, {"MAR-INF/MANIFEST.json": manifest("image_segmenter", "model.pt2", name="seg"),
               "model.pt2": data.getvalue()})


# fcn: torchvision's segmentation model (fcn_resnet50(weights=…) and the like)
fcn = segmenter
batch, h, w = Dim("batch", max=64), Dim("h", min=16, max=2048), Dim("w", min=16, max=2048)
program = torch.export.export(Plain(fcn.eval()), (torch.zeros(2, 3, 224, 224),),
                              dynamic_shapes={"x": {0: batch, 2: h, 3: w}})
archive_program("segmenter_exported.mar", program)
# The FCN as it is: its output an OrderedDict, which the Native Runtime does not load.
program = torch.export.export(fcn, (torch.zeros(2, 3, 224, 224),),
                              dynamic_shapes={"x": {0: batch, 2: h, 3: w}})
archive_program("segmenter_ordered.mar", program)
segmenter = torch.jit.script(segmenter)
buf = io.BytesIO()
torch.jit.save(segmenter, buf)
mar("segmenter.mar", {"MAR-INF/MANIFEST.json": manifest("image_segmenter", name="seg"),
                      "model.pt": buf.getvalue()})
state = io.BytesIO()
torch.save(model.state_dict(), state)
mar("eager.mar", {"MAR-INF/MANIFEST.json": manifest("image_classifier", "model.pth", "model.py"),
                  "model.pth": state.getvalue(), "model.py": "import torch\n"})

# Images: a photo-like gradient with noise (JPEG, 320x240) and a wide PNG.
rng = np.random.default_rng(0)
yy, xx = np.mgrid[0:240, 0:320]
a = np.stack([xx * 255 // 320, yy * 255 // 240, (xx + yy) % 64 * 4], -1).astype(np.uint8)
a = (a + rng.integers(0, 30, a.shape)).clip(0, 255).astype(np.uint8)
Image.fromarray(a).save(os.path.join(out, "cat.jpg"), quality=90)
yy, xx = np.mgrid[0:200, 0:500]
b = np.stack([(xx * 7) % 256, (yy * 3) % 256, (xx * yy) % 256], -1).astype(np.uint8)
Image.fromarray(b).save(os.path.join(out, "wide.png"))

with open(os.path.join(out, "index_to_name.json"), "w") as f:
    f.write(labels)
expected = {}
for mapping in ("labels", "index"):
    handler = ImageClassifier()
    handler.model = scripted
    handler.device = torch.device("cpu")
    handler.mapping = load_label_mapping(os.path.join(out, "index_to_name.json")) \
        if mapping == "labels" else None
    for f in ("cat.jpg", "wide.png"):
        with open(os.path.join(out, f), "rb") as fh:
            body = fh.read()
        with torch.no_grad():
            x = handler.preprocess([{"body": bytearray(body)}])
            answer = handler.postprocess(handler.model(x))
        expected.setdefault(mapping, {})[f] = answer[0]
os.remove(os.path.join(out, "index_to_name.json"))
handler = ImageSegmenter()
handler.model = segmenter
handler.device = torch.device("cpu")
with open(os.path.join(out, "wide.png"), "rb") as fh:
    body = fh.read()
with torch.no_grad():
    x = handler.preprocess([{"body": bytearray(body)}])
    expected["segments"] = handler.postprocess(handler.model(x))[0]
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)
print(json.dumps({"ok": True}))
