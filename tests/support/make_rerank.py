"""Makes the artefacts of tests/rerank.rs in OUTDIR, on the spot, with the packages of the
test venv, and the scores Python gives for them:

- tokenizer.json: the tests' BERT-style WordPiece tokenizer (wordpiece.py), whose pair
  template is [CLS] A [SEP] B [SEP] with token type ids 0 then 1;
- cross.pt: a cross-encoder (transformers' BertForSequenceClassification, num_labels=1,
  random weights, 2 layers) traced with forward(input_ids, attention_mask, token_type_ids)
  -> logits [pairs, 1]; cross.pt2: the same module as a torch.export program, its batch and
  token dimensions dynamic;
- classes.pt: a 3-label classifier (another BertForSequenceClassification, num_labels=3,
  other random weights), traced the same way;
- expected.json: the query and documents (one long enough to be cut at MAX_LENGTH), the
  scores sentence-transformers' CrossEncoder(max_length=MAX_LENGTH) predicts for each
  (query, document) pair from the same weights saved as a Hugging Face folder, with its
  default activation (sigmoid for one label) and with activation_fn=Identity (raw logits),
  each first checked here against the traced module run on that pair alone, within 1e-5;
  the tokens of each pair as CrossEncoder's tokenizer makes them; the classifier's softmax
  for texts and for a pair, computed with torch on each alone.

Usage: make_rerank.py OUTDIR README
"""
import json
import os
import sys
import tempfile

import torch
import wordpiece
from sentence_transformers import CrossEncoder
from transformers import BertConfig, BertForSequenceClassification

out, readme = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
MAX_LENGTH = 40
QUERY = "how are workers recycled?"
DOCUMENTS = [
    "Workers are recycled after a number of requests, without failing one.",
    "vramfork serves TorchScript models over HTTP.",
    "GPU",
    "A very long document " + "that goes on and on " * 12 + "until it is cut.",
    "The master starts a replacement worker while the old one finishes its request.",
]
TEXTS = ["a good model", "the worker failed", "Ünïcödé text, emoji 🚀 and 中文", "GPU"]
PAIR = ["is the gpu free?", "the master keeps a ledger of gpu memory"]

tok = wordpiece.train(readme)
tok.save(os.path.join(out, "tokenizer.json"))


def model(labels, seed):
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, num_labels=labels, attn_implementation="eager",
        # Wider than the default 0.02, so the documents' scores differ by more than the tolerance.
        initializer_range=0.3,
    )
    return BertForSequenceClassification(cfg).eval()


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


def encode(a, b=None):
    t = wordpiece.Tokenizer.from_str(tok.to_str())
    t.enable_truncation(max_length=MAX_LENGTH)
    e = t.encode(a, b) if b is not None else t.encode(a)
    return {k: torch.tensor([v]) for k, v in
            (("input_ids", e.ids), ("attention_mask", e.attention_mask), ("token_type_ids", e.type_ids))}


cross, classes = model(1, 1), model(3, 2)
with torch.no_grad():
    ex = encode(QUERY, DOCUMENTS[0])
    # Two rows: an example batch of one would fix the batch dimension at 1.
    args = tuple(ex[k].repeat(2, 1) for k in ("input_ids", "attention_mask", "token_type_ids"))
    torch.jit.trace(Logits(cross), args).save(os.path.join(out, "cross.pt"))
    torch.jit.trace(Logits(classes), args).save(os.path.join(out, "classes.pt"))
    batch, tokens = torch.export.Dim("batch", max=64), torch.export.Dim("tokens", max=64)
    dyn = {0: batch, 1: tokens}
    program = torch.export.export(Logits(cross), args, dynamic_shapes=(dyn, dyn, dyn))
    torch.export.save(program, os.path.join(out, "cross.pt2"))
    alone = [cross(**encode(QUERY, d)).logits[0, 0].item() for d in DOCUMENTS]
    softmax = [torch.softmax(classes(**encode(t)).logits[0], 0).tolist() for t in TEXTS]
    pair_softmax = torch.softmax(classes(**encode(*PAIR)).logits[0], 0).tolist()

with tempfile.TemporaryDirectory() as folder:
    cross.save_pretrained(folder)
    wordpiece.save_pretrained(tok, folder)
    pairs = [(QUERY, d) for d in DOCUMENTS]
    ce = CrossEncoder(folder, max_length=MAX_LENGTH, device="cpu")
    default = ce.predict(pairs, batch_size=2).tolist()
    raw = ce.predict(pairs, batch_size=2, activation_fn=torch.nn.Identity()).tolist()
    ids = [ce.tokenizer(q, d, truncation=True, max_length=MAX_LENGTH)["input_ids"] for q, d in pairs]
    full = [ce.tokenizer(q, d)["input_ids"] for q, d in pairs]

for i, (want, got, sig) in enumerate(zip(alone, raw, default)):
    assert abs(want - got) <= 1e-5, f"pair {i}: CrossEncoder's logit {got}, torch's {want}"
    assert abs(torch.sigmoid(torch.tensor(want)).item() - sig) <= 1e-5, f"pair {i}: sigmoid"
assert [len(f) > MAX_LENGTH for f in full] == [False, False, False, True, False], [len(f) for f in full]

expected = {
    "max_length": MAX_LENGTH, "query": QUERY, "documents": DOCUMENTS,
    "default": default, "raw": raw, "ids": ids,
    "truncated": [len(f) > MAX_LENGTH for f in full],
    "texts": TEXTS, "softmax": softmax, "pair": PAIR, "pair_softmax": pair_softmax,
}
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)
print(json.dumps({"ok": True}))
