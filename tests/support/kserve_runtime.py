"""Calls a server launched as KServe's serving runtime launches it, by the InferenceService's
name, with both v2 clients a KServe user has: KServe's own (PyPI kserve, InferenceRESTClient
with the v2 protocol) and NVIDIA's (PyPI tritonclient[http]). Prints what each saw as one
JSON object; the Rust test (tests/kserve.rs) compares the outputs with what torch computed.

usage: kserve_runtime.py HOST:PORT MODEL CASES_JSON
  CASES_JSON: tests/fixtures/mlp_expected.json ({"cases": [{"inputs", "outputs"}]})"""
import asyncio
import json
import sys

import numpy as np
import tritonclient.http as httpclient
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from tritonclient.utils import InferenceServerException


async def with_kserve(base, model, cases):
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    seen = {
        "live": await client.is_server_live(base),
        "ready": await client.is_server_ready(base),
        "model_ready": await client.is_model_ready(base, model),
        "outputs": [],
    }
    for i, case in enumerate(cases):
        x = np.array(case["inputs"], dtype=np.float32)
        binary = i % 2 == 1
        inp = InferInput("input__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        res = await client.infer(base, InferRequest(model, [inp], request_id=f"ks-{i}"),
                                 model_name=model)
        seen["outputs"].append({"model_name": res.model_name, "id": res.id,
                                "output": res.outputs[0].as_numpy().tolist()})
    await client.close()
    return seen


def with_triton(url, model, cases):
    client = httpclient.InferenceServerClient(url=url)
    meta = client.get_model_metadata(model)
    seen = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready(model),
        "metadata_name": meta["name"],
        "outputs": [],
    }
    for i, case in enumerate(cases):
        x = np.array(case["inputs"], dtype=np.float32)
        inp = httpclient.InferInput("input__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=i % 2 == 0)
        out = httpclient.InferRequestedOutput("output__0", binary_data=i % 2 == 0)
        res = client.infer(model, [inp], outputs=[out], request_id=f"tr-{i}")
        seen["outputs"].append({"model_name": res.get_response()["model_name"],
                                "output": res.as_numpy("output__0").tolist()})
    # Only the InferenceService's name is served.
    seen["other_name_ready"] = client.is_model_ready("not-" + model)
    try:
        client.get_model_metadata("not-" + model)
        seen["other_name_metadata"] = "answered"
    except InferenceServerException as e:
        seen["other_name_metadata"] = str(e.status())
    return seen


def main():
    url, model, cases_path = sys.argv[1:4]
    with open(cases_path) as f:
        cases = json.load(f)["cases"]
    report = {
        "kserve": asyncio.run(with_kserve(f"http://{url}", model, cases)),
        "triton": with_triton(url, model, cases),
        "expected": [c["outputs"] for c in cases],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
