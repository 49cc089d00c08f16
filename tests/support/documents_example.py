"""The tritonclient example for document inputs, as the docs show it: sentences,
and image files as they are, sent as BYTES with NVIDIA's client (PyPI tritonclient[http]).
Run by tests/documents.rs (`the_newcomer_examples_run_as_written`) against a text model
(input `text` with a `tokenizer` block) and an image model (input `image` with an `image`
block), each declaring its output `logits`.

usage: documents_example.py text URL MODEL SENTENCE...
       documents_example.py image URL MODEL FILE...
prints {"logits": [[…], …]}"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient  # pip install "tritonclient[http]"


def classify_texts(url, model, sentences):
    """Sentences to a model whose input `text` has a `tokenizer` block: one BYTES element each."""
    client = httpclient.InferenceServerClient(url)  # "localhost:5000"
    text = httpclient.InferInput("text", [len(sentences)], "BYTES")
    text.set_data_from_numpy(np.array(sentences, dtype=np.object_))  # UTF-8, as binary data
    return client.infer(model, [text]).as_numpy("logits")  # model: the metadata's "name"


def classify_images(url, model, paths):
    """JPEG or PNG files, as they are, to a model whose input `image` has an `image` block."""
    client = httpclient.InferenceServerClient(url)
    files = [open(p, "rb").read() for p in paths]
    image = httpclient.InferInput("image", [len(files)], "BYTES")
    image.set_data_from_numpy(np.array(files, dtype=np.object_))  # the bytes of each file
    return client.infer(model, [image]).as_numpy("logits")


if __name__ == "__main__":
    kind, url, model, items = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    run = classify_texts if kind == "text" else classify_images
    print(json.dumps({"logits": run(url, model, items).tolist()}))
