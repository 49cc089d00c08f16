"""Sends documents with NVIDIA's own client (PyPI tritonclient[http]): the files named, as
one BYTES input of raw bytes (binary data, as a client sends images), or the sentences
given on stdin (one per line) as BYTES strings in JSON; prints the first output as JSON.
tests/documents.rs compares it with what Python gives.

usage: triton_documents.py URL MODEL INPUT (--files F… | --text)"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient


def main():
    url, model, name, mode = sys.argv[1:5]
    if mode == "--files":
        items = [open(f, "rb").read() for f in sys.argv[5:]]
        binary = True
    else:
        items = [l.encode() for l in sys.stdin.read().splitlines()]
        binary = False
    client = httpclient.InferenceServerClient(url=url)
    inp = httpclient.InferInput(name, [len(items)], "BYTES")
    inp.set_data_from_numpy(np.array(items, dtype=np.object_), binary_data=binary)
    r = client.infer(model, [inp])
    out = r.get_response()["outputs"][0]["name"]
    print(json.dumps({"output": r.as_numpy(out).tolist()}))


if __name__ == "__main__":
    main()
