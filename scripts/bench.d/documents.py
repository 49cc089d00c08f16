#!/usr/bin/env python3
"""scripts/bench --only documents: documents per second for text and image classification,
pre-processing in the worker (the document sent as it is) vs in the client (Python:
Hugging Face's tokenizer, Pillow + torchvision's transforms) sending tensors as v2 binary
data — the same model, the same run, interleaved — and where the time goes (pre-processing
vs the model), from each answer's Server-Timing and the client's own clock.

Run with the torch venv's Python (tokenizers, Pillow, torchvision). The models and files are
tests/support/make_documents.py's: a 2-layer BERT-architecture classifier and its WordPiece
tokenizer, torchvision's ResNet-18 at 224x224 (random weights), JPEG/PNG images.

Usage: documents.py --command CMD [--quick]
"""
import argparse
import http.client
import json
import multiprocessing as mp
import os
import statistics
import struct
import subprocess
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import OUT, ROOT, App, free_port  # noqa: E402

TMP = os.path.join(OUT, "tmp", "documents")


class Served:
    """`app --production` serving one metadata file with 1-thread workers."""

    def __init__(self, metadata, workers, tag):
        self.port = free_port()
        self.app = App([
            "--metadata", metadata, "--port", str(self.port), "--workers", str(workers),
            "--torch-threads", "1"], os.path.join(TMP, f"log-{tag}.txt"))

    def wait_ready(self, probe):
        self.app.wait(lambda: probe(self.port)[0] == 200)

    def stop(self):
        self.app.stop()


def post(conn, path, body, headers):
    conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    return r.status, r.getheader("server-timing"), data


def v2_binary(inputs):
    """A v2 binary request: [(name, datatype, shape, bytes)] -> (body, headers)."""
    head = {"inputs": [{"name": n, "datatype": d, "shape": list(s),
                        "parameters": {"binary_data_size": len(b)}} for n, d, s, b in inputs]}
    h = json.dumps(head).encode()
    return h + b"".join(b for *_, b in inputs), {
        "Inference-Header-Content-Length": str(len(h)),
        "Content-Type": "application/octet-stream"}


# --- the clients (one process each; the documents are cycled through)

def text_docs():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = [l.strip() for l in f if len(l.split()) >= 8]
    return lines[:256]


def image_docs():
    return [open(os.path.join(TMP, f), "rb").read() for f in ("cat.jpg", "wide.png", "rgba.png")]


def client(kind, mode, port, seconds, q):
    docs = text_docs() if kind == "text" else image_docs()
    if mode == "client":
        if kind == "text":
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(os.path.join(TMP, "tokenizer.json"))
            tok.enable_truncation(max_length=64)
        else:
            import io
            from PIL import Image
            from torchvision import transforms as T
            tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    n, i, pre, fwd, lat = 0, 0, [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        doc = docs[i % len(docs)]
        i += 1
        t0 = time.perf_counter()
        if mode == "worker":
            ct = "text/plain" if kind == "text" else "image/jpeg"
            body = doc.encode() if kind == "text" else doc
            status, timing, _ = post(conn, "/", body, {"Content-Type": ct})
            if timing:
                parts = dict(p.split(";dur=") for p in timing.split(", "))
                pre.append(float(parts["preprocess"]))
                fwd.append(float(parts["forward"]))
        else:
            if kind == "text":
                e = tok.encode(doc)
                ids = struct.pack(f"<{len(e.ids)}q", *e.ids)
                mask = struct.pack(f"<{len(e.ids)}q", *e.attention_mask)
                inputs = [("input_ids", "INT64", (1, len(e.ids)), ids),
                          ("attention_mask", "INT64", (1, len(e.ids)), mask)]
            else:
                x = tf(Image.open(io.BytesIO(doc)).convert("RGB")).unsqueeze(0)
                inputs = [("image", "FP32", tuple(x.shape), x.numpy().tobytes())]
            pre.append((time.perf_counter() - t0) * 1e3)
            body, headers = v2_binary(inputs)
            status, _, _ = post(conn, "/v2/models/bench/infer", body, headers)
        lat.append((time.perf_counter() - t0) * 1e3)
        if status != 200:
            q.put({"error": status})
            return
        n += 1
    q.put({"n": n, "pre": pre, "fwd": fwd, "lat": lat})


def load(kind, mode, port, conc, seconds):
    q = mp.Queue()
    ps = [mp.Process(target=client, args=(kind, mode, port, seconds, q)) for _ in range(conc)]
    t0 = time.monotonic()
    for p in ps:
        p.start()
    res = [q.get(timeout=seconds + 120) for _ in ps]
    for p in ps:
        p.join()
    wall = time.monotonic() - t0
    if any("error" in r for r in res):
        raise RuntimeError(f"{kind}/{mode}: {res}")
    med = lambda k: statistics.median([x for r in res for x in r[k]]) if any(r[k] for r in res) else None
    return {"docs_per_s": sum(r["n"] for r in res) / seconds, "pre_ms": med("pre"),
            "forward_ms": med("fwd"), "p50_ms": med("lat"), "wall_s": round(wall, 1)}


def metadata(kind, mode):
    """The app's metadata: the document declared (worker mode) or the tensors (client mode)."""
    if kind == "text":
        inputs = ([{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": 64}}]
                  if mode == "worker" else
                  [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                   {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}])
        model = "bert.pt"
    else:
        inputs = ([{"name": "image", "datatype": "BYTES", "shape": [-1],
                    "image": {"size": [224, 224], "resize": "center_crop", "shorter_side": 256,
                              "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}]
                  if mode == "worker" else
                  [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 224, 224]}])
        model = "resnet.pt"
    path = os.path.join(TMP, f"{kind}-{mode}.json")
    with open(path, "w") as f:
        json.dump({"name": "bench", "model": model, "inputs": inputs}, f)
    return path


def probe_for(kind, mode):
    def probe(port):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        if mode == "worker":
            body = b"warm up" if kind == "text" else image_docs()[0]
            ct = "text/plain" if kind == "text" else "image/jpeg"
            return post(conn, "/", body, {"Content-Type": ct})
        if kind == "text":
            ids = struct.pack("<3q", 2, 5, 3)
            body, h = v2_binary([("input_ids", "INT64", (1, 3), ids),
                                 ("attention_mask", "INT64", (1, 3), struct.pack("<3q", 1, 1, 1))])
        else:
            body, h = v2_binary([("image", "FP32", (1, 3, 224, 224), bytes(4 * 3 * 224 * 224))])
        return post(conn, "/v2/models/bench/infer", body, h)
    return probe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", default="scripts/bench --only documents")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    seconds = 5 if a.quick else 12
    rounds = 1 if a.quick else 3
    os.makedirs(TMP, exist_ok=True)
    if not os.path.exists(os.path.join(TMP, "expected.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "support", "make_documents.py"),
                        TMP, os.path.join(ROOT, "README.md")], check=True, stdout=subprocess.DEVNULL)
    rows = []
    for kind, conc in [("text", 1), ("text", 4), ("image", 1), ("image", 4)]:
        runs = {"worker": [], "client": []}
        for _ in range(rounds):
            for mode in ("worker", "client"):
                app = Served(metadata(kind, mode), 2, f"{kind}-{mode}")
                try:
                    app.wait_ready(probe_for(kind, mode))
                    runs[mode].append(load(kind, mode, app.port, conc, seconds))
                finally:
                    app.stop()
        for mode, rs in runs.items():
            best = sorted(rs, key=lambda r: r["docs_per_s"])[len(rs) // 2]
            rows.append({"kind": kind, "concurrency": conc, "mode": mode,
                         "docs_per_s_runs": [round(r["docs_per_s"], 1) for r in rs], **best})
        print(json.dumps(rows[-2:]), file=sys.stderr)
    doc = {"command": a.command, "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "cpus": os.cpu_count(), "workers": 2, "torch_threads": 1, "seconds": seconds,
           "rounds": rounds, "rows": rows}
    with open(os.path.join(OUT, "documents.json"), "w") as f:
        json.dump(doc, f, indent=1)
    fmt = lambda x: "-" if x is None else f"{x:.2f}"
    md = [f"# Documents in: pre-processing in the worker vs in the client\n",
          f"`{a.command}`, {doc['when']}, {doc['cpus']} CPUs, 2 workers x 1 torch thread, "
          f"clients on the same machine, {seconds} s per run, median of {rounds} runs "
          "(interleaved).\n",
          "| documents | clients | pre-processing in | docs/s (runs) | pre-processing ms (median) | forward ms (median) | p50 ms |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['kind']} | {r['concurrency']} | {r['mode']} | {r['docs_per_s']:.1f} "
                  f"({', '.join(str(x) for x in r['docs_per_s_runs'])}) | {fmt(r['pre_ms'])} | "
                  f"{fmt(r['forward_ms'])} | {fmt(r['p50_ms'])} |")
    with open(os.path.join(OUT, "documents.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
