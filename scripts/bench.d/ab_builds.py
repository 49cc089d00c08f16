#!/usr/bin/env python3
"""Two builds of vramfork served side by side: `ab_builds.py DIR_A DIR_B [ROUNDS [WORD]]`, where each
DIR holds a release `app` and `app-worker` (e.g. target/release of two checkouts). For a
layout or refactoring change that must not change behaviour (issue 42: "show one bench run
before and after").

Each round starts `app --production --workers 2 --torch-threads 1` from A and from B in turn
(the order alternating between rounds), for each request below, and runs wrk -t1 at c = 4 for
4 s after a 1 s warm-up; the ratio of a round is B ÷ A of that round, and the figure quoted is
the median of the rounds' ratios, so a slow minute of this shared machine hits both sides.
Requests: the issue-40 MLP (JSON), the CIFAR-style CNN as JSON and as v2 binary, built by
`scripts/bench --only shapes` / `--only real` in bench/tmp (run those once first).
WORD keeps only the requests whose name contains it (e.g. MLP). Stdlib only; prints a Markdown
table."""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (scripts/bench.d/run.py: Server, wrk, TMP)

REQUESTS = {
    "MLP 64-64-64-16, JSON": ("shapes/mlp64.json", "shapes/mlp64.body", None, "/"),
    "MLP 64-256-256-16, JSON": ("shapes/mlp256.json", "shapes/mlp256.body", None, "/"),
    "MLP 64-1024-1024-16, JSON": ("shapes/mlp1024.json", "shapes/mlp1024.body", None, "/"),
    "1-D conv net, JSON": ("shapes/conv1d.json", "shapes/conv1d.body", None, "/"),
    "transformer block, JSON": ("shapes/attention.json", "shapes/attention.body", None, "/"),
    "CNN, JSON": ("real/cnn.json", "real/cnn.body", None, "/"),
    "CNN, v2 binary": ("real/cnn.json", "real/cnn_v2.body", "real/cnn_v2.v2len",
                       "/v2/models/cnn/infer"),
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
    print(f"A = `{a}`, B = `{b}`; {rounds} rounds, wrk -t1 -c4 -d4s, 2 workers x 1 torch thread\n")
    print("| request | A req/s (median) | B req/s (median) | B ÷ A (median of rounds) | range |")
    print("|---|---:|---:|---:|---|")
    for name, (ma, mb, r, lo, hi) in rows.items():
        print(f"| {name} | {ma:.0f} | {mb:.0f} | {r:.2f} | {lo:.2f}–{hi:.2f} |")


if __name__ == "__main__":
    main()
