#!/usr/bin/env python3
"""Makes the embeddings bench's model in OUTDIR (once; skipped when OUTDIR/done exists): a
sentence encoder of all-MiniLM-L6-v2's shape (BERT, 6 layers, width 384, 12 heads, 1536
intermediate; random weights), or with SHAPE `bert-base` of BERT-base's (12 layers, width 768,
12 heads, 3072 intermediate), with a WordPiece tokenizer trained on the project's docs, as

- pooled.pt: TorchScript, forward(input_ids, attention_mask) -> the mean over each input's
  own tokens, L2-normalised, [inputs, 384] (what `/v1/embeddings` serves with pooling "none"
  and v2 serves as a plain output);
- hf/: the same weights and tokenizer as a Hugging Face folder, for sentence-transformers
  (`models.Transformer` + `Pooling("mean")` + `Normalize`) in the Python server;
- tokenizer.json and sentences.json (64 sentences of the docs, 8 to 40 words each).

MAX_LENGTH (default 128) is the tokenizer's `model_max_length` in hf/ (what
sentence-transformers cuts at). ATTENTION is the attention pooled.pt is traced with: `eager`
(the default) or `sdpa` (PyTorch's scaled_dot_product_attention, what transformers and so the
Python servers reading hf/ use by default: the same kernels on every side). transformers' sdpa
path leaves the mask out when the example's is all ones, so the trace's example mask has
padding: the traced graph always applies it. The text bench (text.py) makes both shapes, sdpa.

Usage: embeddings_model.py OUTDIR [SHAPE [MAX_LENGTH [ATTENTION]]]
"""
import glob
import json
import os
import re
import sys

import torch
from transformers import BertConfig, BertModel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import wordpiece  # noqa: E402

# name: (hidden size, layers, attention heads, intermediate size)
SHAPES = {"minilm": (384, 6, 12, 1536), "bert-base": (768, 12, 12, 3072)}


class Pooled(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        h = self.m(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        mean = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, dim=1)


def sentences():
    """64 sentences of the docs (8 to 40 words, no code), in a fixed order."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"```.*?```", " ", f.read(), flags=re.S)
        for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)):
            if 8 <= len(s.split()) <= 40 and "|" not in s and "`" not in s:
                out.append(s)
    return out[:64]


def main():
    out = sys.argv[1]
    hidden, layers, heads, inner = SHAPES[sys.argv[2] if len(sys.argv) > 2 else "minilm"]
    max_length = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    attention = sys.argv[4] if len(sys.argv) > 4 else "eager"
    if os.path.exists(os.path.join(out, "done")):
        return
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    tok = wordpiece.train(os.path.join(ROOT, "README.md"))
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=inner,
                     max_position_embeddings=512, attn_implementation=attention)
    bert = BertModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():
        ids = torch.randint(5, tok.get_vocab_size(), (2, 16))
        mask = torch.ones_like(ids)
        if attention == "sdpa":
            mask[1, 8:] = 0
        torch.jit.trace(Pooled(bert), (ids, mask), strict=False).save(
            os.path.join(out, "pooled.pt"))
    bert.save_pretrained(os.path.join(out, "hf"))
    wordpiece.save_pretrained(tok, os.path.join(out, "hf"), model_max_length=max_length)
    with open(os.path.join(out, "sentences.json"), "w") as f:
        json.dump(sentences(), f)
    open(os.path.join(out, "done"), "w").close()


if __name__ == "__main__":
    main()
