#!/usr/bin/env python3
"""Two builds of vramfork served side by side: `ab_builds.py DIR_A DIR_B [ROUNDS [WORD]]`, where each
DIR holds a release `app` and `app-worker` (e.g. target/release of two checkouts). For a
layout or refactoring change that must not change behaviour ("show one bench run
before and after").

Each round starts `app --production --workers 2 --torch-threads 1` from A and from B in turn
(the order alternating between rounds), for each request below, and runs wrk -t1 at c = 4 for
4 s after a 1 s warm-up; the ratio of a round is B ÷ A of that round, and the figure quoted is
the median of the rounds' ratios, so a slow minute of this shared machine hits both sides.
Requests: the MLP 64-256-256-16 (JSON), the CIFAR-style CNN as JSON and as v2 binary, built by
`scripts/bench --only shapes` / `--only real` in bench/tmp (run those once first); and the
smallest MLP and the CNN over gRPC (ModelInfer, the same values as raw FP32), through
grpc_bench.py's client (tritonclient.grpc, 4 calls in flight on one channel, 4 s after 1 s):
run this script with the torch venv's Python ($VRAMFORK_PYTHON) for those rows.
WORD keeps only the requests whose name contains it (e.g. MLP). Stdlib only; prints a Markdown
table."""
import os
import statistics
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (scripts/bench.d/run.py: Server, wrk, TMP)

GRPC = "grpc"  # a row served through gRPC's ModelInfer rather than wrk

REQUESTS = {
    "MLP 64-64-64-16, JSON": ("shapes/mlp64.json", "shapes/mlp64.body", None, "/"),
    "MLP 64-256-256-16, JSON": ("shapes/mlp256.json", "shapes/mlp256.body", None, "/"),
    "MLP 64-1024-1024-16, JSON": ("shapes/mlp1024.json", "shapes/mlp1024.body", None, "/"),
    "1-D conv net, JSON": ("shapes/conv1d.json", "shapes/conv1d.body", None, "/"),
    "transformer block, JSON": ("shapes/attention.json", "shapes/attention.body", None, "/"),
    "CNN, JSON": ("real/cnn.json", "real/cnn.body", None, "/"),
    "CNN, v2 binary": ("real/cnn.json", "real/cnn_v2.body", "real/cnn_v2.v2len",
                       "/v2/models/cnn/infer"),
    "MLP 64-64-64-16, gRPC": ("shapes/mlp64.json", "shapes/mlp64.body", None, GRPC),
    "CNN, gRPC": ("real/cnn.json", "real/cnn.body", None, GRPC),
}


def load(name):
    meta, body, v2len, path = REQUESTS[name]
    meta = os.path.join(run.TMP, meta)
    with open(os.path.join(run.TMP, body), "rb") as f:
        data = f.read()
    hl = None
    if v2len:
        with open(os.path.join(run.TMP, v2len)) as f:
            hl = int(f.read().strip())
    else:
        data = data.decode()
    return meta, data, hl, path


def grpc_request(meta, body):
    """(model name, its input's name, input shape, raw FP32 file) of a `POST /` JSON body's
    values."""
    import json
    with open(meta) as f:
        m = json.load(f)
    name = m["name"]
    input_name = (m.get("inputs") or [{"name": "input__0"}])[0]["name"]
    x = json.loads(body)["inputs"]
    shape, flat = [], x
    while isinstance(flat, list):
        shape.append(len(flat))
        flat = flat[0] if flat else None
    values = []

    def walk(v):
        if isinstance(v, list):
            for e in v:
                walk(e)
        else:
            values.append(float(v))
    walk(x)
    raw = os.path.join(run.TMP, f"ab-{name}.raw")
    with open(raw, "wb") as f:
        f.write(struct.pack(f"<{len(values)}f", *values))
    return name, input_name, shape, raw


def grpc_served(port, meta, body):
    """Calls/s of one 4 s gRPC run at 4 calls in flight (after a 1 s warm-up)."""
    import grpc_bench  # noqa: E402  (scripts/bench.d; its load processes need tritonclient)
    name, input_name, shape, raw = grpc_request(meta, body)
    m = {"name": name, "input": input_name, "shape": shape}
    grpc_bench.grpc_load(port, m, raw, 4, 1, 1)
    r = grpc_bench.grpc_load(port, m, raw, 4, 1, 4)
    if r["errors"]:
        raise RuntimeError(f"{name}: {r['errors']} failed gRPC calls")
    return r["rps"]


def served(bindir, name):
    """req/s of one 4 s wrk run at c = 4 against a fresh server from `bindir`."""
    meta, body, hl, path = load(name)
    run.BIN = bindir
    # wait_ready POSTs the model's JSON body to /; for the binary request, the JSON one.
    json_body = load(name.replace("v2 binary", "JSON"))[1]
    run.MODELS["ab"] = {"metadata": meta, "body": json_body}
    srv = run.Server("ab", 2, tag="ab", metadata=meta, extra=("--torch-threads", "1"))
    try:
        srv.wait_ready()
        if path == GRPC:
            return grpc_served(srv.port, meta, body)
        run.wrk(srv.port, body, 4, 1, path, hl)
        r = run.wrk(srv.port, body, 4, 4, path, hl)
        if r["failed"]:
            raise RuntimeError(f"{name} on {bindir}: {r['failed']} failed requests")
        return r["rps"]
    finally:
        srv.stop()


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: ab_builds.py DIR_A DIR_B [ROUNDS]")
    a, b = (os.path.abspath(d) for d in sys.argv[1:3])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    for d in (a, b):
        for exe in ("app", "app-worker"):
            if not os.access(os.path.join(d, exe), os.X_OK):
                sys.exit(f"ab_builds.py: {d}/{exe} is not an executable")
    word = sys.argv[4] if len(sys.argv) > 4 else ""
    rows = {}
    for name in (n for n in REQUESTS if word in n):
        ra, rb, ratios = [], [], []
        for i in range(rounds):
            order = (a, b) if i % 2 == 0 else (b, a)
            got = {d: served(d, name) for d in order}
            ra.append(got[a])
            rb.append(got[b])
            ratios.append(got[b] / got[a])
        rows[name] = (statistics.median(ra), statistics.median(rb), statistics.median(ratios),
                      min(ratios), max(ratios))
    print(f"A = `{a}`, B = `{b}`; {rounds} rounds, wrk -t1 -c4 -d4s (gRPC rows: tritonclient.grpc, "
          f"4 calls in flight on one channel, 4 s), 2 workers x 1 torch thread\n")
    print("| request | A req/s (median) | B req/s (median) | B ÷ A (median of rounds) | range |")
    print("|---|---:|---:|---:|---|")
    for name, (ma, mb, r, lo, hi) in rows.items():
        print(f"| {name} | {ma:.0f} | {mb:.0f} | {r:.2f} | {lo:.2f}–{hi:.2f} |")


if __name__ == "__main__":
    main()
