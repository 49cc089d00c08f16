"""Makes the artefacts of tests/documents.rs in OUTDIR, on the spot, with the packages of the
test venv (tokenizers, transformers, torchvision, Pillow), and what Python makes of them:

- tokenizer.json: a BERT-style WordPiece tokenizer trained on local text (the project's
  README), with [CLS] … [SEP] around each document;
- bert.pt: a BERT-architecture classifier (transformers' BertForSequenceClassification,
  random weights, 2 layers) traced with forward(input_ids, attention_mask) -> logits;
  bert3.pt: the same model taking token_type_ids too;
- resnet.pt: torchvision's ResNet-18 (random weights, 10 classes), scripted;
- ident.pt: returns its input (so a test sees the pre-processed tensor itself);
- cat.jpg, wide.png, rgba.png, gray.png: images written by Pillow;
- expected.json: the tokens, logits and tensors Python gives for them, and for a long text
  (3000 newlines, then the README: most of it beyond max_length) what the tokenizer gives
  for the whole of it, cut to max_length.

Usage: make_documents.py OUTDIR README
       make_documents.py --big OUTDIR  (40-megapixel images for the memory test: big.jpg,
                                        big_progressive.jpg, big_rgba.png)
"""
import json
import os
import sys

import numpy as np
import torch
import wordpiece
from PIL import Image
from torchvision import models as tv_models
from torchvision import transforms as T
from transformers import BertConfig, BertForSequenceClassification

if sys.argv[1] == "--big":
    # The default max_pixels' worth (40 MP): a baseline and a progressive JPEG, an RGBA PNG.
    big, (h, w) = sys.argv[2], (5470, 7300)
    os.makedirs(big, exist_ok=True)
    yy, xx = np.mgrid[0:h, 0:w]
    a = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 64 * 4], -1).astype(np.uint8)
    a += np.random.default_rng(0).integers(0, 20, a.shape, dtype=np.uint8)
    Image.fromarray(a).save(os.path.join(big, "big.jpg"), quality=90)
    Image.fromarray(a).save(os.path.join(big, "big_progressive.jpg"), quality=90, progressive=True)
    rgba = np.dstack([a, np.full((h, w, 1), 255, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(os.path.join(big, "big_rgba.png"), compress_level=1)
    print(json.dumps({"ok": True, "pixels": h * w}))
    sys.exit(0)

out, readme = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
np.random.seed(0)

# --- the tokenizer, trained on local text
tok = wordpiece.train(readme)
tok.save(os.path.join(out, "tokenizer.json"))
MAX_LENGTH, sentences = wordpiece.MAX_LENGTH, list(wordpiece.SENTENCES)
tok.enable_truncation(max_length=MAX_LENGTH)
encs = [tok.encode(s) for s in sentences]
with open(readme, encoding="utf-8") as f:
    long_text = "\n" * 3000 + f.read()
long_enc = tok.encode(long_text)

# --- the BERT-architecture classifier
cfg = BertConfig(
    vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=128, max_position_embeddings=64, num_labels=3, torchscript=True,
    attn_implementation="eager",
)
bert = BertForSequenceClassification(cfg).eval()


class Two(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask)[0]


class Three(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]


def padded(es, width=None):
    width = width or max(len(e.ids) for e in es)
    ids = torch.zeros(len(es), width, dtype=torch.long)
    mask = torch.zeros(len(es), width, dtype=torch.long)
    for i, e in enumerate(es):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = 1
    return ids, mask


with torch.no_grad():
    ids, mask = padded(encs[:2])
    two = torch.jit.trace(Two(bert), (ids, mask))
    three = torch.jit.trace(Three(bert), (ids, mask, torch.zeros_like(ids)))
    two.save(os.path.join(out, "bert.pt"))
    three.save(os.path.join(out, "bert3.pt"))
    # One document at a time, as Python would run them (no padding): the answers expected.
    single = [bert(input_ids=torch.tensor([e.ids]), attention_mask=torch.ones(1, len(e.ids), dtype=torch.long))[0][0].tolist() for e in encs + [long_enc]]
    long_logits = single.pop()
    # The traced model follows other shapes (checked here, not assumed).
    ids, mask = padded(encs)
    traced_all = two(ids, mask)
    assert torch.allclose(traced_all, torch.tensor(single), atol=1e-4), (traced_all, single)

# --- images written by Pillow
yy, xx = np.mgrid[0:375, 0:500]
rgb = np.stack([(xx * 255 / 500), (yy * 255 / 375), ((xx + yy) % 64) * 4], axis=-1)
rgb = (rgb + np.random.randint(0, 30, rgb.shape)).clip(0, 255).astype(np.uint8)
Image.fromarray(rgb).save(os.path.join(out, "cat.jpg"), quality=92)
wide = np.random.randint(0, 256, (120, 300, 3), dtype=np.uint8)
wide[:, :150] //= 3
Image.fromarray(wide).save(os.path.join(out, "wide.png"))
rgba = np.random.randint(0, 256, (90, 70, 4), dtype=np.uint8)
Image.fromarray(rgba, "RGBA").save(os.path.join(out, "rgba.png"))
gray = (np.add.outer(np.arange(64), np.arange(80)) * 2 % 256).astype(np.uint8)
Image.fromarray(gray, "L").save(os.path.join(out, "gray.png"))
files = ["cat.jpg", "wide.png", "rgba.png", "gray.png"]

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
imagenet = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
small_crop = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor(), T.Normalize(MEAN, STD)])
stretch = T.Compose([T.Resize((24, 36)), T.ToTensor()])


def load(f):
    return Image.open(os.path.join(out, f)).convert("RGB")


resnet = tv_models.resnet18(weights=None, num_classes=10).eval()
torch.jit.script(resnet).save(os.path.join(out, "resnet.pt"))


class Ident(torch.nn.Module):
    def forward(self, x):
        return x


torch.jit.script(Ident()).save(os.path.join(out, "ident.pt"))
with torch.no_grad():
    resnet_out = {f: resnet(imagenet(load(f)).unsqueeze(0))[0].tolist() for f in files}
expected = {
    "max_length": MAX_LENGTH,
    "sentences": sentences,
    "ids": [e.ids for e in encs],
    "type_ids": [e.type_ids for e in encs],
    "logits": single,
    "long_text": long_text,
    "long_ids": long_enc.ids,
    "long_logits": long_logits,
    "pad_id": tok.token_to_id("[PAD]"),
    "files": files,
    "resnet": resnet_out,
    "small_crop": {f: small_crop(load(f)).tolist() for f in files},
    "stretch": {f: stretch(load(f)).tolist() for f in files},
    "mean": MEAN,
    "std": STD,
}
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)
print(json.dumps({"ok": True, "vocab": tok.get_vocab_size()}))
