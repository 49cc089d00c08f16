#!/usr/bin/env python3
"""scripts/bench --only rerank: documents reranked a second through `POST /v1/rerank`.

One cross-encoder of ms-marco-MiniLM-L6-v2's shape (random weights; rerank_model.py), the same
weights and tokenizer (max_length 128) on two sides, each on 2 workers of 1 torch thread:

- *vramfork*: `app --production` with a `rerank` block, answering Jina's and Cohere v1's
  `POST /v1/rerank` (pairs tokenized in the worker, run shortest first in passes of at most
  `max_batch_size` 32);
- *Python*: sentence-transformers' `CrossEncoder` behind LitServe (rerank_litserve.py), the
  same request body, `predict` over each request's documents in batches of 32.

One query against 100 and 1,000 documents of mixed length (most one sentence, a tail cut at
128 tokens), at c = 1, 4 and 16 clients (`--quick`: 100 documents only, one round). Neither
side bounds a request's wait (vramfork's `--max-queue-wait 0`, LitServe's `timeout=False`).
Before timing, both sides' scores for every document must agree within 1e-4 (else the bench
stops: the sides would not be the same model).

A request of 100 documents takes seconds on two shared cores and one of 1,000 most of a
minute, past wrk's timeout once clients queue, so the load is a closed loop of Python threads
(one keep-alive connection each, no timeout that matters) with a fixed number of requests a
run, each taken by whichever client is free (common.closed_loop): the run's documents/s is the
documents answered ÷ its wall time, and p50/p99 come from every request of the cell's runs. The sides run
interleaved (the order alternating from round to round). vramfork's access log says which
worker answered each request (a keep-alive connection stays with the worker that accepted
it). Writes bench/rerank.{json,md}.

Usage: rerank.py --command CMD [--quick]
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as R  # noqa: E402
from common import OUT, ROOT, TMP, App, answered_by_worker, closed_loop, free_port, get, log  # noqa: E402
from common import median, pct, worker_share  # noqa: E402

PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)
MODEL = "reranker"
DIR = os.path.join(TMP, "rerank")
PATH = "/v1/rerank"
SIDES = ("vramfork", "python")
LOG = os.path.join(TMP, "log-rerank.txt")


def body(query, docs):
    return json.dumps({"model": MODEL, "query": query, "documents": docs,
                       "return_documents": False}).encode()


def post(conn, payload):
    """POST `payload` on an open connection: (status, answer bytes)."""
    conn.request("POST", PATH, body=payload, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


def scores(port, query, docs):
    """{index: relevance_score} for every document, from one request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    try:
        status, got = post(c, body(query, docs))
    finally:
        c.close()
    if status != 200:
        raise SystemExit(f"rerank: port {port} answered {status}: {got[:300]!r}")
    return {r["index"]: r["relevance_score"] for r in json.loads(got)["results"]}


def same_scores(ports, query, docs):
    """The largest |difference| between the two sides' scores for `docs`; stops the bench
    above 1e-4 or when a document is missing."""
    want, got = (scores(ports[k], query, docs) for k in SIDES)
    if sorted(want) != list(range(len(docs))) or sorted(got) != list(range(len(docs))):
        raise SystemExit(f"rerank: {len(docs)} documents, answered {len(want)} and {len(got)}")
    d = max(abs(want[i] - got[i]) for i in want)
    spread = max(want.values()) - min(want.values())
    log(f"rerank: Python vs vramfork: max |Δ| {d:.2e} over {len(docs)} scores "
        f"(scores spread over {spread:.3f})")
    if d > 1e-4:
        raise SystemExit(f"rerank: the Python side scores otherwise than vramfork (max |Δ| {d})")
    return d


def load(port, payload, clients, per_client):
    """`clients` closed-loop clients, each on its own keep-alive connection, sending
    `payload` `clients` x `per_client` times in all: wall seconds, every answered request's
    latency (ms), and the failures by status (0: no answer)."""
    return closed_loop(port, PATH, [payload] * (clients * per_client), clients)


def by_worker():
    """Rerank requests answered so far by each vramfork worker (common.by_worker): a
    keep-alive connection stays with the worker that accepted it, so a few connections of
    second-long requests may load one worker more than the other. {slot: requests}."""
    return answered_by_worker(LOG, PATH)


def cell(ports, payload, n, c, per_client, reps):
    """One (documents, clients) cell: `reps` interleaved runs a side."""
    before = by_worker()
    runs = R.interleaved(list(SIDES), reps, lambda k: load(ports[k], payload, c, per_client))
    row = {"docs": n, "c": c, "requests_per_run": c * per_client, "reps": reps}
    for k, rs in runs.items():
        lat = [x for _, ls, _ in rs for x in ls]
        per_run = [len(ls) * n / secs for secs, ls, _ in rs]
        row[k] = {"docs_s": median(per_run), "docs_s_all": [round(x, 1) for x in per_run],
                  "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "requests": len(lat),
                  "failed": sum(sum(f.values()) for _, _, f in rs),
                  "failed_by_status": {str(st): sum(f.get(st, 0) for _, _, f in rs)
                                       for st in {st for _, _, f in rs for st in f}}}
    row["vramfork"]["by_worker"] = worker_share(LOG, PATH, before, row["vramfork"]["requests"])
    py = row["python"]["docs_s"]
    row["ratio"] = row["vramfork"]["docs_s"] / py if py else None
    log(f"rerank {n} docs c={c}: vramfork {row['vramfork']['docs_s']:.0f}, Python "
        f"{row['python']['docs_s']:.0f} docs/s ({fmt(row['ratio'])}); p50 "
        f"{row['vramfork']['p50_ms']:.0f} / {row['python']['p50_ms']:.0f} ms; failed "
        f"{[row[k]['failed'] for k in SIDES]}; vramfork's requests by worker "
        f"{row['vramfork']['by_worker']}")
    return row


def vramfork(max_length):
    meta = os.path.join(DIR, "app-metadata.json")
    with open(meta, "w") as f:
        json.dump({"name": MODEL, "model": "cross.pt", "max_batch_size": 32,
                   "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                               "tokenizer": {"file": "tokenizer.json", "max_length": max_length,
                                             "feeds": ["input_ids", "attention_mask",
                                                       "token_type_ids"]}}],
                   "rerank": {}}, f)
    port = free_port()
    # The access log: which worker answered each request (by_worker); a line per request of a
    # second or more costs nothing measurable. Unbounded waits on both sides (here and LitServe's timeout): 16 clients of 1,000
    # documents queue for minutes on two cores, and the bench measures the serving, not each
    # server's refusal policy.
    app = App(["--metadata", meta, "--port", str(port), "--workers", "2", "--torch-threads", "1",
               "--max-queue-wait", "0", "--request-timeout", "1800", "--access-log"], LOG)
    app.wait_ready(port, 300)
    return app, port


def litserve(max_length):
    port = free_port()
    srv = App.other([PY, os.path.join(HERE, "rerank_litserve.py"), os.path.join(DIR, "hf"),
                     str(port), str(max_length)], os.path.join(TMP, "log-rerank-litserve.txt"))
    srv.wait(lambda: get(port, "/health", timeout=2)[0] == 200, 600)
    return srv, port


def fmt(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


# Requests a run, by (documents a request, clients): every client sends at least one, and
# fewer clients send several, so that a run is more than one request's wall time; few enough
# that the 1,000-document rows (ten seconds and more a request here) fit.
REQUESTS = {(100, 1): 8, (100, 4): 8, (100, 16): 16, (1000, 1): 2, (1000, 4): 4, (1000, 16): 16}
QUICK_REQUESTS = {(100, 1): 3, (100, 4): 8, (100, 16): 16}


def per_client(n, c, quick):
    return (QUICK_REQUESTS if quick else REQUESTS)[(n, c)] // c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    sizes, reps = ((100,), 1) if a.quick else ((100, 1000), 2)
    subprocess.run([PY, os.path.join(HERE, "rerank_model.py"), DIR], check=True,
                   stderr=subprocess.DEVNULL)
    with open(os.path.join(DIR, "documents.json")) as f:
        d = json.load(f)
    query, documents, max_length = d["query"], d["documents"], d["max_length"]
    rows, checks = [], []
    vf, vf_port = vramfork(max_length)
    py, py_port = litserve(max_length)
    ports = {"vramfork": vf_port, "python": py_port}
    try:
        for n in sizes:
            docs = documents[:n]
            checks.append(same_scores(ports, query, docs))  # and a warm-up of each side
            for c in (1, 4, 16):
                # The 1,000-document rows: one round a side (each a minute or more at c=16).
                rows.append(cell(ports, body(query, docs), n, c, per_client(n, c, a.quick),
                                 reps if n <= 100 else 1))
    finally:
        py.stop()
        vf.stop()
    write(a, max_length, rows, max(checks))


def write(a, max_length, rows, worst):
    res = {"command": a.command, "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "bin": os.path.relpath(R.BIN, ROOT), "cpus": os.cpu_count(), "max_length": max_length,
           "max_abs_diff": worst, "rows": rows}
    with open(os.path.join(OUT, "rerank.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# Rerank through `POST /v1/rerank`\n\n`{a.command}`, {res['when']}, binaries of "
          f"`{res['bin']}`, {res['cpus']} CPUs shared with the load generator; a "
          "MiniLM-L6-shaped cross-encoder (random weights, max_length "
          f"{max_length}), 2 workers x 1 torch thread on each side; one query against N "
          "documents of mixed length, c closed-loop clients, a fixed number of requests a run, "
          "the sides interleaved. *vramfork*: `/v1/rerank` (`rerank` block, max_batch_size "
          "32); *Python*: sentence-transformers' `CrossEncoder` behind LitServe, the same body; "
          "neither bounds a request's wait. "
          f"The sides' scores agree within {worst:.1e}. Documents/s: the median run's; p50/p99: "
          "over every request of the cell (few requests: p99 is near the slowest).\n",
          "| documents | c | requests × runs | vramfork (docs/s, p50 ms, p99 ms) | "
          "Python (docs/s, p50 ms, p99 ms) | vramfork ÷ Python | vramfork's requests, worker 0 / 1 |",
          "|---:|---:|---|---|---|---:|---|"]
    for r in rows:
        def side(k):
            s = r[k]
            return (f"{fmt(s['docs_s'], 0)}, {fmt(s['p50_ms'], 0)}, {fmt(s['p99_ms'], 0)}"
                    + (f" ({s['failed']} failed)" if s["failed"] else ""))
        md.append(f"| {r['docs']} | {r['c']} | {r['requests_per_run']} × {r['reps']} | "
                  f"{side('vramfork')} | {side('python')} | **{fmt(r['ratio'])}** | "
                  f"{' / '.join(str(r['vramfork']['by_worker'].get(str(w), 0)) for w in (0, 1))} |")
    with open(os.path.join(OUT, "rerank.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
