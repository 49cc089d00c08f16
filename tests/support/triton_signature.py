"""Drives a model with a declared signature through NVIDIA's own client (PyPI
tritonclient[http]) and prints what it saw as one JSON object; the Rust test
(tests/signature.rs) compares it with what torch computed (the *_expected.json fixtures).

usage: triton_signature.py URL MODEL pair|docs EXPECTED_JSON
  pair: two inputs (features FP32 [-1, 3], scale INT64 [-1]) -> scaled FP32, total FP64
  docs: one BYTES input (docs, a List[str]) -> lengths INT64 [-1, 2], first_word BYTES
Each is run with JSON and binary data in and out; every error is reported, none hidden."""
import json
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def plain(a):
    """A numpy output as JSON: BYTES elements decoded from UTF-8."""
    if a.dtype == np.object_:
        return [x.decode("utf-8") if isinstance(x, bytes) else x for x in a.reshape(-1).tolist()]
    return a.tolist()


def run(client, model, inputs, outputs, binary_in, binary_out):
    ins = []
    for name, array, datatype in inputs:
        i = httpclient.InferInput(name, list(array.shape), datatype)
        i.set_data_from_numpy(array, binary_data=binary_in)
        ins.append(i)
    outs = [httpclient.InferRequestedOutput(o, binary_data=binary_out) for o in outputs]
    r = client.infer(model, ins, outputs=outs, request_id="sig-1")
    resp = r.get_response()
    return {
        "id": resp.get("id"),
        "datatypes": {o["name"]: o["datatype"] for o in resp["outputs"]},
        "outputs": {o: plain(r.as_numpy(o)) for o in outputs},
    }


def main():
    url, model, kind, expected_path = sys.argv[1:5]
    with open(expected_path) as f:
        exp = json.load(f)
    client = httpclient.InferenceServerClient(url=url)
    report = {"model_ready": client.is_model_ready(model),
              "model_metadata": client.get_model_metadata(model), "runs": {}}
    if kind == "pair":
        # Inputs in the other order than declared: the server orders them by name.
        inputs = [("scale", np.array(exp["scale"], dtype=np.int64), "INT64"),
                  ("features", np.array(exp["features"], dtype=np.float32), "FP32")]
        outputs = ["scaled", "total"]
    else:
        docs = np.array([d.encode("utf-8") for d in exp["docs"]], dtype=np.object_)
        inputs = [("docs", docs, "BYTES")]
        outputs = ["lengths", "first_word"]
    for binary_in in (False, True):
        for binary_out in (False, True):
            key = f"in_{'bin' if binary_in else 'json'}_out_{'bin' if binary_out else 'json'}"
            try:
                report["runs"][key] = run(client, model, inputs, outputs, binary_in, binary_out)
            except InferenceServerException as e:
                report["runs"][key] = {"status": e.status(), "message": e.message()}
    # One output only, by name.
    report["only_second"] = run(client, model, inputs, outputs[1:], True, True)
    # A wrong datatype for the first declared input: the server's 400 names it.
    errs = {}
    try:
        name, array, _ = inputs[0]
        wrong = "FP32" if kind == "docs" else "BYTES"
        data = (np.array([[1.0]], dtype=np.float32) if wrong == "FP32"
                else np.array([b"x"] * array.size, dtype=np.object_).reshape(array.shape))
        bad = httpclient.InferInput(name, list(data.shape), wrong)
        bad.set_data_from_numpy(data)
        rest = []
        for n, a, d in inputs[1:]:
            i = httpclient.InferInput(n, list(a.shape), d)
            i.set_data_from_numpy(a)
            rest.append(i)
        client.infer(model, [bad] + rest)
    except InferenceServerException as e:
        errs["wrong_datatype"] = {"status": e.status(), "message": e.message()}
    report["errors"] = errs
    print(json.dumps(report))


if __name__ == "__main__":
    main()
