"""The cohere SDK against a server on PORT, as its users call it with `base_url`; prints JSON.

    cohere_client.py PORT   stdin {"query": ..., "documents": [...], "top_n": N|null}:
                            ClientV2.rerank (POST /v2/rerank) and Client.rerank with
                            return_documents=True (POST /v1/rerank):
                            {"v2": [{"index", "relevance_score"}...],
                             "v1": [{"index", "relevance_score", "text"}...], "v2_tokens": N}
"""
import json
import sys

import cohere

port = sys.argv[1]
asked = json.load(sys.stdin)
base = f"http://127.0.0.1:{port}"
kw = {"model": "cross", "query": asked["query"], "documents": asked["documents"]}
if asked.get("top_n") is not None:
    kw["top_n"] = asked["top_n"]
v2 = cohere.ClientV2(api_key="unused", base_url=base).rerank(**kw)
v1 = cohere.Client(api_key="unused", base_url=base).rerank(return_documents=True, **kw)
print(json.dumps({
    "v2": [{"index": r.index, "relevance_score": r.relevance_score} for r in v2.results],
    "v2_tokens": v2.meta.tokens.input_tokens if v2.meta and v2.meta.tokens else None,
    "v1": [{"index": r.index, "relevance_score": r.relevance_score, "text": r.document.text}
           for r in v1.results],
}))
