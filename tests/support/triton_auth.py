"""One v2 inference with NVIDIA's own client (PyPI tritonclient[http]) carrying the given
`Authorization` header through its `headers=` argument (none when KEY is empty), and its
health check without one; prints what came back as one JSON object (tests/auth.rs).

usage: triton_auth.py URL MODEL KEY"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def ready_and_infer(client, model, headers=None):
    """The server's readiness and one inference of the MLP fixture's input through
    `client`: {"ready", "ok", "output"} or {"ready", "ok": false, "status", "message"}.
    tests/support/tls_client.py uses it too."""
    out = {"ready": client.is_server_ready()}
    inp = httpclient.InferInput("input__0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.array([[1, 2, 3, 4]], dtype=np.float32), binary_data=True)
    try:
        r = client.infer(model, [inp], headers=headers)
        out["ok"] = True
        out["output"] = r.as_numpy("output__0").tolist()
    except InferenceServerException as e:
        out["ok"] = False
        out["status"] = e.status()
        out["message"] = e.message()
    return out


def main():
    url, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
    client = httpclient.InferenceServerClient(url=url)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    print(json.dumps(ready_and_infer(client, model, headers)))


if __name__ == "__main__":
    main()
