"""Sends one v2 inference with NVIDIA's own client (PyPI tritonclient[http]) and its
`timeout=` argument (microseconds, sent as the request's `parameters.timeout`), and prints
what came back as one JSON object; tests/deadlines.rs checks it.

usage: triton_timeout.py URL MODEL N TIMEOUT_US
  N: slow.pt's iteration count (its input [[N]]); TIMEOUT_US: the client's timeout."""
import json
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def main():
    url, model, n, timeout_us = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    client = httpclient.InferenceServerClient(url=url)
    inp = httpclient.InferInput("input__0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[n]], dtype=np.float32), binary_data=False)
    start = time.monotonic()
    try:
        r = client.infer(model, [inp], timeout=timeout_us)
        out = {"ok": True, "output": r.as_numpy("output__0").tolist()}
    except InferenceServerException as e:
        out = {"ok": False, "status": e.status(), "message": e.message()}
    out["elapsed_s"] = time.monotonic() - start
    print(json.dumps(out))


if __name__ == "__main__":
    main()
