"""Makes the artefacts of tests/openai.rs in OUTDIR, on the spot, with the packages of the
test venv, and the vectors Python gives for them:

- tokenizer.json: a BERT-style WordPiece tokenizer trained on local text (the project's
  README), with [CLS] ... [SEP] around each document, as tests/support/make_documents.py
  makes it;
- bert.pt: a BERT encoder (transformers' BertModel, random weights, 2 layers) traced with
  forward(input_ids, attention_mask) -> last_hidden_state [batch, tokens, 64];
- cls.pt: the same encoder returning its [CLS] vectors [batch, 64] (for pooling "none");
- bert.pt2: bert.pt's module as a torch.export program (`torch.export.save`), its batch and
  token dimensions dynamic (`Dim`), as docs/migrating.md tells a sentence-transformers user
  to export;
- expected.json: per sentence, its token ids, and the vectors sentence-transformers gives
  for it (the same encoder and tokenizer saved as a Hugging Face folder, read by
  `models.Transformer`, then `models.Pooling` and `models.Normalize`, the way a
  sentence-transformers user builds the model): the [CLS] vector, the mean over its tokens,
  that mean L2-normalised, and that mean cut to 16 dimensions then L2-normalised
  (`truncate_dim=16`). Each is first checked here against the same vector computed with torch
  from the sentence run alone (no padding), within 1e-5, so a mistake in either is caught
  where the fixture is made.

Usage: make_embeddings.py OUTDIR README
"""
import json
import os
import sys

import tempfile

import torch
import wordpiece
from sentence_transformers import SentenceTransformer, models
from transformers import BertConfig, BertModel

out, readme = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)

tok = wordpiece.train(readme)
tok.save(os.path.join(out, "tokenizer.json"))
MAX_LENGTH, sentences = wordpiece.MAX_LENGTH, list(wordpiece.SENTENCES)
tok.enable_truncation(max_length=MAX_LENGTH)
encs = [tok.encode(s) for s in sentences]

cfg = BertConfig(
    vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=128, max_position_embeddings=64, torchscript=True, attn_implementation="eager",
)
bert = BertModel(cfg, add_pooling_layer=False).eval()


class Hidden(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask)[0]


class Cls(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask)[0][:, 0]


with torch.no_grad():
    ids = torch.tensor([encs[0].ids, encs[0].ids])
    mask = torch.ones_like(ids)
    torch.jit.trace(Hidden(bert), (ids, mask)).save(os.path.join(out, "bert.pt"))
    torch.jit.trace(Cls(bert), (ids, mask)).save(os.path.join(out, "cls.pt"))
    batch, tokens = torch.export.Dim("batch", max=64), torch.export.Dim("tokens", max=64)
    program = torch.export.export(Hidden(bert), (ids, mask),
                                  dynamic_shapes=({0: batch, 1: tokens}, {0: batch, 1: tokens}))
    torch.export.save(program, os.path.join(out, "bert.pt2"))
    alone = [bert(input_ids=torch.tensor([e.ids]), attention_mask=torch.ones(1, len(e.ids), dtype=torch.long))[0][0] for e in encs]
    mean = [h.mean(0) for h in alone]
    by_torch = {
        "cls": [h[0] for h in alone],
        "mean": mean,
        "mean_normalized": [torch.nn.functional.normalize(m, dim=0) for m in mean],
        "mean_16": [torch.nn.functional.normalize(m[:16], dim=0) for m in mean],
    }


def sentence_transformers_vectors(folder):
    """The four kinds of vector, as sentence-transformers computes them from `folder`."""

    def model(pooling, normalize):
        word = models.Transformer(folder, max_seq_length=MAX_LENGTH)
        mods = [word, models.Pooling(word.get_word_embedding_dimension(), pooling_mode=pooling)]
        return SentenceTransformer(modules=mods + ([models.Normalize()] if normalize else []), device="cpu")

    mean = model("mean", False)
    return {
        "cls": model("cls", False).encode(sentences, convert_to_tensor=True),
        "mean": mean.encode(sentences, convert_to_tensor=True),
        "mean_normalized": model("mean", True).encode(sentences, convert_to_tensor=True),
        "mean_16": mean.encode(sentences, convert_to_tensor=True, truncate_dim=16, normalize_embeddings=True),
    }


with tempfile.TemporaryDirectory() as folder:
    # The same weights as a Hugging Face folder (a config without `torchscript`, which only
    # changes what the traced module returns) and the tokenizer, with its special tokens named.
    bert.config.torchscript = False
    bert.save_pretrained(folder)
    wordpiece.save_pretrained(tok, folder)
    with torch.no_grad():
        by_st = sentence_transformers_vectors(folder)
for kind, vectors in by_torch.items():
    for i, (want, got) in enumerate(zip(vectors, by_st[kind])):
        diff = (want - got).abs().max().item()
        assert diff <= 1e-5, f"{kind} of sentence {i}: sentence-transformers and torch differ by {diff}"
expected = {
    "max_length": MAX_LENGTH,
    "sentences": sentences,
    "ids": [e.ids for e in encs],
    "truncated": [len(e.overflowing) > 0 for e in encs],
    **{kind: [v.tolist() for v in vectors] for kind, vectors in by_st.items()},
    "vocab": tok.get_vocab_size(),
}
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)
print(json.dumps({"ok": True, "vocab": tok.get_vocab_size()}))
