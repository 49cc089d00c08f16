"""How to get the `tokenizer.json` a `tokenizer` block reads, as the docs show it,
run offline by tests/documents.rs (`the_newcomer_examples_run_as_written`): transformers'
AutoTokenizer loads a checkpoint (a model hub name online; here a local folder made on the
spot, holding a WordPiece vocabulary as a hub folder does) and `save_pretrained` writes
`tokenizer.json` beside its other files (or `backend_tokenizer.save` writes that file alone).
The other way, training one with the `tokenizers` library, is what
tests/support/make_documents.py does for every document test.

usage: tokenizer_json_example.py OUTDIR SENTENCE...
writes OUTDIR/tokenizer.json (and OUTDIR/only/tokenizer.json) and prints
{"ids": [[…], …]}: the ids Python's tokenizer gives each sentence"""
import json
import os
import sys

from transformers import AutoTokenizer


def save_tokenizer_json(checkpoint, out):
    """`checkpoint`: a hub name ("distilbert-base-uncased-finetuned-sst-2-english") or a folder."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)  # a fast tokenizer: it has the file
    tokenizer.save_pretrained(out)  # writes out/tokenizer.json (and its config files)
    os.makedirs(os.path.join(out, "only"), exist_ok=True)
    tokenizer.backend_tokenizer.save(os.path.join(out, "only", "tokenizer.json"))  # that file alone
    return tokenizer


def local_checkpoint(folder, words):
    """A BERT checkpoint's tokenizer files, as a hub folder holds them (no network here)."""
    os.makedirs(folder, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + sorted(set(words))
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "bert"}, f)
    return folder


if __name__ == "__main__":
    out, sentences = sys.argv[1], sys.argv[2:]
    words = [w.strip(".").lower() for s in sentences for w in s.split()][:-1]  # one left unknown
    checkpoint = local_checkpoint(os.path.join(out, "checkpoint"), words)
    tokenizer = save_tokenizer_json(checkpoint, out)
    print(json.dumps({"ids": [tokenizer(s)["input_ids"] for s in sentences]}))
