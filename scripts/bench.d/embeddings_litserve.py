#!/usr/bin/env python3
"""The Python server the embeddings bench compares with: sentence-transformers behind
LitServe's OpenAI embeddings spec (`OpenAIEmbeddingSpec`, `POST /v1/embeddings`), on the CPU,
2 workers of 1 torch thread each (the vramfork side's 2 workers x 1 thread), the model read
from the Hugging Face folder embeddings_model.py writes (`models.Transformer` +
`Pooling("mean")` + `Normalize`: the same vectors as pooled.pt).

MAX_BATCH 1: each request's inputs encoded together (LitServe refuses a request of several
inputs when it batches across requests); above 1: requests of one input each batched across
requests, up to MAX_BATCH, waiting at most 5 ms for more. MAX_LENGTH (default 128): the
tokens an input is cut to, as the vramfork side's `max_length`.

Usage: embeddings_litserve.py HF_FOLDER PORT MAX_BATCH [MAX_LENGTH]
"""
import sys

import litserve as ls
import torch
from litserve.specs import OpenAIEmbeddingSpec
from sentence_transformers import SentenceTransformer, models

FOLDER, PORT, MAX_BATCH = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
MAX_LENGTH = int(sys.argv[4]) if len(sys.argv) > 4 else 128


class Embedder(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        word = models.Transformer(FOLDER, max_seq_length=MAX_LENGTH)
        pool = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
        self.model = SentenceTransformer(modules=[word, pool, models.Normalize()], device="cpu")

    def predict(self, inputs):
        # One request's input (a string or a list of them), or, batching, one input of each
        # request batched (each a string or a list of one).
        texts = []
        for x in [inputs] if isinstance(inputs, str) else inputs:
            texts.extend([x] if isinstance(x, str) else x)
        with torch.inference_mode():
            return self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True)


if __name__ == "__main__":
    api = Embedder(max_batch_size=MAX_BATCH, batch_timeout=0.005 if MAX_BATCH > 1 else 0.0,
                   spec=OpenAIEmbeddingSpec())
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=2)
    server.run(port=PORT, host="127.0.0.1", generate_client_file=False)
