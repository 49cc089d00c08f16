#!/usr/bin/env python3
"""Builds the real architectures `scripts/bench --only real` serves, with random weights (fixed
seeds), into DIR: a CIFAR-style CNN (7 conv3x3 layers, widths 96/192/384, torch only),
ResNet-50 (torchvision's architecture) and a BERT-base encoder (transformers' BertModel:
input_ids and attention_mask, 128 tokens, the pooled output). Writes each model's .pt, its
metadata .json and request bodies: the CNN as `POST /` JSON (and as v2 binary, cnn_v2.*),
ResNet-50 and BERT as v2 binary
(JSON header + raw tensors; the header's length in <name>.v2len) and as `POST /` JSON
(<name>.ready, for the readiness check). Prints what it wrote.

usage: make_real.py DIR [NAME...]   (cnn, resnet50, bert; all three without NAME; resnet50 and
                                    bert need torchvision and transformers: scripts/bench
                                    installs both)"""
import json
import os
import struct
import sys

import torch

OUT = sys.argv[1]
NAMES = sys.argv[2:] or ["cnn", "resnet50", "bert"]
os.makedirs(OUT, exist_ok=True)


def write(name, data):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(OUT, name), mode) as f:
        f.write(data)


def v2_binary(model, inputs):
    """inputs: [(name, datatype, shape, fmt, values)] -> (body bytes, header length)."""
    raws = [struct.pack(f"<{len(v)}{fmt}", *v) for _, _, _, fmt, v in inputs]
    head = json.dumps({
        "inputs": [{"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(r)}}
                   for (n, d, s, _, _), r in zip(inputs, raws)],
        "parameters": {"binary_data_output": True},
    }).encode()
    return head + b"".join(raws), len(head)


def cnn():
    torch.manual_seed(0)

    def block(i, o):
        return [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU()]

    layers = (block(3, 96) + block(96, 96) + [torch.nn.MaxPool2d(2)] + block(96, 192)
              + block(192, 192) + [torch.nn.MaxPool2d(2)] + block(192, 384) + block(384, 384)
              + block(384, 384) + [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                   torch.nn.Linear(384, 10)])
    m = torch.nn.Sequential(*layers).eval()
    torch.jit.trace(m, torch.randn(1, 3, 32, 32)).save(os.path.join(OUT, "cnn.pt"))
    write("cnn.json", json.dumps({"name": "cnn", "model": "cnn.pt",
                                  "input": {"shape": [-1, 3, 32, 32], "dtype": "float32"}}))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    write("cnn.body", json.dumps({"inputs": x.tolist()}))
    write("cnn.ready", json.dumps({"inputs": x.tolist()}))
    # The same request as v2 binary: what the CNN's JSON costs on the same cores.
    body, hl = v2_binary("cnn", [("input__0", "FP32", [1, 3, 32, 32], "f", x.flatten().tolist())])
    write("cnn_v2.body", body)
    write("cnn_v2.v2len", str(hl))


def resnet50():
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.resnet50(weights=None).eval()
    torch.jit.trace(m, torch.randn(1, 3, 224, 224)).save(os.path.join(OUT, "resnet50.pt"))
    write("resnet50.json", json.dumps({
        "name": "resnet50", "model": "resnet50.pt",
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}]}))
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1)).flatten().tolist()
    body, hl = v2_binary("resnet50", [("image", "FP32", [1, 3, 224, 224], "f", x)])
    write("resnet50.ready", json.dumps({"inputs": torch.tensor(x).reshape(1, 3, 224, 224).tolist()}))
    write("resnet50.body", body)
    write("resnet50.v2len", str(hl))


def bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    enc = BertModel(BertConfig(), add_pooling_layer=True).eval()

    class Encoder(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[1]

    ids = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 128, dtype=torch.int64)
    with torch.no_grad():
        torch.jit.trace(Encoder(enc), (ids, mask), strict=False).save(os.path.join(OUT, "bert.pt"))
    write("bert.json", json.dumps({
        "name": "bert", "model": "bert.pt",
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, 128]},
                   {"name": "attention_mask", "datatype": "INT64", "shape": [-1, 128]}],
        "outputs": [{"name": "pooled", "datatype": "FP32", "shape": [-1, 768]}]}))
    body, hl = v2_binary("bert", [("input_ids", "INT64", [1, 128], "q", ids.flatten().tolist()),
                                  ("attention_mask", "INT64", [1, 128], "q", mask.flatten().tolist())])
    write("bert.ready", json.dumps({"inputs": {"input_ids": ids.tolist(), "attention_mask": mask.tolist()}}))
    write("bert.body", body)
    write("bert.v2len", str(hl))


# Each model is made again when the last file it writes is missing.
for make, name, last in ((cnn, "cnn", "cnn_v2.v2len"), (resnet50, "resnet50", "resnet50.ready"),
                         (bert, "bert", "bert.v2len")):
    if name not in NAMES:
        continue
    if not os.path.exists(os.path.join(OUT, last)):
        make()
    print(f"{name}: {os.path.getsize(os.path.join(OUT, name + '.pt')) >> 20} MB")
