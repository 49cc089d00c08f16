#!/usr/bin/env python3
"""The Python server the rerank bench compares with: sentence-transformers' `CrossEncoder`
behind LitServe, on the CPU, 2 workers of 1 torch thread each (the vramfork side's 2 workers x
1 thread), the model read from the Hugging Face folder rerank_model.py writes (the same weights
and tokenizer as cross.pt).

`POST /v1/rerank` takes the body vramfork's Jina/Cohere door takes (`query`, `documents` as
strings, `top_n`) and answers `{"results": [{"index", "relevance_score"}]}`, best first: the
scores `CrossEncoder.predict` gives (its default activation, sigmoid for one logit), each
request's documents predicted together in batches of 32 (the vramfork side's
`max_batch_size`), longest first as `predict` sorts them.

Usage: rerank_litserve.py HF_FOLDER PORT MAX_LENGTH
"""
import sys

import litserve as ls
import torch
from sentence_transformers import CrossEncoder

FOLDER, PORT, MAX_LENGTH = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


class Reranker(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        self.model = CrossEncoder(FOLDER, max_length=MAX_LENGTH, device="cpu")

    def decode_request(self, request):
        docs = [d if isinstance(d, str) else d["text"] for d in request["documents"]]
        return request["query"], docs, request.get("top_n") or len(docs)

    def predict(self, x):
        query, docs, top_n = x
        with torch.inference_mode():
            scores = self.model.predict([(query, d) for d in docs], batch_size=32,
                                        convert_to_numpy=True)
        best = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n]
        return [{"index": i, "relevance_score": float(scores[i])} for i in best]

    def encode_response(self, results):
        return {"results": results}


if __name__ == "__main__":
    api = Reranker(max_batch_size=1, api_path="/v1/rerank")
    # No request timeout (LitServe's default is 30 s): the bench's queues of 1,000-document
    # requests last minutes, and vramfork's side runs without a bound too.
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=2, timeout=False)
    server.run(port=PORT, host="127.0.0.1", generate_client_file=False)
