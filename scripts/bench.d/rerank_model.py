#!/usr/bin/env python3
"""Makes the rerank bench's model and documents in OUTDIR (once; skipped when OUTDIR/done
exists): a cross-encoder of cross-encoder/ms-marco-MiniLM-L6-v2's shape (transformers'
BertForSequenceClassification, one label, 6 layers, width 384, 12 heads, 1536 intermediate;
random weights) with a WordPiece tokenizer trained on the project's README, as

- cross.pt: TorchScript, forward(input_ids, attention_mask, token_type_ids) -> logits
  [pairs, 1] (what the `rerank` block serves, sigmoid applied by the server);
- hf/: the same weights and tokenizer as a Hugging Face folder, for sentence-transformers'
  `CrossEncoder` in the Python server;
- tokenizer.json, and documents.json: the query and 1,000 documents cut from the docs, of
  mixed length in a fixed order — about 70 % one sentence (8 to 40 words), 20 % a paragraph of
  three to five, 10 % a long one of twelve to twenty that `MAX_LENGTH` cuts.

Usage: rerank_model.py OUTDIR
"""
import glob
import json
import os
import random
import re
import sys

import torch
from transformers import BertConfig, BertForSequenceClassification

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import wordpiece  # noqa: E402

MAX_LENGTH = 128
QUERY = "how does the server recycle a worker without failing a request?"


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.m(input_ids=input_ids, attention_mask=attention_mask,
                      token_type_ids=token_type_ids).logits


def sentences():
    """Every sentence of the docs of 8 to 40 words without code or tables, in a fixed order."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"```.*?```", " ", f.read(), flags=re.S)
        for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)):
            if 8 <= len(s.split()) <= 40 and "|" not in s and "`" not in s:
                out.append(s)
    return out


def documents(n=1000):
    """`n` documents of mixed length: many short, a tail of long (seeded, so every run and
    both servers see the same)."""
    pool, rng, docs = sentences(), random.Random(0), []
    for _ in range(n):
        r = rng.random()
        k = 1 if r < 0.7 else rng.randint(3, 5) if r < 0.9 else rng.randint(12, 20)
        start = rng.randrange(len(pool) - k)
        docs.append(" ".join(pool[start:start + k]))
    return docs


def main():
    out = sys.argv[1]
    if os.path.exists(os.path.join(out, "done")):
        return
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    tok = wordpiece.train(os.path.join(ROOT, "README.md"))
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=384, num_hidden_layers=6,
                     num_attention_heads=12, intermediate_size=1536,
                     max_position_embeddings=512, num_labels=1, attn_implementation="eager",
                     # Wider than the default 0.02 (whose scores all lie within 0.003 of each
                     # other), so that the 1e-4 check between the servers tells models apart.
                     initializer_range=0.1)
    cross = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        # Two rows of 16 tokens: an example batch of one would fix the batch dimension at 1.
        ids = torch.randint(5, tok.get_vocab_size(), (2, 16))
        types = torch.cat([torch.zeros(2, 8), torch.ones(2, 8)], 1).long()
        torch.jit.trace(Logits(cross), (ids, torch.ones_like(ids), types), strict=False).save(
            os.path.join(out, "cross.pt"))
    cross.save_pretrained(os.path.join(out, "hf"))
    wordpiece.save_pretrained(tok, os.path.join(out, "hf"), model_max_length=MAX_LENGTH)
    with open(os.path.join(out, "documents.json"), "w") as f:
        json.dump({"query": QUERY, "max_length": MAX_LENGTH, "documents": documents()}, f)
    open(os.path.join(out, "done"), "w").close()


if __name__ == "__main__":
    main()
