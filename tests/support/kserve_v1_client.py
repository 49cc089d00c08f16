"""KServe's v1 protocol through KServe's own REST client (PyPI kserve, InferenceRESTClient
with protocol "v1"), and OpenAI's SDK listing the same server's models; prints what both
saw as one JSON object. The Rust test (tests/torchserve.rs) compares the predictions with
what torch computed.

usage: kserve_v1_client.py BASE_URL MODEL   (stdin: {"cases": [{"inputs": [[...], ...]}]})"""
import asyncio
import json
import sys

import openai
from kserve import InferenceRESTClient, RESTConfig


async def main():
    base, model = sys.argv[1:3]
    cases = json.load(sys.stdin)["cases"]
    client = InferenceRESTClient(RESTConfig(protocol="v1"))
    out = {"live": await client.is_server_live(base),
           "ready": await client.is_model_ready(base, model), "predictions": []}
    for case in cases:
        answer = await client.infer(base, {"instances": case["inputs"]}, model_name=model)
        out["predictions"].append(answer["predictions"])
    sdk = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    out["openai_ids"] = [m.id for m in sdk.models.list().data]
    out["openai_retrieved"] = sdk.models.retrieve(model).id
    print(json.dumps(out))


asyncio.run(main())
