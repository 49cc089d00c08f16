"""The clients of tests/openai.rs against a server on PORT, as users call them; prints JSON.

    openai_client.py PORT sdk        stdin {"texts": [...], "dimensions": N|null}: the openai
                                     SDK's default call (it asks for base64) and with
                                     encoding_format="float": {"default": [...], "float": [...],
                                     "usage": {...}, "model": ...}
    openai_client.py PORT langchain  stdin {"texts": [...]}: langchain-openai's
                                     OpenAIEmbeddings with check_embedding_ctx_length=False
                                     ({"vectors": [...]}) and as made by default
                                     ({"default_error": {"status": ..., "message": ...}})
    openai_client.py PORT async_h2   stdin {"texts": [...]}: the SDK's AsyncOpenAI over HTTP/2
                                     (httpx with http2=True, http1=False: HTTP/2 with prior
                                     knowledge): all the texts in one request (its default,
                                     base64), then each text its own request, all in flight at
                                     once on the one connection: {"http_version": ...,
                                     "default": [...], "each": [...]}
    openai_client.py PORT base64_only stdin {"texts": [...]}: a client that reads base64 and
                                     nothing else, as .NET's does: encoding_format "base64",
                                     each embedding decoded as little-endian float32 and
                                     refused (exit 1) when it is not a base64 string:
                                     {"vectors": [...]}

LangChain's default tokenizes with tiktoken, whose encoding files come from the network; the
tests run without it, so a byte-level stand-in encoding gives LangChain its token ids: what it
sends is the same, arrays of ids.
"""
import json
import sys

import openai

port, mode = sys.argv[1], sys.argv[2]
req = json.load(sys.stdin)
base = "http://127.0.0.1:%s/v1" % port
texts = req["texts"]

if mode == "sdk":
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    extra = {"dimensions": req["dimensions"]} if req.get("dimensions") else {}
    default = client.embeddings.create(model="text-embedder", input=texts, **extra)
    floats = client.embeddings.create(model="text-embedder", input=texts, encoding_format="float", **extra)
    print(json.dumps({
        "default": [d.embedding for d in default.data],
        "float": [d.embedding for d in floats.data],
        "indices": [d.index for d in default.data],
        "usage": default.usage.model_dump(),
        "model": default.model,
    }))
elif mode == "langchain":
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    standin = tiktoken.Encoding(
        name="bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={}
    )
    tiktoken.encoding_for_model = lambda _name: standin
    tiktoken.get_encoding = lambda _name: standin
    common = dict(model="text-embedder", base_url=base, api_key="unused", max_retries=0)
    vectors = OpenAIEmbeddings(check_embedding_ctx_length=False, **common).embed_documents(texts)
    try:
        OpenAIEmbeddings(**common).embed_documents(texts)
        error = None
    except openai.APIStatusError as e:
        error = {"status": e.status_code, "message": e.body.get("message") if isinstance(e.body, dict) else str(e.body)}
    print(json.dumps({"vectors": vectors, "default_error": error}))
elif mode == "base64_only":
    import base64
    import struct
    import urllib.request

    body = json.dumps({"model": "text-embedder", "input": texts, "encoding_format": "base64"}).encode()
    asked = urllib.request.Request(base + "/embeddings", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(asked, timeout=60) as r:
        data = json.load(r)["data"]
    vectors = []
    for d in sorted(data, key=lambda d: d["index"]):
        if not isinstance(d["embedding"], str):
            sys.exit("embedding %d is not a base64 string: %.80s" % (d["index"], json.dumps(d["embedding"])))
        raw = base64.b64decode(d["embedding"], validate=True)
        vectors.append(list(struct.unpack("<%df" % (len(raw) // 4), raw)))
    print(json.dumps({"vectors": vectors}))
elif mode == "async_h2":
    import asyncio

    import httpx

    async def run():
        async with httpx.AsyncClient(http1=False, http2=True) as http:
            client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)
            raw = await client.embeddings.with_raw_response.create(model="text-embedder", input=texts)
            default = raw.parse()
            each = await asyncio.gather(*(
                client.embeddings.create(model="text-embedder", input=[t], encoding_format="float")
                for t in texts))
            return {
                "http_version": raw.http_response.http_version,
                "default": [d.embedding for d in default.data],
                "each": [e.data[0].embedding for e in each],
            }

    print(json.dumps(asyncio.run(run())))
