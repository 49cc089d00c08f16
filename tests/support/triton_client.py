"""Drives vramfork's v2 endpoints with NVIDIA's own client (PyPI tritonclient[http]) and
prints what it saw as one JSON object; the Rust test (tests/v2.rs) checks it.

usage: triton_client.py URL MODEL CASES_JSON [CLIENTS REQUESTS]
  CASES_JSON: tests/fixtures/mlp_expected.json ({"cases": [{"inputs", "outputs"}]})
  with CLIENTS and REQUESTS: only the concurrency run (CLIENTS threads, REQUESTS each)."""
import json
import sys
import threading

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def infer(client, model, x, binary_in, binary_out, request_id=None, outputs=True):
    inp = httpclient.InferInput("input__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    outs = [httpclient.InferRequestedOutput("output__0", binary_data=binary_out)] if outputs else None
    kw = {"request_id": request_id} if request_id else {}
    return client.infer(model, [inp], outputs=outs, **kw)


def main():
    url, model, cases_path = sys.argv[1:4]
    client = httpclient.InferenceServerClient(url=url, concurrency=4)
    if len(sys.argv) > 4:
        clients, requests = int(sys.argv[4]), int(sys.argv[5])
        errors, done = [], [0]
        lock = threading.Lock()

        def run():
            c = httpclient.InferenceServerClient(url=url)
            x = np.array([[1, 2, 3, 4]], dtype=np.float32)
            for i in range(requests):
                try:
                    r = infer(c, model, x, binary_in=i % 2 == 0, binary_out=i % 3 == 0)
                    r.as_numpy("output__0")
                    with lock:
                        done[0] += 1
                except Exception as e:  # every failure is reported, none hidden
                    with lock:
                        errors.append(repr(e))

        threads = [threading.Thread(target=run) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"done": done[0], "errors": errors}))
        return
    report = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready(model),
        "server_metadata": client.get_server_metadata(),
        "model_metadata": client.get_model_metadata(model),
        "cases": [],
    }
    with open(cases_path) as f:
        cases = json.load(f)["cases"]
    for case in cases:
        x = np.array(case["inputs"], dtype=np.float32)
        seen = {}
        for binary_in in (False, True):
            for binary_out in (False, True):
                r = infer(client, model, x, binary_in, binary_out, request_id="req-7")
                resp = r.get_response()
                out = r.as_numpy("output__0")
                seen[f"in_{'bin' if binary_in else 'json'}_out_{'bin' if binary_out else 'json'}"] = {
                    "output": out.tolist(),
                    "dtype": str(out.dtype),
                    "id": resp.get("id"),
                    "model_name": resp.get("model_name"),
                }
        # No outputs named: every output, as JSON.
        r = infer(client, model, x, False, False, outputs=False)
        seen["all_outputs"] = {"output": r.as_numpy("output__0").tolist()}
        report["cases"].append({"expected": case["outputs"], "seen": seen})
    # Errors the client reports with the server's message and status.
    errs = {}
    try:
        client.get_model_metadata("no-such-model")
    except InferenceServerException as e:
        errs["unknown_model"] = {"status": e.status(), "message": e.message()}
    try:
        bad = httpclient.InferInput("input__0", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        client.infer(model, [bad])
    except InferenceServerException as e:
        errs["bad_shape"] = {"status": e.status(), "message": e.message()}
    try:
        ok = httpclient.InferInput("input__0", [1, 4], "FP32")
        ok.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        client.infer(model, [ok], outputs=[httpclient.InferRequestedOutput("nope")])
    except InferenceServerException as e:
        errs["unknown_output"] = {"status": e.status(), "message": e.message()}
    report["errors"] = errs
    print(json.dumps(report))


if __name__ == "__main__":
    main()
