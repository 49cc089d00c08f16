"""Makes the artefacts of tests/token_budget.rs in OUTDIR, on the spot, with the packages of
the test venv:

- tokenizer.json: the tests' WordPiece tokenizer (wordpiece.py), trained on the README;
- long.pt: a BERT encoder (transformers' BertModel, random weights, 1 layer of width 32 and
  8 attention heads, eager attention, 256 positions) traced with forward(input_ids,
  attention_mask) -> last_hidden_state [batch, tokens, 32]: its attention scores grow with
  rows x tokens^2, so a pass of many long documents takes far more memory than one alone;
- picky.pt: a scripted encoder (an embedding table) that raises CUDA's out-of-memory error,
  word for word as the caching allocator words it, for a pass of more than 128 tokens
  (rows x padded length): a model on a GPU with room for 128 tokens a pass;
- expected.json: the README's words, to make documents of any length from.

Usage: make_long_encoder.py OUTDIR README
"""
import json
import os
import sys

import torch
import wordpiece
from transformers import BertConfig, BertModel

out, readme = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
tok = wordpiece.train(readme)
tok.save(os.path.join(out, "tokenizer.json"))

cfg = BertConfig(
    vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=1, num_attention_heads=8,
    intermediate_size=64, max_position_embeddings=256, torchscript=True, attn_implementation="eager",
)
bert = BertModel(cfg, add_pooling_layer=False).eval()


class Hidden(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask)[0]


class Picky(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, 16)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if input_ids.numel() > 128:
            raise RuntimeError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.74 GiB of which 1.06 GiB is free."
            )
        return self.table(input_ids) * attention_mask.unsqueeze(-1).to(torch.float32)


with torch.no_grad():
    ids = torch.tensor([tok.encode("vramfork serves models").ids] * 2)
    torch.jit.trace(Hidden(bert), (ids, torch.ones_like(ids))).save(os.path.join(out, "long.pt"))
    torch.jit.script(Picky(tok.get_vocab_size()).eval()).save(os.path.join(out, "picky.pt"))
with open(readme, encoding="utf-8") as f:
    words = [w for w in f.read().split() if w.isalpha()]
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump({"words": words}, f)
print(json.dumps({"ok": True}))
