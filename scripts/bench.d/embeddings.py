#!/usr/bin/env python3
"""scripts/bench --only embeddings: embeddings/s through OpenAI's `/v1/embeddings`.

One sentence encoder of all-MiniLM-L6-v2's shape (random weights; embeddings_model.py), the
same weights and tokenizer on three sides, each on 2 workers of 1 torch thread:

- *v1*: `app --production` answering `POST /v1/embeddings` with base64 vectors (what OpenAI's
  Python SDK asks for unasked), the documents tokenized in the worker (max_batch_size 32);
- *v2 binary*: the same server, the same texts as one BYTES input of a v2 binary request, the
  vectors answered as a binary FP32 tensor: the door's cost against the leanest one;
- *Python*: sentence-transformers behind LitServe's `OpenAIEmbeddingSpec` (embeddings_litserve.py;
  batching across requests for one input a request, each request's inputs encoded together
  for 16, as LitServe allows).

With aiperf (NVIDIA's load generator, `--endpoint-type embeddings`; kept in its own venv,
bench/tmp/aiperf-venv, since it wants transformers 5), the one-input servers are also driven by
it at c = 4 and 16, each side in turn, its synthetic 32-token prompts from the model's own
tokenizer: a second, independent client's view.

Before timing, the 16 sentences' vectors from each side must agree within 1e-4 (else the bench
stops: the sides would not be the same model). Then wrk at c = 1, 4, 16 with 1 and 16
sentences a request, the three sides interleaved (the order alternating from round to
round). Writes bench/embeddings.{json,md}: embeddings/s (requests/s x inputs), p50, p99, and
v1's ratio to each other side.

Usage: embeddings.py --command CMD [--quick]
"""
import argparse
import http.client
import json
import os
import struct
import subprocess
import sys
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as R  # noqa: E402
from common import OUT, ROOT, TMP, App, free_port, get, log  # noqa: E402

PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)
MODEL = "minilm"
DIR = os.path.join(TMP, "embeddings")


def post(port, path, body, headers):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def v1_body(texts, encoding="base64"):
    return json.dumps({"model": MODEL, "input": texts, "encoding_format": encoding})


def v2_body(texts):
    """A v2 binary request of `texts` as one BYTES input, the answer asked for in binary:
    (body, Inference-Header-Content-Length)."""
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    head = json.dumps({"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + raw, len(head)


def v1_vectors(port, texts):
    status, _, body = post(port, "/v1/embeddings", v1_body(texts, "float"),
                           {"Content-Type": "application/json"})
    assert status == 200, body[:300]
    return [d["embedding"] for d in sorted(json.loads(body)["data"], key=lambda d: d["index"])]


def v2_vectors(port, texts):
    body, hl = v2_body(texts)
    status, headers, got = post(port, f"/v2/models/{MODEL}/infer", body,
                                {"Content-Type": "application/octet-stream",
                                 "Inference-Header-Content-Length": str(hl)})
    assert status == 200, got[:300]
    n = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
    out = json.loads(got[:n])["outputs"][0]
    flat = struct.unpack(f"<{out['parameters']['binary_data_size'] // 4}f", got[n:])
    width = out["shape"][1]
    return [list(flat[i * width:(i + 1) * width]) for i in range(out["shape"][0])]


def vramfork(folder=DIR, max_length=128, binary_dir=None, tag="embeddings", args=(),
             name=MODEL):
    """`app --production` serving embeddings_model.py's pooled.pt in `folder` as `name` on 2
    workers x 1 torch thread (the binaries of `binary_dir`, else the build's; more `args`):
    (app, port)."""
    meta = os.path.join(folder, f"app-metadata-{tag}.json")
    with open(meta, "w") as f:
        json.dump({"name": name, "model": "pooled.pt", "max_batch_size": 32,
                   "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                               "tokenizer": {"file": "tokenizer.json",
                                             "max_length": max_length}}],
                   "embeddings": {"pooling": "none"}}, f)
    port = free_port()
    app = App(["--metadata", meta, "--port", str(port), "--workers", "2", "--torch-threads", "1",
               *args], os.path.join(TMP, f"log-{tag}.txt"), binary_dir=binary_dir)
    app.wait_ready(port, 300)
    return app, port


def litserve(max_batch, folder=DIR, max_length=128):
    """embeddings_litserve.py on `folder`'s hf/ (batching across requests up to `max_batch`):
    (server, port)."""
    port = free_port()
    srv = App.other([PY, os.path.join(HERE, "embeddings_litserve.py"), os.path.join(folder, "hf"),
                     str(port), str(max_batch), str(max_length)],
                    os.path.join(TMP, f"log-embeddings-litserve-{max_batch}.txt"))
    srv.wait(lambda: get(port, "/health", timeout=2)[0] == 200, 600)
    return srv, port


def same_vectors(sides, texts, one_by_one):
    """The largest |difference| between any side's vectors and v1's, for `texts` (sent to the
    Python side one a request when `one_by_one`: a batching LitServe takes no more)."""
    want = v1_vectors(sides["v1"], texts)
    python = ([v1_vectors(sides["python"], [t])[0] for t in texts] if one_by_one
              else v1_vectors(sides["python"], texts))
    worst = 0.0
    for name, got in (("v2 binary", v2_vectors(sides["v1"], texts)), ("Python", python)):
        d = max(abs(a - b) for u, v in zip(want, got) for a, b in zip(u, v))
        log(f"embeddings: {name} vs v1: max |Δ| {d:.2e} over {len(texts)} vectors")
        if len(got) != len(want) or d > 1e-4:
            raise SystemExit(f"embeddings: {name} answers other vectors than v1 (max |Δ| {d})")
        worst = max(worst, d)
    return worst


AIPERF = os.path.join(TMP, "aiperf-venv", "bin", "aiperf")


def aiperf(port, c, secs):
    """aiperf's request throughput and p50 latency (ms) against `port`'s /v1/embeddings."""
    out = os.path.join(TMP, f"aiperf-{port}-{c}")
    subprocess.run([AIPERF, "profile", "--model", MODEL, "--url", f"http://127.0.0.1:{port}",
                    "--endpoint-type", "embeddings", "--tokenizer", os.path.join(DIR, "hf"),
                    "--concurrency", str(c), "--benchmark-duration", str(secs),
                    "--prompt-input-tokens-mean", "32", "--ui-type", "none",
                    "--artifact-dir", out], check=True, cwd=TMP, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=secs + 300)
    with open(os.path.join(out, "profile_export_aiperf.json")) as f:
        d = json.load(f)
    return {"rps": d["request_throughput"]["avg"], "p50_ms": d["request_latency"]["p50"],
            "errors": (d.get("error_summary") or [])}


def ratio(a, b):
    return a["emb_s"] / b["emb_s"] if b["emb_s"] else None


def fmt(x):
    return "—" if x is None else f"{x:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    reps, secs = (2, 2) if a.quick else (3, 5)
    subprocess.run([PY, os.path.join(HERE, "embeddings_model.py"), DIR], check=True,
                   stderr=subprocess.DEVNULL)
    with open(os.path.join(DIR, "sentences.json")) as f:
        sentences = json.load(f)
    rows, checks, by_aiperf = [], [], []
    vf, vf_port = vramfork()
    try:
        for n in (1, 16):
            texts = sentences[:n]
            bodies = {"v1": (v1_body(texts), None, "/v1/embeddings")}
            raw, hl = v2_body(texts)
            bodies["v2 binary"] = (raw, hl, f"/v2/models/{MODEL}/infer")
            py, py_port = litserve(16 if n == 1 else 1)
            try:
                ports = {"v1": vf_port, "v2 binary": vf_port, "python": py_port}
                checks.append(same_vectors({"v1": vf_port, "python": py_port}, sentences[:16],
                                           n == 1))
                bodies["python"] = (v1_body(texts), None, "/v1/embeddings")
                for k, (b, h, path) in bodies.items():  # warm-up
                    R.wrk(ports[k], b, 2, 1, path, h)
                for c in (1, 4, 16):
                    # 16 requests of 16 inputs in flight take seconds each: a longer run, so
                    # that each connection sees several answers.
                    run_s = secs * (4 if n * c >= 256 else 1)
                    runs = R.interleaved(list(bodies), reps, lambda k: R.wrk(
                        ports[k], bodies[k][0], c, run_s, bodies[k][2], bodies[k][1]))
                    got = {k: R.summarize(v) for k, v in runs.items()}
                    row = {"inputs": n, "c": c, "seconds": run_s}
                    for k, s in got.items():
                        row[k] = {"emb_s": s["rps"] * n, "rps": s["rps"], "p50_ms": s["p50_ms"],
                                  "p99_ms": s["p99_ms"], "failed": s["failed"],
                                  "rps_all": s["rps_all"]}
                    row["v1_over_v2"] = ratio(row["v1"], row["v2 binary"])
                    row["v1_over_python"] = ratio(row["v1"], row["python"])
                    log(f"embeddings n={n} c={c}: v1 {row['v1']['emb_s']:.0f}, v2 binary "
                        f"{row['v2 binary']['emb_s']:.0f} ({fmt(row['v1_over_v2'])}), Python "
                        f"{row['python']['emb_s']:.0f} ({fmt(row['v1_over_python'])}) "
                        f"embeddings/s; failed {[row[k]['failed'] for k in got]}")
                    rows.append(row)
                if n == 1 and os.path.exists(AIPERF):
                    for c in (4, 16):
                        got = {k: aiperf(ports[k], c, 2 * secs) for k in ("v1", "python")}
                        log(f"embeddings aiperf c={c}: v1 {got['v1']['rps']:.0f}, Python "
                            f"{got['python']['rps']:.0f} req/s")
                        by_aiperf.append({"c": c, **got})
            finally:
                py.stop()
    finally:
        vf.stop()
    write(a, reps, secs, rows, max(checks), by_aiperf)


def write(a, reps, secs, rows, worst, by_aiperf):
    res = {"command": a.command, "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "bin": os.path.relpath(R.BIN, ROOT), "reps": reps, "seconds": secs,
           "cpus": os.cpu_count(), "max_abs_diff": worst, "rows": rows, "aiperf": by_aiperf}
    with open(os.path.join(OUT, "embeddings.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# Embeddings through `/v1/embeddings`\n\n`{a.command}`, {res['when']}, binaries of "
          f"`{res['bin']}`, {res['cpus']} CPUs shared with wrk; a MiniLM-L6-shaped encoder "
          "(random weights), 2 workers x 1 torch thread on every side; "
          f"{reps} runs of {secs} s per side ({4 * secs} s for 16 inputs at c=16), interleaved; medians. *v1*: vramfork's "
          "`/v1/embeddings`, base64; *v2 binary*: the same server and texts as a v2 binary "
          "request; *Python*: sentence-transformers behind LitServe's OpenAI embeddings spec. "
          f"The sides' vectors agree within {worst:.1e}.\n",
          "| inputs/request | c | v1 (emb/s, p50 ms) | v2 binary (emb/s, p50 ms) | Python (emb/s, p50 ms) | v1 ÷ v2 binary | v1 ÷ Python |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda k: f"{r[k]['emb_s']:.0f}, {r[k]['p50_ms']:.1f}"  # noqa: E731
        md.append(f"| {r['inputs']} | {r['c']} | {cell('v1')} | {cell('v2 binary')} | "
                  f"{cell('python')} | **{fmt(r['v1_over_v2'])}** | **{fmt(r['v1_over_python'])}** |")
    if by_aiperf:
        md += ["", "aiperf (one input a request, synthetic 32-token prompts, "
               f"{2 * secs} s a side, one run each):", "",
               "| c | v1 (req/s, p50 ms) | Python (req/s, p50 ms) | v1 ÷ Python |", "|---|---|---|---|"]
        for r in by_aiperf:
            md.append(f"| {r['c']} | {r['v1']['rps']:.0f}, {r['v1']['p50_ms']:.1f} | "
                      f"{r['python']['rps']:.0f}, {r['python']['p50_ms']:.1f} | "
                      f"**{r['v1']['rps'] / r['python']['rps']:.2f}** |")
    else:
        md += ["", "aiperf: not run (bench/tmp/aiperf-venv has none)."]
    with open(os.path.join(OUT, "embeddings.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
