"""The clients of tests/priority.rs, each asking for a priority the way its users do; prints
one JSON object of what each call got.

    priority_clients.py triton HOST:PORT MODEL   tritonclient's `priority` argument, over v2
                                                 REST (tritonclient.http) and gRPC
                                                 (tritonclient.grpc): levels 1 and 3, each
                                                 with its X-Request-Id, then levels 7 (past
                                                 the three levels) and, over REST, a string:
                                                 {"rest": ..., "grpc": ..., "errors": {...}}
    priority_clients.py openai PORT              the openai SDK's embeddings call with vLLM's
                                                 `priority` in `extra_body` (-1, then 4),
                                                 each with its X-Request-Id, then a string:
                                                 {"ok": [...], "error": {status, message}}
"""
import json
import sys

import numpy as np


def triton(url, model):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    x = np.array([[1.0]], dtype=np.float32)
    out = {"rest": [], "grpc": [], "errors": {}}
    rest = httpclient.InferenceServerClient(url=url)
    grpc = grpcclient.InferenceServerClient(url=url)

    def rest_call(priority, rid):
        inp = httpclient.InferInput("input__0", [1, 1], "FP32")
        inp.set_data_from_numpy(x)
        return rest.infer(model, [inp], priority=priority, headers={"X-Request-Id": rid})

    def grpc_call(priority, rid):
        inp = grpcclient.InferInput("input__0", [1, 1], "FP32")
        inp.set_data_from_numpy(x)
        return grpc.infer(model, [inp], priority=priority, headers={"x-request-id": rid})

    for level in (1, 3):
        rest_call(level, "rest-%d" % level)
        out["rest"].append("rest-%d" % level)
        grpc_call(level, "grpc-%d" % level)
        out["grpc"].append("grpc-%d" % level)
    for name, call in (("rest", rest_call), ("grpc", grpc_call)):
        try:
            call(7, "%s-bad" % name)
            out["errors"][name] = None
        except InferenceServerException as e:
            out["errors"][name] = {"status": str(e.status()), "message": e.message()}
    # A string where Triton takes a whole number: the REST body as tritonclient would send it.
    import urllib.request

    body = json.dumps({"parameters": {"priority": "high"},
                       "inputs": [{"name": "input__0", "shape": [1, 1], "datatype": "FP32", "data": [1]}]})
    req = urllib.request.Request("http://%s/v2/models/%s/infer" % (url, model.replace(" ", "%20")),
                                 data=body.encode(), method="POST")
    try:
        urllib.request.urlopen(req)
        out["errors"]["rest_string"] = None
    except urllib.error.HTTPError as e:
        out["errors"]["rest_string"] = {"status": e.code, "message": json.loads(e.read())["error"]}
    print(json.dumps(out))


def openai_sdk(port):
    import openai

    client = openai.OpenAI(base_url="http://127.0.0.1:%s/v1" % port, api_key="unused", max_retries=0)
    ok = []
    for priority, rid in ((-1, "sdk-high"), (4, "sdk-low")):
        r = client.embeddings.create(model="text-embedder", input=["a priority test"],
                                     extra_body={"priority": priority},
                                     extra_headers={"X-Request-Id": rid})
        ok.append({"id": rid, "vectors": len(r.data)})
    try:
        client.embeddings.create(model="text-embedder", input=["x"], extra_body={"priority": "urgent"})
        error = None
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        error = {"status": e.status_code, "message": body.get("message", str(e)), "param": e.param}
    print(json.dumps({"ok": ok, "error": error}))


if sys.argv[1] == "triton":
    triton(sys.argv[2], sys.argv[3])
else:
    openai_sdk(sys.argv[2])
