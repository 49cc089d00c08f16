"""Drives a model with a declared signature through KServe's own REST client (PyPI kserve,
InferenceRESTClient with the v2 protocol) and prints what it saw as one JSON object; the
Rust test (tests/signature.rs) compares it with what torch computed.

usage: kserve_client.py BASE_URL MODEL pair|docs EXPECTED_JSON   (BASE_URL: http://host:port)"""
import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput


def plain(a):
    if a.dtype == np.object_:
        return [x.decode("utf-8") if isinstance(x, bytes) else x for x in a.reshape(-1).tolist()]
    return a.tolist()


async def main():
    base, model, kind, expected_path = sys.argv[1:5]
    with open(expected_path) as f:
        exp = json.load(f)
    if kind == "pair":
        arrays = [("features", np.array(exp["features"], dtype=np.float32), "FP32"),
                  ("scale", np.array(exp["scale"], dtype=np.int64), "INT64")]
        outputs = ["scaled", "total"]
    else:
        arrays = [("docs", np.array([d.encode("utf-8") for d in exp["docs"]], dtype=np.object_),
                   "BYTES")]
        outputs = ["lengths", "first_word"]
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    report = {
        "live": await client.is_server_live(base),
        "ready": await client.is_server_ready(base),
        "model_ready": await client.is_model_ready(base, model),
        "runs": {},
    }
    for binary in (False, True):
        inputs = []
        for name, array, datatype in arrays:
            i = InferInput(name, list(array.shape), datatype)
            i.set_data_from_numpy(array, binary_data=binary)
            inputs.append(i)
        req = InferRequest(model, inputs, request_id="ks-1",
                           request_outputs=[RequestedOutput(o, {"binary_data": binary})
                                            for o in outputs])
        res = await client.infer(base, req, model_name=model)
        report["runs"]["binary" if binary else "json"] = {
            "id": res.id,
            "model_name": res.model_name,
            "datatypes": {o.name: o.datatype for o in res.outputs},
            "outputs": {o.name: plain(o.as_numpy()) for o in res.outputs},
        }
    await client.close()
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
