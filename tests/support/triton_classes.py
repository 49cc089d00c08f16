"""tritonclient's `class_count` (the Open Inference Protocol's classification extension)
against a text classifier served on PORT, over HTTP and gRPC (the same port); prints JSON.

    triton_classes.py PORT MODEL COUNT  stdin {"texts": [...]}: the texts as a BYTES input
                                        "text", output__0 asked with class_count=COUNT, over
                                        HTTP (binary data and JSON) and gRPC:
                                        {"http": [[[score, index, label], ...], ...],
                                         "http_json": ..., "grpc": ...}
"""
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

port, model, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = json.load(sys.stdin)["texts"]
data = np.array([t.encode() for t in texts], dtype=np.object_)


def parsed(array):
    """Each row's classes as [score, index, label] (label "" when none)."""
    rows = []
    for row in array:
        items = []
        for item in row:
            text = item.decode() if isinstance(item, bytes) else item  # JSON data: str
            score, index, *label = text.split(":", 2)
            items.append([float(score), int(index), label[0] if label else ""])
        rows.append(items)
    return rows


out = {}
for name, binary in (("http", True), ("http_json", False)):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = httpclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(data, binary_data=binary)
    asked = httpclient.InferRequestedOutput("output__0", binary_data=binary, class_count=count)
    out[name] = parsed(client.infer(model, [inp], outputs=[asked]).as_numpy("output__0"))
client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
inp = grpcclient.InferInput("text", [len(texts)], "BYTES")
inp.set_data_from_numpy(data)
asked = grpcclient.InferRequestedOutput("output__0", class_count=count)
out["grpc"] = parsed(client.infer(model, [inp], outputs=[asked]).as_numpy("output__0"))
print(json.dumps(out))
