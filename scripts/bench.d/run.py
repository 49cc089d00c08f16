#!/usr/bin/env python3
"""scripts/bench's measurements (stdlib only). Called by scripts/bench after the release build;
see docs/performance.md for what each number means and how it is taken.

Everything runs on loopback; every load run is bounded in time (wrk -d, plus a subprocess
timeout) and every polling loop has a deadline. Servers are started in their own process
group and stopped (TERM, then KILL of that group) before the next one starts.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import BIN, ROOT, TMP, App, free_port, log, median  # noqa: E402
from common import cpu_seconds as process_cpu_seconds  # noqa: E402

MODELS = {
    "mlp": {
        "metadata": os.path.join(ROOT, "tests", "fixtures", "mlp.json"),
        "model": os.path.join(ROOT, "tests", "fixtures", "mlp.pt"),
        "shape": "1,4",
        "body": json.dumps({"inputs": [[1.0, 2.0, 3.0, 4.0]]}),
    },
    "medium": {
        "metadata": os.path.join(TMP, "medium.json"),
        "model": os.path.join(TMP, "medium.pt"),
        "shape": "1,16",
        "body": json.dumps({"inputs": [[round(0.1 * i, 1) for i in range(16)]]}),
    },
}
CONCURRENCY = [1, 2, 4, 8]
# The v2 encoding benchmark's model's metadata (not in MODELS: the serving, recycling and
# limit sweeps skip it).
IMAGE_METADATA = os.path.join(TMP, "image.json")
# The batching benchmark's models: the two above and a memory-bound one (make_model.py's
# Wide: four 4096x4096 linear layers), each with its row width; a request is one row.
WIDE = 4096
BATCH_MODELS = {
    "mlp": dict(MODELS["mlp"], width=4),
    "medium": dict(MODELS["medium"], width=16),
    "wide": {
        "metadata": os.path.join(TMP, "wide.json"),
        "model": os.path.join(TMP, "wide.pt"),
        "width": WIDE,
        "body": json.dumps({"inputs": [[round(((i * 37) % 101) / 100 - 0.5, 2)
                                        for i in range(WIDE)]]}),
    },
}
BATCH_CONCURRENCY = [1, 4, 16, 64]
BATCH_MAX = 16  # --max-batch-size for "batching on"


def post_once(port, body, timeout=5.0, tls=False):
    """One POST / on a fresh connection (over TLS, trusting any certificate, with `tls`);
    returns the status code (None on a socket error)."""
    req = (
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
            s = raw
            if tls:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                s = ctx.wrap_socket(raw)
            s.sendall(req)
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                data += chunk
            return int(data.split(b" ", 2)[1])
    except OSError:
        return None


# ---------------------------------------------------------------- real architectures

REAL = os.path.join(TMP, "real")
# name: loop SHAPE for forward-loop, v2 binary or POST / JSON body, the files' name if not name
REAL_MODELS = {
    "cnn": {"shape": "1,3,32,32", "v2": False, "label": "CIFAR-style CNN (7 conv3x3, POST / JSON)"},
    # The same model and request as v2 binary ("files": whose .pt, .json, .ready, .raw).
    "cnn_v2": {"shape": "1,3,32,32", "v2": True, "files": "cnn",
               "label": "the same CNN, the same request as v2 binary"},
    "resnet50": {"shape": "1,3,224,224", "v2": True, "label": "ResNet-50 (torchvision, v2 binary)"},
    "bert": {"shape": "1,128:i64;1,128:i64", "v2": True, "min_s": 8,
             "label": "BERT-base encoder (transformers, 128 tokens, v2 binary)"},
}
REAL_CONCURRENCY = [1, 2, 4, 16]


def real_data(name):
    """A file of the values the bench's requests to `name` carry (raw little-endian, each
    input's elements in turn), for forward-loop's DATA: the loop runs on the same values
    the server does (ResNet-50's passes ran about 4 % faster on forward-loop's synthetic
    values than on the request's random-normal image)."""
    name = files(name)
    path = os.path.join(REAL, f"{name}.raw")
    if not os.path.exists(path):
        _, body, hl = real_request(name)
        if hl is None:
            def flat(v):
                return [y for x in v for y in flat(x)] if isinstance(v, list) else [v]
            values = flat(json.loads(body)["inputs"])
            raw = struct.pack(f"<{len(values)}f", *values)
        else:
            raw = body[hl:]
        with open(path, "wb") as f:
            f.write(raw)
    return path


def files(name):
    """The name of the model files (.pt, .json, .ready, .raw) a REAL_MODELS entry uses."""
    return REAL_MODELS[name].get("files", name)


def real_loop(name, seconds, procs=2):
    """The model's own loop: `procs` forward-loop processes x 1 torch thread, passes/s
    summed, on the values the requests carry."""
    return loops(os.path.join(REAL, f"{files(name)}.pt"), REAL_MODELS[name]["shape"], procs, 1, seconds,
                 slack=120, data=real_data(name))["per_s"]


def loop_procs(c):
    """How many loop processes served traffic at concurrency `c` is held against: one
    client keeps one of the two workers busy, so c=1 is held against one process."""
    return 1 if c == 1 else 2


def real_request(name):
    """(path, body, header_len) of one request to a served real model."""
    m = REAL_MODELS[name]
    with open(os.path.join(REAL, f"{name}.body"), "rb") as f:
        body = f.read()
    if not m["v2"]:
        return "/", body.decode(), None
    with open(os.path.join(REAL, f"{name}.v2len")) as f:
        return f"/v2/models/{files(name)}/infer", body, int(f.read())


def real_server(name, tag, max_requests=0):
    with open(os.path.join(REAL, f"{files(name)}.ready")) as f:
        ready = f.read()
    srv = Server("mlp", 2, max_requests=max_requests, tag=tag,
                 metadata=os.path.join(REAL, f"{files(name)}.json"))
    srv.wait_ready(deadline_s=180, body=ready)
    return srv


def private_mb(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        t = f.read()
    return sum(int(re.search(rf"^{k}:\s+(\d+)", t, re.M).group(1)) for k in ("Private_Clean", "Private_Dirty")) / 1024


def measure_real(cfg):
    """Real architectures (random weights) at the model's own speed: served ÷ the model's own
    loop at c = 1, 2, 4, 16 (2 workers x 1 torch thread). For each c in turn, `reps` + 2
    served runs, each between two runs of the loop (loop, served, loop, served, …, loop: 2
    forward-loop processes x 1 thread, 1 process for c = 1), all while the server is up but
    idle, so a slow minute of this shared machine hits both sides; the ratio is the median of
    the runs' ratios (each ÷ the mean of the two loop runs around it). Then PSS of the 2
    workers and whether they were forked from the template; ResNet-50 with
    `--max-requests 1` ÷ persistent (c = 4). Then the small MLP against its combined
    ceiling: the HTTP floor (`http-floor`, bare hyper pre-forked on one socket, a fixed
    answer) and the MLP's own loop, each a per-request cost, added."""
    out = {}
    pairs = cfg["reps"] + 2
    for name, m in REAL_MODELS.items():
        # A slow model's runs last longer, so a run holds enough requests to count.
        secs = max(cfg["load_s"] + 1, m.get("min_s", 0))
        path, body, hl = real_request(name)
        loops = {c: [] for c in REAL_CONCURRENCY}
        runs = {c: [] for c in REAL_CONCURRENCY}
        round_ratios = {c: [] for c in REAL_CONCURRENCY}
        srv = real_server(name, f"real-{name}")
        try:
            for _ in range(2):
                wrk(srv.port, body, 1, 1, path, hl)
            for c in REAL_CONCURRENCY:
                loops[c].append(real_loop(name, secs, loop_procs(c)))
                for _ in range(pairs):
                    runs[c].append(wrk(srv.port, body, c, secs + (2 if c == 16 else 0), path, hl))
                    loops[c].append(real_loop(name, secs, loop_procs(c)))
                for i, r in enumerate(runs[c]):
                    round_ratios[c].append(r["rps"] / ((loops[c][i] + loops[c][i + 1]) / 2))
            served = {c: summarize(runs[c]) for c in REAL_CONCURRENCY}
            procs = memory(srv)
            workers = [p for p in procs if p["role"].startswith("vf-worker")]
            private = [private_mb(p["pid"]) for p in workers]
            methods = [e["fields"].get("method") for e in read_log(srv.log_path)
                       if e["fields"].get("event") == "worker_started"]
        finally:
            srv.stop()
        weights_mb = os.path.getsize(os.path.join(REAL, f"{files(name)}.pt")) / 2**20
        row = {
            "label": m["label"], "loop_per_s": median([x for c in REAL_CONCURRENCY if c > 1 for x in loops[c]]),
            "loop1_per_s": median(loops[1]),
            "loop_runs": {str(c): [round(x, 2) for x in v] for c, v in loops.items()},
            "served": {str(c): dict(r, loop_per_s=median(loops[c]),
                                    ratio=median(round_ratios[c]),
                                    round_ratios=[round(x, 3) for x in round_ratios[c]])
                       for c, r in served.items()},
            "workers_pss_mb": sum(p["pss_mb"] for p in workers),
            "workers_private_mb": private, "weights_mb": weights_mb,
            "pss_bound_mb": weights_mb + sum(private),
            "forked": bool(methods) and all(x == "fork" for x in methods), "methods": methods,
        }
        out[name] = row
        log(f"real {name}: loop {row['loop_per_s']:.1f}/s (1 process {row['loop1_per_s']:.1f}/s); " + ", ".join(
            f"c={c} {r['rps']:.1f} req/s ({r['ratio']:.2f})" for c, r in row["served"].items())
            + f"; PSS of 2 workers {row['workers_pss_mb']:.0f} MB (weights {weights_mb:.0f} MB + "
            f"private {sum(private):.0f} MB = {row['pss_bound_mb']:.0f}); started by {set(methods)}")
    # --max-requests 1 vs persistent, ResNet-50, c=4, runs interleaved.
    path, body, hl = real_request("resnet50")
    secs = cfg["load_s"] + 1
    runs = {"persistent": [], "max-requests 1": []}
    for _ in range(cfg["reps"]):
        for k, mr in (("persistent", 0), ("max-requests 1", 1)):
            srv = real_server("resnet50", f"real-mr-{mr}", max_requests=mr)
            try:
                runs[k].append(wrk(srv.port, body, 4, secs, path, hl))
            finally:
                srv.stop()
    mr = {k: summarize(v) for k, v in runs.items()}
    mr["ratio"] = mr["max-requests 1"]["rps"] / mr["persistent"]["rps"]
    out["resnet50_max_requests_1"] = mr
    log(f"real resnet50 --max-requests 1: {mr['max-requests 1']['rps']:.1f} vs persistent "
        f"{mr['persistent']['rps']:.1f} req/s ({mr['ratio']:.2f})")
    out["small"] = measure_floor(cfg)
    return out


def measure_floor(cfg):
    """Small MLP served vs its combined ceiling at c = 16 and 64 (2 workers / processes):
    1 / (1 / HTTP floor + 1 / loop), the HTTP floor and the loop measured in the same run."""
    body = MODELS["mlp"]["body"]
    floor = {16: [], 64: []}
    served = {16: [], 64: []}
    loops = []
    for _ in range(cfg["reps"]):
        p = subprocess.Popen([os.path.join(BIN, "http-floor"), "2"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
        try:
            port = json.loads(p.stdout.readline())["port"]
            for c in floor:
                floor[c].append(wrk(port, body, c, cfg["load_s"]))
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        srv = Server("mlp", 2, tag="floor-mlp")
        try:
            srv.wait_ready()
            for c in served:
                served[c].append(wrk(srv.port, body, c, cfg["load_s"]))
        finally:
            srv.stop()
        loops.append(forward_limit("mlp", 2, 1, cfg["limit_s"])["per_s"])
    loop = median(loops)
    out = {"loop_per_s": loop}
    for c in floor:
        f, s_ = summarize(floor[c]), summarize(served[c])
        ceiling = 1 / (1 / f["rps"] + 1 / loop)
        out[str(c)] = {"floor_rps": f["rps"], "served_rps": s_["rps"], "ceiling_rps": ceiling,
                       "ratio": s_["rps"] / ceiling,
                       "us_per_request": {"floor": 1e6 / f["rps"], "loop": 1e6 / loop,
                                          "served": 1e6 / s_["rps"]}}
        log(f"floor c={c}: HTTP floor {f['rps']:.0f}, loop {loop:.0f}, ceiling {ceiling:.0f}, "
            f"served {s_['rps']:.0f} req/s ({s_['rps'] / ceiling:.2f} of the ceiling)")
    return out


# ---------------------------------------------------------------- model shapes

SHAPES = os.path.join(TMP, "shapes")
# Plain models of other shapes than the fixtures (tests/support/make_shapes.py builds the first
# five in SHAPES, scripts/bench.d/make_real.py the CNN in REAL): forward-loop's SHAPE, label.
SHAPE_MODELS = {
    "mlp64": {"shape": "1,64", "label": "MLP 64-64-64-16"},
    "mlp256": {"shape": "1,64", "label": "MLP 64-256-256-16 (the inline-pass case)"},
    "mlp1024": {"shape": "1,64", "label": "MLP 64-1024-1024-16"},
    "conv1d": {"shape": "1,16,256", "label": "1-D conv net, 16x256"},
    "attention": {"shape": "1,32,128", "label": "transformer encoder block, 32x128"},
    # The same models and values as v2 binary requests ("files": whose .pt, .json, .raw):
    # what their 85 kB JSON bodies (4,096 numbers) cost, apart from any request's cost.
    "conv1d_v2": {"shape": "1,16,256", "label": "the same 1-D conv net, as v2 binary", "files": "conv1d"},
    "attention_v2": {"shape": "1,32,128", "label": "the same transformer block, as v2 binary",
                     "files": "attention"},
    "cnn": {"shape": "1,3,32,32", "label": "CIFAR-style CNN (7 conv3x3)", "dir": REAL},
}
SHAPE_CONCURRENCY = [1, 4, 16]
# A row is flagged when, at this concurrency, a pass of at least LONG_PASS_MS serves below
# LONG_FLOOR of its loop, or a shorter pass below SHORT_FLOOR of its combined ceiling.
FLAG_C, LONG_PASS_MS, LONG_FLOOR, SHORT_FLOOR = 4, 1.0, 0.8, 0.4


def shape_files(name):
    """(metadata, model, body, raw values file, path, v2 header length) of a SHAPE_MODELS
    entry: its `POST /` JSON body, or, for a "files" entry, the same values as a v2 binary
    request (its header length for wrk; `None` for JSON)."""
    m = SHAPE_MODELS[name]
    d, base = m.get("dir", SHAPES), m.get("files", name)
    with open(os.path.join(d, f"{base}.body")) as f:
        body = f.read()
    raw = os.path.join(d, f"{base}.raw")
    if not os.path.exists(raw):
        def flat(v):
            return [y for x in v for y in flat(x)] if isinstance(v, list) else [v]
        values = flat(json.loads(body)["inputs"])
        with open(raw, "wb") as f:
            f.write(struct.pack(f"<{len(values)}f", *values))
    path, hl = "/", None
    if "files" in m:
        with open(raw, "rb") as f:
            data = f.read()
        shape = [int(x) for x in m["shape"].split(",")]
        head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape,
                                       "parameters": {"binary_data_size": len(data)}}]}).encode()
        body, hl, path = head + data, len(head), f"/v2/models/{base}/infer"
    return (os.path.join(d, f"{base}.json"), os.path.join(d, f"{base}.pt"), body, raw, path, hl)


def interleaved_runs(port, body, c, secs, pairs, loop, floor=None, path="/", hl=None):
    """`pairs` served runs at concurrency `c`, each between two runs of `loop()` (passes/s),
    and, with `floor`, an HTTP-floor run (`floor(c)`, req/s) after each: so that a slow
    minute of this shared machine hits both sides of every ratio. Returns the runs and each
    run's ratio to the mean of the loop runs around it (and to its combined ceiling,
    1 / (1 / floor + 1 / loop), with `floor`)."""
    loops_, runs, floors = [loop()], [], []
    for _ in range(pairs):
        runs.append(wrk(port, body, c, secs, path, hl))
        if floor:
            floors.append(floor(c))
        loops_.append(loop())
    around = [(loops_[i] + loops_[i + 1]) / 2 for i in range(len(runs))]
    out = {"runs": runs, "loops": loops_, "floors": floors,
           "ratios": [r["rps"] / l for r, l in zip(runs, around)]}
    if floor:
        out["ceiling_ratios"] = [r["rps"] * (1 / f + 1 / l) for r, f, l in zip(runs, floors, around)]
    return out


def measure_shapes(cfg):
    """Each SHAPE_MODELS model served by 2 workers x 1 torch thread (no OMP_* variable set),
    at c = 1, 4, 16: served ÷ the model's own loop (forward-loop on the request's values; 2
    processes x 1 thread, 1 process at c = 1), each served run between two loop runs; and for
    passes under 1 ms, ÷ the combined ceiling with the HTTP floor (`http-floor`, 2 processes,
    the same body) measured after each served run. Flags a row below 0.8 of its loop (passes
    of 1 ms or more) or 0.4 of its ceiling (shorter) at c = 4. `BENCH_SHAPES=a,b` runs only
    those models (for trying a change; a table for the README has them all)."""
    env_threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ}
    if env_threads:
        raise RuntimeError(f"unset {', '.join(env_threads)}: this bench measures the default")
    fl = subprocess.Popen([os.path.join(BIN, "http-floor"), "2"], stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
    out = {"models": {}, "flagged": []}
    try:
        floor_port = json.loads(fl.stdout.readline())["port"]
        only = [n for n in os.environ.get("BENCH_SHAPES", "").split(",") if n]
        for name, m in SHAPE_MODELS.items():
            if only and name not in only:
                continue
            meta, model, body, raw, path, hl = shape_files(name)
            secs = cfg["load_s"] + 1
            pass_ms = loops(model, m["shape"], 1, 1, cfg["limit_s"], data=raw)["pass_p50_ms"]
            short = pass_ms < LONG_PASS_MS
            srv = Server("mlp", 2, tag=f"shapes-{name}", metadata=meta,
                         extra=["--torch-threads", "1"])
            row = {"label": m["label"], "pass_ms": pass_ms, "short": short, "c": {}}
            try:
                with open(os.path.join(SHAPE_MODELS[name].get("dir", SHAPES),
                                       f"{SHAPE_MODELS[name].get('files', name)}.body")) as f:
                    srv.wait_ready(deadline_s=120, body=f.read())
                wrk(srv.port, body, 1, 1, path, hl)
                for c in SHAPE_CONCURRENCY:
                    procs = loop_procs(c)
                    r = interleaved_runs(
                        srv.port, body, c, secs, cfg["reps"],
                        lambda: loops(model, m["shape"], procs, 1, secs, data=raw)["per_s"],
                        (lambda c: wrk(floor_port, body, c, secs, path, hl)["rps"]) if short else None,
                        path, hl)
                    cell = dict(summarize(r["runs"]), loop_per_s=median(r["loops"]),
                                ratio=median(r["ratios"]), ratios=[round(x, 3) for x in r["ratios"]])
                    if short:
                        cell.update(floor_rps=median(r["floors"]),
                                    ceiling_ratio=median(r["ceiling_ratios"]),
                                    ceiling_ratios=[round(x, 3) for x in r["ceiling_ratios"]])
                    row["c"][str(c)] = cell
                threads = {p: comm for p, comm in srv.pids().items() if comm.startswith("vf-worker")}
                row["model_threads"] = {comm: sum(1 for t in os.listdir(f"/proc/{p}/task")
                                                  if open(f"/proc/{p}/task/{t}/comm").read().strip() == "vf-model")
                                        for p, comm in threads.items()}
            finally:
                srv.stop()
            at = row["c"][str(FLAG_C)]
            value, floor_ = (at["ceiling_ratio"], SHORT_FLOOR) if short else (at["ratio"], LONG_FLOOR)
            row["flag"] = value < floor_
            if row["flag"]:
                out["flagged"].append(name)
                log(f"*** FLAGGED *** {name}: {value:.2f} of its {'ceiling' if short else 'loop'} at "
                    f"c={FLAG_C} (below {floor_})")
            log(f"shapes {name}: pass {pass_ms:.3f} ms; " + ", ".join(
                f"c={c} {x['rps']:.0f} req/s ({x['ratio']:.2f} of loop"
                + (f", {x['ceiling_ratio']:.2f} of ceiling" if short else "") + ")"
                for c, x in row["c"].items()) + f"; vf-model threads per worker {row['model_threads']}")
            out["models"][name] = row
    finally:
        os.killpg(fl.pid, signal.SIGKILL)
        fl.wait()
    return out


def shapes_markdown(r):
    lines = ["", "## Served ÷ the model's own loop, by model shape (2 workers × 1 torch thread)", "",
             "Each cell is the median of the per-run ratios: every served run sits between two runs "
             "of the model's own loop (`forward-loop` on the request's values: 2 processes × 1 "
             "thread, 1 process at c = 1); for passes under 1 ms also ÷ the combined ceiling "
             "1 / (1 / HTTP floor + 1 / loop), the HTTP floor (`http-floor`, the same body) "
             "measured after each served run. No `OMP_*` variable set. A row is **flagged** below "
             f"{LONG_FLOOR} of its loop (passes ≥ {LONG_PASS_MS} ms) or {SHORT_FLOOR} of its ceiling "
             f"(shorter passes) at c = {FLAG_C}.", "",
             "| model | pass (ms) | " + " | ".join(f"c={c} req/s | ÷ loop | ÷ ceiling" for c in SHAPE_CONCURRENCY)
             + " | flagged |",
             "|---|---:|" + "---:|---:|---:|" * len(SHAPE_CONCURRENCY) + "---|"]
    for name, row in r["models"].items():
        cells = []
        for c in SHAPE_CONCURRENCY:
            x = row["c"][str(c)]
            cells += [f"{x['rps']:.0f}", f"{x['ratio']:.2f}",
                      f"{x['ceiling_ratio']:.2f}" if "ceiling_ratio" in x else "—"]
        lines.append(f"| {row['label']} | {row['pass_ms']:.3f} | " + " | ".join(cells)
                     + f" | {'**FLAGGED**' if row['flag'] else 'no'} |")
    lines += ["", f"Flagged: {', '.join(r['flagged']) or 'none'}.", ""]
    return "\n".join(lines)


def real_markdown(r):
    pairs = len(r[next(iter(REAL_MODELS))]["served"]["1"]["round_ratios"])
    lines = ["", "## Served ÷ the model's own loop (2 workers × 1 torch thread)", "",
             f"For each c, {pairs} served runs, each between two runs of the model's own loop (2 "
             "forward-loop processes × 1 thread; **1 process for c=1**, where one client keeps one "
             "worker busy). Cells: median req/s (**median of the runs' ratios**; each run ÷ the "
             "mean of the two loop runs around it).", "",
             "| model | loop passes/s (1 process) | " + " | ".join(f"c={c}" for c in REAL_CONCURRENCY)
             + " | PSS of 2 workers (MB) | weights + 2 × private (MB) | workers forked from the template |",
             "|---|---:|" + "---|" * len(REAL_CONCURRENCY) + "---:|---:|---|"]
    for name in REAL_MODELS:
        x = r[name]
        cells = " | ".join(
            f"{x['served'][str(c)]['rps']:.1f} req/s (**{x['served'][str(c)]['ratio']:.2f}**; "
            + " ".join(f"{v:.2f}" for v in x['served'][str(c)].get('round_ratios', [])) + ")"
            for c in REAL_CONCURRENCY)
        lines.append(f"| {x['label']} | {x['loop_per_s']:.1f} ({x['loop1_per_s']:.1f}) | {cells} | "
                     f"{x['workers_pss_mb']:.0f} | "
                     f"{x['weights_mb']:.0f} + {sum(x['workers_private_mb']):.0f} = {x['pss_bound_mb']:.0f} | "
                     f"{'yes' if x['forked'] else 'no (' + ', '.join(map(str, x['methods'])) + ')'} |")
    m = r["resnet50_max_requests_1"]
    lines += ["", f"ResNet-50, c=4: `--max-requests 1` {m['max-requests 1']['rps']:.1f} req/s against "
                  f"{m['persistent']['rps']:.1f} persistent: **{m['ratio']:.2f}×**.", "",
              "## Small MLP against its combined ceiling (HTTP floor and loop costs added)", "",
              "| c | HTTP floor req/s (µs) | loop passes/s (µs) | ceiling req/s | served req/s (µs) | served ÷ ceiling |",
              "|---|---|---|---:|---|---:|"]
    sm = r["small"]
    for c in ("16", "64"):
        x = sm[c]
        u = x["us_per_request"]
        lines.append(f"| {c} | {x['floor_rps']:,.0f} ({u['floor']:.1f}) | {sm['loop_per_s']:,.0f} ({u['loop']:.1f}) | "
                     f"{x['ceiling_rps']:,.0f} | {x['served_rps']:,.0f} ({u['served']:.1f}) | **{x['ratio']:.2f}** |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- server


class Server:
    """`app --production` in its own process group, JSON logs to a file."""

    def __init__(self, model, workers, max_requests=0, tag="run", metrics=False, metadata=None,
                 extra=()):
        """`model` names an entry of MODELS (its request body); `metadata` replaces its
        metadata file when given; `extra`: more `app` arguments (with `--tls-cert`, the
        readiness check speaks TLS)."""
        self.tls = "--tls-cert" in extra
        self.port = free_port()
        self.metrics_port = free_port() if metrics else None
        self.model = model
        self.workers = workers
        self.log_path = os.path.join(TMP, f"log-{tag}.jsonl")
        env = dict(os.environ)
        # Master debug lines (worker started / retiring) without the worker's per-request ones.
        env["VRAMFORK_LOG"] = "info,vramfork::master=debug"
        meta = metadata or MODELS[model]["metadata"]
        cmd = [
            "--metadata", meta,
            "--port", str(self.port), "--workers", str(workers),
            "--max-requests", str(max_requests), "--log-format", "json",
        ]
        if metrics:
            cmd += ["--metrics-port", str(self.metrics_port)]
        cmd += list(extra)
        # `BIN` as this module holds it at the call: ab_builds.py points it at each build.
        self.app = App(cmd, self.log_path, env=env, binary_dir=BIN)
        self.t0 = self.app.t0
        self.proc = self.app.proc

    def wait_ready(self, deadline_s=60, body=None):
        """Until every worker has logged ready and a POST (of `body`, else the model's)
        answers 200."""
        body = body or MODELS[self.model]["body"]

        def ready():
            n = sum(1 for e in read_log(self.log_path) if " ready in " in e["msg"]
                    and e["msg"].startswith("worker "))
            return n >= self.workers and post_once(self.port, body, tls=self.tls) == 200
        self.app.wait(ready, deadline_s)

    def pids(self):
        """{pid: comm} of the master and its children (template, workers)."""
        out = {self.proc.pid: "master"}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
                ppid = int(st[st.rfind(")") + 2:].split()[1])
                if ppid == self.proc.pid:
                    with open(f"/proc/{d}/comm") as f:
                        out[int(d)] = f.read().strip()
            except (OSError, ValueError):
                pass
        return out

    def stop(self):
        self.app.stop()


TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$")


def parse_ts(s):
    m = TS.match(s or "")
    if not m:
        return None
    frac = (m.group(2) or "0")[:6].ljust(6, "0")
    dt = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return dt.timestamp() + int(frac) / 1e6


def read_log(path):
    out = []
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        fields = e.get("fields", {})
        span = e.get("span") or {}
        out.append({"ts": parse_ts(e.get("timestamp")), "msg": str(fields.get("message", "")),
                    "fields": fields, "span": span})
    return out


# ---------------------------------------------------------------- load generator


def wrk(port, body, conns, seconds, path="/", header_len=None, scheme="http", close=False):
    """wrk POSTing `body` (str or bytes) to `path`; `header_len` makes it a v2 binary request
    (Inference-Header-Content-Length); `scheme` https for TLS; `close`: a new connection per
    request."""
    cmd = ["wrk", "-t", "1", "-c", str(conns), "-d", f"{seconds}s", "--timeout", "10s",
           "-s", os.path.join(HERE, "post.lua"), f"{scheme}://127.0.0.1:{port}{path}"]
    env = dict(os.environ)
    env.pop("BENCH_BODY_FILE", None)
    if close:
        env["BENCH_CLOSE"] = "1"
    if isinstance(body, bytes) or len(body) > 64 << 10:
        # A file (removed after the run): binary bodies cannot travel in the environment,
        # nor can large ones.
        env["BENCH_BODY_FILE"] = os.path.join(TMP, f"body-{port}.bin")
        with open(env["BENCH_BODY_FILE"], "wb") as f:
            f.write(body if isinstance(body, bytes) else body.encode())
    else:
        env["BENCH_BODY"] = body
    if header_len is not None:
        env["BENCH_HEADER_LEN"] = str(header_len)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 30)
    finally:
        if "BENCH_BODY_FILE" in env:
            os.remove(env["BENCH_BODY_FILE"])
    for line in p.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            r = json.loads(line[len("BENCHJSON "):])
            secs = r["duration_us"] / 1e6
            errs = r["errors"]
            socket_errors = errs["connect"] + errs["read"] + errs["write"] + errs["timeout"]
            return {
                "rps": r["requests"] / secs if secs else 0.0,
                "requests": r["requests"],
                "resp_bytes": r["bytes"] / r["requests"] if r["requests"] else 0.0,
                "p50_ms": r["lat_us"]["pct"]["50"] / 1e3,
                "p99_ms": r["lat_us"]["pct"]["99"] / 1e3,
                "pct_ms": {k: v / 1e3 for k, v in r["lat_us"]["pct"].items()},
                "non2xx": errs["status"],
                "socket_errors": socket_errors,
                "failed": errs["status"] + socket_errors,
                "errors": errs,
            }
    raise RuntimeError(f"wrk gave no result: {p.stdout} {p.stderr}")


def summarize(runs):
    """Medians over repetitions; keeps the latency distribution of the median-rps run."""
    rs = sorted(runs, key=lambda r: r["rps"])
    mid = rs[len(rs) // 2]
    return {
        "rps": median([r["rps"] for r in runs]),
        "p50_ms": median([r["p50_ms"] for r in runs]),
        "p99_ms": median([r["p99_ms"] for r in runs]),
        "failed": sum(r["failed"] for r in runs),
        "non2xx": sum(r["non2xx"] for r in runs),
        "socket_errors": sum(r["socket_errors"] for r in runs),
        "requests": sum(r["requests"] for r in runs),
        "errors": {k: sum(r["errors"][k] for r in runs) for k in runs[0]["errors"]},
        "reps": len(runs),
        "rps_all": [round(r["rps"], 1) for r in runs],
        "pct_ms": mid["pct_ms"],
    }


# ---------------------------------------------------------------- measurements


def loops(model_path, shape, procs, threads, seconds, slack=60, data=None):
    """`procs` concurrent forward-loop processes on `model_path` at `shape` (forward-loop's
    SHAPE; its DATA file when given): passes/s summed and the median per-pass p50."""
    cmd = [os.path.join(BIN, "forward-loop"), model_path, shape, str(threads), str(seconds)]
    if data:
        cmd.append(data)
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    res = [json.loads(p.communicate(timeout=seconds + slack)[0]) for p in ps]
    return {"per_s": sum(r["per_s"] for r in res), "pass_p50_ms": median([r["p50_ms"] for r in res])}


def forward_limit(model, procs, threads, seconds):
    """Sum of forward passes/s of `procs` concurrent forward-loop processes."""
    m = MODELS[model]
    return loops(m["model"], m["shape"], procs, threads, seconds)


def measure_limits(cfg, before=None):
    """Median over `reps` runs now plus the runs of `before` (an earlier call's raw runs), so
    that the limit spans the same stretch of time as the served runs."""
    out = {}
    for model in MODELS:
        two = list(before[model]["runs_2x1"]) if before else []
        one = list(before[model]["runs_1x2"]) if before else []
        for _ in range(cfg["reps"]):
            two.append(forward_limit(model, 2, 1, cfg["limit_s"]))
            one.append(forward_limit(model, 1, 2, cfg["limit_s"]))
        out[model] = {
            "2proc_1thread_per_s": median([r["per_s"] for r in two]),
            "1proc_2threads_per_s": median([r["per_s"] for r in one]),
            "pass_p50_ms_1thread": median([r["pass_p50_ms"] for r in two]),
            "reps": len(two),
            "runs_2x1": two,
            "runs_1x2": one,
        }
        log(f"limit {model}: 2x1 {out[model]['2proc_1thread_per_s']:.1f}/s, "
            f"1x2 {out[model]['1proc_2threads_per_s']:.1f}/s")
    return out


def memory(server):
    procs = []
    for pid, comm in sorted(server.pids().items()):
        try:
            with open(f"/proc/{pid}/status") as f:
                rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss = int(re.search(r"^Pss:\s+(\d+)", f.read(), re.M).group(1))
        except (OSError, AttributeError):
            continue
        procs.append({"pid": pid, "role": comm, "rss_mb": rss / 1024, "pss_mb": pss / 1024})
    return procs


def measure_serving(cfg):
    results, mem = {}, {}
    for model in MODELS:
        for workers in (1, 2):
            srv = Server(model, workers, tag=f"{model}-w{workers}")
            try:
                srv.wait_ready()
                wrk(srv.port, MODELS[model]["body"], 2, 1)  # warm-up
                runs = {c: [] for c in CONCURRENCY}
                for _ in range(cfg["reps"]):
                    for c in CONCURRENCY:
                        runs[c].append(wrk(srv.port, MODELS[model]["body"], c, cfg["load_s"]))
                for c in CONCURRENCY:
                    s = summarize(runs[c])
                    results[f"{model}/w{workers}/c{c}"] = dict(s, model=model, workers=workers,
                                                               concurrency=c)
                    log(f"{model} w{workers} c{c}: {s['rps']:.0f} req/s p50 {s['p50_ms']:.3f} ms "
                        f"p99 {s['p99_ms']:.3f} ms failed {s['failed']}")
                if workers == 2:
                    mem[model] = memory(srv)
            finally:
                srv.stop()
    return results, mem


def scrape_body(port):
    """One GET /metrics on a fresh connection (Connection: close): the body's bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        raw = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"scrape failed: {head[:80]!r}")
    return body


def scrape_ms(port):
    """One GET /metrics on a fresh connection: (milliseconds to the whole body, body bytes)."""
    t = time.perf_counter()
    body = scrape_body(port)
    return (time.perf_counter() - t) * 1e3, len(body)


def measure_access(cfg):
    """The access log off vs on (`--access-log`, JSON lines to the server's log file): small
    MLP, 2 workers, concurrency 16 and 64, the two servers' runs interleaved."""
    out = {}
    body = MODELS["mlp"]["body"]
    srvs = {"off": Server("mlp", 2, tag="access-off"),
            "on": Server("mlp", 2, tag="access-on", extra=("--access-log",))}
    try:
        for srv in srvs.values():
            srv.wait_ready()
            wrk(srv.port, body, 2, 1)  # warm-up
        for c in (16, 64):
            runs = interleaved(list(srvs), cfg["reps"] + 2,
                               lambda k: wrk(srvs[k].port, body, c, cfg["load_s"]))
            out[str(c)] = {k: summarize(v) for k, v in runs.items()}
            on, off = out[str(c)]["on"]["rps"], out[str(c)]["off"]["rps"]
            out[str(c)]["ratio"] = on / off
            log(f"access log c={c}: off {off:.0f} req/s, on {on:.0f} req/s ({on / off:.3f})")
        with open(srvs["on"].log_path) as f:
            out["lines"] = sum(1 for line in f if '"event":"access"' in line)
    finally:
        for srv in srvs.values():
            srv.stop()
    return out


def measure_tls(cfg):
    """TLS vs plain HTTP (`--tls-cert`/`--tls-key`, an ECDSA P-256 certificate made with
    openssl): small MLP, 2 workers, c=16, keep-alive and a new connection per request (each a
    new TCP connection, and over TLS a full handshake), the two servers' runs interleaved."""
    d = os.path.join(TMP, "tls")
    os.makedirs(d, exist_ok=True)
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    body = MODELS["mlp"]["body"]
    srvs = {"plain": (Server("mlp", 2, tag="tls-plain"), "http"),
            "tls": (Server("mlp", 2, tag="tls-on", extra=("--tls-cert", cert, "--tls-key", key)),
                    "https")}
    out = {"c": 16}
    try:
        for srv, scheme in srvs.values():
            srv.wait_ready()
            wrk(srv.port, body, 2, 1, scheme=scheme)  # warm-up
        for mode, close in (("keep-alive", False), ("new connection", True)):
            runs = interleaved(list(srvs), cfg["reps"] + 2,
                               lambda k: wrk(srvs[k][0].port, body, 16, cfg["load_s"],
                                             scheme=srvs[k][1], close=close))
            out[mode] = {k: summarize(v) for k, v in runs.items()}
            t, p = out[mode]["tls"]["rps"], out[mode]["plain"]["rps"]
            out[mode]["ratio"] = t / p
            log(f"TLS {mode} c=16: plain {p:.0f} req/s, TLS {t:.0f} req/s ({t / p:.3f})")
    finally:
        for srv, _ in srvs.values():
            srv.stop()
    return out


def rps_cell(x):
    """A summary's median req/s with every run's beside it: `21509 (30066, 23117, …)`."""
    return f"{fmt(x['rps'], 0)} ({', '.join(fmt(v, 0) for v in x['rps_all'])})"


def interleaved(names, reps, run_one):
    """`reps` rounds of `run_one(name)` for each of `names`, the order alternating from round
    to round so that a slow stretch of this shared machine hits every side: {name: runs}."""
    runs = {k: [] for k in names}
    for i in range(reps):
        for k in (names if i % 2 == 0 else list(reversed(names))):
            runs[k].append(run_one(k))
    return runs


def tls_markdown(a):
    L = ["\n## TLS vs plain HTTP (small MLP, 2 workers, c=16)\n",
         "The two servers' runs interleaved (order alternating), medians; an ECDSA P-256 "
         "certificate; new connection = `Connection: close` on every request, so each request "
         "pays a TCP connection and, over TLS, a full handshake.\n",
         "| connections | plain req/s (runs) | TLS req/s (runs) | TLS ÷ plain | p50 plain / TLS (ms) | failed plain / TLS |",
         "|---|---|---|---|---|---|"]
    for mode in ("keep-alive", "new connection"):
        x = a[mode]
        L.append(f"| {mode} | {rps_cell(x['plain'])} | {rps_cell(x['tls'])} | "
                 f"**{fmt(x['ratio'], 3)}** | {fmt(x['plain']['p50_ms'], 3)} / {fmt(x['tls']['p50_ms'], 3)} | "
                 f"{x['plain'].get('failed', 0)} / {x['tls'].get('failed', 0)} |")
    return "\n".join(L) + "\n"


def access_markdown(a):
    L = ["\n## Access log (`--access-log`) on vs off (small MLP, 2 workers)\n",
         "The two servers' runs interleaved (order alternating), medians.\n",
         "| c | off req/s (runs) | on req/s (runs) | on ÷ off | p50 off / on (ms) |",
         "|---|---|---|---|---|"]
    for c in ("16", "64"):
        x = a[c]
        L.append(f"| {c} | {rps_cell(x['off'])} | {rps_cell(x['on'])} | "
                 f"**{fmt(x['ratio'], 3)}** | {fmt(x['off']['p50_ms'], 3)} / {fmt(x['on']['p50_ms'], 3)} |")
    L.append(f"\nAccess lines written by the server with the log on: {a['lines']:,}.\n")
    return "\n".join(L) + "\n"


def measure_metrics(cfg):
    """Metrics off vs on: small-model throughput, 2 workers, concurrency 8, the two servers'
    runs interleaved so they share the same stretch of time (the idle one costs a heartbeat
    a second); and the time of a scrape with 2 and 32 workers (while idle, after traffic)."""
    out = {"throughput": {}, "scrape": {}}
    body = MODELS["mlp"]["body"]
    srvs = {"off": Server("mlp", 2, tag="metrics-off"),
            "on": Server("mlp", 2, tag="metrics-on", metrics=True)}
    try:
        for srv in srvs.values():
            srv.wait_ready()
            wrk(srv.port, body, 2, 1)  # warm-up
        runs = {k: [] for k in srvs}
        for _ in range(cfg["reps"] + 2):
            for k, srv in srvs.items():
                runs[k].append(wrk(srv.port, body, 8, cfg["load_s"]))
        for k in srvs:
            out["throughput"][k] = summarize(runs[k])
        log(f"metrics off {out['throughput']['off']['rps']:.0f} req/s, "
            f"on {out['throughput']['on']['rps']:.0f} req/s")
    finally:
        for srv in srvs.values():
            srv.stop()
    for workers in (2, 32):
        srv = Server("mlp", workers, tag=f"metrics-scrape-w{workers}", metrics=True)
        try:
            srv.wait_ready(deadline_s=180)
            wrk(srv.port, body, 8, 1)
            time.sleep(1.5)  # every worker's report has reached the master
            samples = [scrape_ms(srv.metrics_port) for _ in range(cfg["scrapes"])]
            ms = sorted(x[0] for x in samples)
            out["scrape"][str(workers)] = {
                "p50_ms": median(ms), "max_ms": ms[-1], "bytes": samples[-1][1], "n": len(ms)}
            log(f"scrape with {workers} workers: p50 {median(ms):.2f} ms, "
                f"{samples[-1][1]} bytes")
        finally:
            srv.stop()
    return out


def cpu_seconds(server):
    """utime + stime of the master and its children (template, workers), in seconds."""
    total = 0.0
    for pid in server.pids():
        try:
            total += process_cpu_seconds(pid)
        except (OSError, ValueError, IndexError):
            pass
    return total


def v2_bodies(model, shape, values):
    """The same input as a `POST /` body, a v2 JSON body and a v2 binary body (binary answer
    asked for too), each with its path and Inference-Header-Content-Length."""

    def nested(flat, dims):
        if len(dims) == 1:
            return flat
        step = len(flat) // dims[0]
        return [nested(flat[i * step:(i + 1) * step], dims[1:]) for i in range(dims[0])]

    path = f"/v2/models/{model}/infer"
    inp = {"name": "input__0", "shape": shape, "datatype": "FP32"}
    head = json.dumps({"inputs": [dict(inp, parameters={"binary_data_size": 4 * len(values)})],
                       "parameters": {"binary_data_output": True}}).encode()
    raw = struct.pack(f"<{len(values)}f", *values)
    return {
        "post": {"path": "/", "body": json.dumps({"inputs": nested(values, shape)}),
                 "header_len": None},
        "v2-json": {"path": path, "body": json.dumps({"inputs": [dict(inp, data=values)]}),
                    "header_len": None},
        "v2-binary": {"path": path, "body": head + raw, "header_len": len(head)},
    }


def measure_v2(cfg):
    """POST / vs v2 JSON vs v2 binary on the same server, runs interleaved: the small MLP at
    concurrency 8 and a [1, 3, 224, 224] float32 image at concurrency 2 (2 workers). Per
    request: bytes sent (body), bytes read (answer with headers, from wrk) and the server's
    CPU time (master + workers, from /proc, over the run)."""
    rnd = random.Random(7)
    n = 3 * 224 * 224
    # float32 values written as clients write them (numpy float32 -> Python float -> JSON).
    image = [struct.unpack("<f", struct.pack("<f", rnd.random()))[0] for _ in range(n)]
    cases = {
        "mlp": {"metadata": None, "name": "mlp-fixture", "shape": [1, 4],
                "values": [1.0, 2.0, 3.0, 4.0], "c": 8},
        "image": {"metadata": IMAGE_METADATA, "name": "bench-image", "shape": [1, 3, 224, 224],
                  "values": image, "c": 2},
    }
    out = {}
    for case, spec in cases.items():
        bodies = v2_bodies(spec["name"], spec["shape"], spec["values"])
        srv = Server("mlp", 2, tag=f"v2-{case}", metadata=spec["metadata"])
        try:
            srv.wait_ready(body=bodies["post"]["body"])
            runs = {k: [] for k in bodies}
            cpu = {k: [] for k in bodies}
            for k, b in bodies.items():  # warm-up
                wrk(srv.port, b["body"], 2, 1, b["path"], b["header_len"])
            for _ in range(cfg["reps"]):
                for k, b in bodies.items():
                    before = cpu_seconds(srv)
                    r = wrk(srv.port, b["body"], spec["c"], cfg["load_s"], b["path"],
                            b["header_len"])
                    used = cpu_seconds(srv) - before
                    runs[k].append(r)
                    cpu[k].append(used / r["requests"] * 1e6 if r["requests"] else 0.0)
            out[case] = {"concurrency": spec["c"], "shape": spec["shape"], "rows": {}}
            for k, b in bodies.items():
                body = b["body"]
                row = dict(summarize(runs[k]),
                           req_bytes=len(body if isinstance(body, bytes) else body.encode()),
                           resp_bytes=median([r["resp_bytes"] for r in runs[k]]),
                           cpu_us_per_req=median(cpu[k]))
                out[case]["rows"][k] = row
                log(f"v2 {case} {k}: {row['rps']:.0f} req/s p50 {row['p50_ms']:.3f} ms "
                    f"{row['req_bytes']} B in, {row['resp_bytes']:.0f} B out, "
                    f"{row['cpu_us_per_req']:.0f} µs CPU/request, failed {row['failed']}")
        finally:
            srv.stop()
    return out


def v2_markdown(v2):
    L = ["\n## v2 (Open Inference Protocol) beside `POST /`: JSON vs binary tensors\n"]
    L.append("Same server, same input, the three bodies' runs interleaved (2 workers). Bytes in: "
             "the request body; bytes out: the answer with its headers (wrk); CPU: the master's "
             "and workers' user + system time over the runs ÷ requests.\n")
    for case, v in v2.items():
        L.append(f"\n### {case}: input {v['shape']} float32, concurrency {v['concurrency']}\n")
        L.append("| request | req/s (runs) | p50 (ms) | p99 (ms) | bytes in | bytes out | "
                 "server CPU/request (µs) | failed |")
        L.append("|---|---|---|---|---|---|---|---|")
        for k, r in v["rows"].items():
            L.append(f"| {k} | {fmt(r['rps'], 0)} ({', '.join(fmt(x, 0) for x in r['rps_all'])}) "
                     f"| {fmt(r['p50_ms'], 3)} | {fmt(r['p99_ms'], 3)} | {r['req_bytes']} | "
                     f"{fmt(r['resp_bytes'], 0)} | {fmt(r['cpu_us_per_req'], 0)} | {r['failed']} |")
        j, b = v["rows"]["v2-json"], v["rows"]["v2-binary"]
        L.append(f"\nv2 binary ÷ v2 JSON: bytes in {fmt(b['req_bytes'] / j['req_bytes'], 3)}, "
                 f"CPU/request {fmt(b['cpu_us_per_req'] / j['cpu_us_per_req'], 3)}, "
                 f"req/s {fmt(b['rps'] / j['rps'], 2)}\n")
    return "\n".join(L) + "\n"


def measure_warm(cfg):
    """The template's warm-up pass: the medium model with persistent workers, with
    `--max-requests 1` (a fresh forked worker per request) from a warmed template, and with
    `--max-requests 1` from a cold one (the same model with no declared input shape, so the
    template has nothing to warm up on); 2 workers, concurrency 4, the three servers' runs
    interleaved."""
    meta = MODELS["medium"]["metadata"]
    with open(meta) as f:
        doc = json.load(f)
    doc.pop("input", None)
    cold = os.path.join(TMP, "medium-cold.json")
    with open(cold, "w") as f:
        json.dump(dict(doc, model=os.path.join(TMP, "medium.pt")), f)
    body = MODELS["medium"]["body"]
    setups = {"persistent": (None, 0), "max-requests 1, warm template": (None, 1),
              "max-requests 1, cold template": (cold, 1)}
    runs = {k: [] for k in setups}
    warmup = {}
    for _ in range(cfg["reps"]):
        for i, (k, (metadata, mr)) in enumerate(setups.items()):
            srv = Server("medium", 2, max_requests=mr, tag=f"warm-{i}", metadata=metadata)
            try:
                srv.wait_ready()
                wrk(srv.port, body, 2, 1)
                runs[k].append(wrk(srv.port, body, 4, cfg["load_s"]))
                for e in read_log(srv.log_path):
                    if e["msg"].startswith("template process"):
                        warmup[k] = e["fields"].get("warmup_ms")
            finally:
                srv.stop()
    out = {k: dict(summarize(v), template_warmup_ms=warmup.get(k)) for k, v in runs.items()}
    base = out["persistent"]["rps"]
    for k, v in out.items():
        v["ratio_to_persistent"] = v["rps"] / base if base else 0.0
        log(f"warm {k}: {v['rps']:.1f} req/s ({v['ratio_to_persistent']:.3f} of persistent) "
            f"p50 {v['p50_ms']:.2f} ms failed {v['failed']}")
    return out


def warm_markdown(w):
    L = ["\n## The template's warm-up pass (medium model, 2 workers, concurrency 4)\n"]
    L.append("| workers | req/s (runs) | ÷ persistent | p50 (ms) | p99 (ms) | template warm-up (ms) "
             "| failed |")
    L.append("|---|---|---|---|---|---|---|")
    for k, v in w.items():
        L.append(f"| {k} | {fmt(v['rps'], 1)} ({', '.join(fmt(x, 1) for x in v['rps_all'])}) | "
                 f"{fmt(v['ratio_to_persistent'], 3)} | {fmt(v['p50_ms'], 2)} | "
                 f"{fmt(v['p99_ms'], 2)} | {fmt(v['template_warmup_ms'] or 0, 1)} | "
                 f"{v['failed']} |")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- warm exec'd workers

FIRST_PASSES = [0, 1, 2, 3]  # --warmup-passes compared (2 is the default)


def timed_post(port, body, timeout=30.0):
    """One POST / on a fresh connection, read to the end; (status, ms) or None."""
    req = (
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(req)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    ms = (time.perf_counter() - t0) * 1e3
    return int(data.split(b" ", 2)[1]), ms


def first_vs_steady(meta_path, model_path, body, passes, steady_n):
    """Starts app-worker by exec the way the master starts a GPU worker (and development
    mode its one worker): configuration in the environment, listening socket on fd 3,
    control socket on fd 4, 1 torch thread, `warmup_passes` = `passes`. Once it reports
    ready, times its first POST / and `steady_n` more (each on a fresh connection, one at a
    time); returns (first ms, median of the second half of the rest, the worker's
    warmup_ms), or None when it failed."""
    with open(meta_path) as f:
        md = f.read()
    cfg = {
        "slot": 0, "generation": 0, "metadata_json": md, "metadata_path": meta_path,
        "model_path": model_path, "device": "cpu", "gpu": None, "max_requests": 0,
        "max_worker_gpu_mb": None, "max_body_bytes": 1 << 20, "request_timeout_ms": 60000,
        "heartbeat_ms": 1000, "graceful_timeout_ms": 1000, "torch_threads": 1,
        "nvml_library": None, "has_control": True, "log_json": True, "warmup_passes": passes,
    }
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    import fcntl
    lfd = fcntl.fcntl(lsock.fileno(), fcntl.F_DUPFD, 100)
    cfd = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD, 100)

    def child():
        os.dup2(lfd, 3)
        os.dup2(cfd, 4)

    env = dict(os.environ, VRAMFORK_WORKER_CONFIG=json.dumps(cfg), LISTEN_FDS="1",
               VRAMFORK_LOG="warn")
    env.pop("VRAMFORK_TEMPLATE", None)
    p = subprocess.Popen([os.path.join(BIN, "app-worker")], env=env, preexec_fn=child,
                         close_fds=False, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(lfd)
    os.close(cfd)
    theirs.close()
    ours.settimeout(60)
    buf = b""
    try:
        while b"\n" not in buf:
            chunk = ours.recv(4096)
            if not chunk:
                return None
            buf += chunk
        msg = json.loads(buf.split(b"\n")[0])
        if msg.get("msg") != "ready":
            return None
        times = []
        for _ in range(1 + steady_n):
            r = timed_post(port, body)
            if r is None or r[0] != 200:
                return None
            times.append(r[1])
        return times[0], median(times[1 + steady_n // 2:]), msg["boot_ms"]["warmup_ms"]
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        ours.close()
        lsock.close()


def measure_first(cfg):
    """Warm exec'd workers: an exec'd worker's first request against its steady latency, for
    each --warmup-passes in FIRST_PASSES (2 is the default), on the medium model (~5.5 ms
    pass) and the small MLP; `starts` fresh workers per setting, the settings interleaved;
    ratio = median over starts of first ÷ steady."""
    starts = cfg["first_starts"]
    out = {}
    for name in ("medium", "mlp"):
        m = MODELS[name]
        runs = {n: [] for n in FIRST_PASSES}
        for _ in range(starts):
            for n in FIRST_PASSES:
                r = first_vs_steady(m["metadata"], m["model"], m["body"], n, cfg["first_steady"])
                if r:
                    runs[n].append(r)
        out[name] = {}
        for n, rs in runs.items():
            v = {
                "first_ms": median([r[0] for r in rs]),
                "steady_ms": median([r[1] for r in rs]),
                "ratio": median([r[0] / r[1] for r in rs]),
                "ratios": [r[0] / r[1] for r in rs],
                "warmup_ms": median([r[2] for r in rs]),
                "starts": len(rs),
            }
            out[name][str(n)] = v
            log(f"first {name} --warmup-passes {n}: first {fmt(v['first_ms'], 2)} ms, steady "
                f"{fmt(v['steady_ms'], 2)} ms, ratio {fmt(v['ratio'], 2)} "
                f"({', '.join(fmt(x, 2) for x in v['ratios'])}), warm-up {fmt(v['warmup_ms'], 1)} ms")
    return out


def first_markdown(f):
    L = ["\n## Warm exec'd workers: first request ÷ steady (1 torch thread, requests one at a "
         "time, each on a fresh connection)\n"]
    L.append("| model | --warmup-passes | first request (ms) | steady (ms) | first ÷ steady, "
             "median (each start) | warm-up (ms) |")
    L.append("|---|---|---|---|---|---|")
    for name, rows in f.items():
        for n, v in rows.items():
            dflt = " (default)" if n == "2" else ""
            L.append(f"| {name} | {n}{dflt} | {fmt(v['first_ms'], 2)} | {fmt(v['steady_ms'], 2)} | "
                     f"**{fmt(v['ratio'], 2)}** ({', '.join(fmt(x, 2) for x in v['ratios'])}) | "
                     f"{fmt(v['warmup_ms'], 1)} |")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- dynamic batching

METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def scrape_text(port):
    """GET /metrics on a fresh connection: the body (Prometheus text format)."""
    return scrape_body(port).decode()


def batch_counts(port):
    """{"batches": {size range: forward passes}, "rows": rows in them} from
    vramfork_batches_total{size=...} and vramfork_batch_rows_total (summed over any other
    labels; empty while batching is off)."""
    batches, rows = {}, 0
    for line in scrape_text(port).splitlines():
        m = METRIC_LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if name == "vramfork_batches_total":
            size = re.search(r'size="([^"]*)"', labels)
            if size:
                batches[size.group(1)] = batches.get(size.group(1), 0) + int(float(value))
        elif name == "vramfork_batch_rows_total":
            rows += int(float(value))
    return {"batches": batches, "rows": rows}


def settled_counts(port, quiet_s=1.6, deadline_s=10.0):
    """Workers report their counts with their heartbeat (about once a second): scrapes until
    the counts have not changed for `quiet_s` (longer than one heartbeat), or the deadline."""
    t0 = time.monotonic()
    last = batch_counts(port)
    changed = t0
    while time.monotonic() - t0 < deadline_s:
        time.sleep(0.25)
        now = batch_counts(port)
        if now != last:
            last, changed = now, time.monotonic()
        elif time.monotonic() - changed >= quiet_s:
            break
    return last


def size_lower(label):
    """The first row count of a size range ("3-4" -> 3)."""
    try:
        return int(label.split("-")[0])
    except ValueError:
        return 1 << 30


def count_diff(before, after):
    sizes = sorted(set(before["batches"]) | set(after["batches"]), key=size_lower)
    batches = {k: after["batches"].get(k, 0) - before["batches"].get(k, 0) for k in sizes}
    return {"batches": {k: v for k, v in batches.items() if v}, "passes": sum(batches.values()),
            "rows": after["rows"] - before["rows"]}


def forward_limit_at(model_path, width, rows, procs, seconds):
    """`procs` concurrent forward-loop processes (1 torch thread each) at shape [rows, width]:
    passes/s summed, and rows/s = passes/s x rows."""
    r = loops(model_path, f"{rows},{width}", procs, 1, seconds, slack=120)
    return {"rows": rows, "passes_per_s": r["per_s"], "rows_per_s": r["per_s"] * rows,
            "pass_p50_ms": r["pass_p50_ms"]}


def measure_batching(cfg):
    """Batching off vs on (`--max-batch-size 16`, `--batch-timeout-ms 0`) for the small MLP,
    the medium model and the memory-bound wide model: 2 workers, 1 torch thread each,
    concurrency 1/4/16/64 from wrk. The two servers of a model are up together and their
    runs interleaved (the idle one costs a heartbeat a second). Around each (mode,
    concurrency) group of runs, /metrics is scraped once the workers' reports have settled:
    the difference of vramfork_batches_total by size and of vramfork_batch_rows_total is the
    batches the workers formed in those runs. Then, servers stopped, the model's own limit
    (2 forward-loop processes x 1 thread) at shape [B, width], B = the mean rows per pass the
    run formed, rounded (1 with batching off): limit rows/s = passes/s x B."""
    out = {"max_batch_size": BATCH_MAX, "batch_timeout_ms": 0, "workers": 2,
           "torch_threads": 1, "concurrency": BATCH_CONCURRENCY, "reps": cfg["batch_reps"],
           "load_s": cfg["batch_load_s"], "limit_s": cfg["limit_s"],
           "started": time.strftime("%Y-%m-%d %H:%M %Z"), "models": {}}
    modes = {
        "off": ["--torch-threads", "1"],
        "on": ["--torch-threads", "1", "--max-batch-size", str(BATCH_MAX),
               "--batch-timeout-ms", "0"],
    }
    for model, spec in BATCH_MODELS.items():
        with open(spec["metadata"]) as f:
            declared = json.load(f).get("max_batch_size") or 0
        body = spec["body"]
        srvs = {}
        try:
            for mode, args in modes.items():
                if mode == "off" and declared:
                    args = args + ["--max-batch-size", "0"]
                srvs[mode] = Server(model, 2, tag=f"batching-{model}-{mode}", metrics=True,
                                    metadata=spec["metadata"], extra=args)
            for srv in srvs.values():
                srv.wait_ready(deadline_s=120, body=body)
            for srv in srvs.values():  # warm-up: every batch shape the runs will form
                wrk(srv.port, body, 4, 1)
                wrk(srv.port, body, max(BATCH_CONCURRENCY), 1)
            counts = {mode: settled_counts(srv.metrics_port) for mode, srv in srvs.items()}
            rows = {}
            for i, c in enumerate(BATCH_CONCURRENCY):
                # Alternate which mode goes first, so neither always runs just after the other.
                order = list(srvs) if i % 2 == 0 else list(reversed(list(srvs)))
                for mode in order:
                    srv = srvs[mode]
                    runs = [wrk(srv.port, body, c, cfg["batch_load_s"])
                            for _ in range(cfg["batch_reps"])]
                    after = settled_counts(srv.metrics_port)
                    d = count_diff(counts[mode], after)
                    counts[mode] = after
                    s = summarize(runs)
                    mean_rows = d["rows"] / d["passes"] if d["passes"] else None
                    rows[(mode, c)] = dict(s, model=model, batching=mode, concurrency=c,
                                           batches=d["batches"], passes=d["passes"],
                                           batch_rows=d["rows"], mean_rows=mean_rows)
                    log(f"batching {model} {mode} c{c}: {s['rps']:.0f} req/s "
                        f"p50 {s['p50_ms']:.2f} ms p99 {s['p99_ms']:.2f} ms, "
                        f"{d['passes']} passes, {d['rows']} rows "
                        f"(mean {mean_rows or 0:.2f}) {d['batches']}, "
                        f"{s['requests']} answered, failed {s['failed']}")
        finally:
            for srv in srvs.values():
                srv.stop()
        # The model's own limit at each batch size the runs formed (and at 1 and BATCH_MAX).
        limits = {}
        for r in rows.values():
            r["limit_rows_at"] = max(1, round(r["mean_rows"])) if r["mean_rows"] else 1
        for b in sorted({1, BATCH_MAX} | {r["limit_rows_at"] for r in rows.values()}):
            limits[b] = forward_limit_at(spec["model"], spec["width"], b, 2, cfg["limit_s"])
            log(f"limit {model} [{b},{spec['width']}]: {limits[b]['passes_per_s']:.1f} passes/s, "
                f"{limits[b]['rows_per_s']:.0f} rows/s, pass p50 "
                f"{limits[b]['pass_p50_ms']:.3f} ms")
        for r in rows.values():
            lim = limits[r["limit_rows_at"]]["rows_per_s"]
            r["limit_rows_per_s"] = lim
            r["served_over_limit"] = r["rps"] / lim if lim else None
        ratio = {}
        for c in BATCH_CONCURRENCY:
            off, on = rows[("off", c)], rows[("on", c)]
            ratio[str(c)] = {
                "rps": on["rps"] / off["rps"] if off["rps"] else None,
                "p50": on["p50_ms"] / off["p50_ms"] if off["p50_ms"] else None,
                "p99": on["p99_ms"] / off["p99_ms"] if off["p99_ms"] else None,
            }
        out["models"][model] = {
            "width": spec["width"],
            "runs": {f"{m}/c{c}": rows[(m, c)] for m in modes for c in BATCH_CONCURRENCY},
            "limits": {str(b): v for b, v in limits.items()},
            "on_over_off": ratio,
        }
    return out


def batch_dist(batches, passes):
    if not passes:
        return "–"
    def pct(v):
        return "<1%" if 100 * v / passes < 0.5 else f"{100 * v / passes:.0f}%"

    return " ".join(f"{k}:{pct(v)}" for k, v in
                    sorted(batches.items(), key=lambda kv: size_lower(kv[0])))


BATCH_MODEL_LABELS = {
    "mlp": "small MLP (input [-1,4])",
    "medium": "medium (input [-1,16]; compute bound: each row becomes 256×512 activations "
              "through four 512×512 layers)",
    "wide": f"wide (four {WIDE}×{WIDE} linear, input [-1,{WIDE}], memory bound)",
}


def batching_markdown(b):
    L = [f"\n## Dynamic batching: off vs on (`--max-batch-size {b['max_batch_size']}`, "
         f"`--batch-timeout-ms {b['batch_timeout_ms']}`)\n"]
    L.append(f"Run {b['started']}. `app --production --workers {b['workers']} --torch-threads "
             f"{b['torch_threads']}`; the off and on servers of a model up together, their runs "
             f"interleaved; {b['reps']} × {b['load_s']} s per row (req/s: median, runs in "
             f"brackets), after a warm-up. A request is one row. *Rows/pass* and *passes by rows* "
             f"(% of forward passes in each `size` range): the difference of "
             f"`vramfork_batches_total` and `vramfork_batch_rows_total` across the row's runs "
             f"(scraped once the workers' reports settled; not counted with batching off, where "
             f"every pass is 1 row). *Limit*: the model's own loop, 2 `forward-loop` processes × "
             f"1 thread at shape [B, width], B = rows/pass rounded (1 when off), in rows/s.\n")
    L.append("### The model's own loop by batch size (2 processes × 1 thread)\n")
    L.append(f"| model | pass p50 at 1 row (ms) | at {b['max_batch_size']} rows (ms) | "
             f"rows/s at 1 | rows/s at {b['max_batch_size']} | gain |")
    L.append("|---|---|---|---|---|---|")
    top = str(b["max_batch_size"])
    for model, v in b["models"].items():
        one, full = v["limits"]["1"], v["limits"][top]
        L.append(f"| {model} | {fmt(one['pass_p50_ms'], 3)} | {fmt(full['pass_p50_ms'], 3)} | "
                 f"{fmt(one['rows_per_s'], 0)} | {fmt(full['rows_per_s'], 0)} | "
                 f"{fmt(full['rows_per_s'] / one['rows_per_s'], 2)}× |")
    for model, v in b["models"].items():
        L.append(f"\n### {BATCH_MODEL_LABELS.get(model, model)}\n")
        L.append("| batching | c | req/s (runs) | p50 (ms) | p99 (ms) | rows/pass | "
                 "passes by rows | limit rows/s (B) | served ÷ limit | failed |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in v["runs"].values():
            nd = 0 if r["rps"] >= 100 else 1
            L.append(f"| {r['batching']} | {r['concurrency']} | {fmt(r['rps'], nd)} "
                     f"({', '.join(fmt(x, nd) for x in r['rps_all'])}) | "
                     f"{fmt(r['p50_ms'], 2 if r['p50_ms'] >= 1 else 3)} | "
                     f"{fmt(r['p99_ms'], 2 if r['p99_ms'] >= 1 else 3)} | "
                     f"{fmt(r['mean_rows'], 2) if r['batching'] == 'on' else '1'} | "
                     f"{batch_dist(r['batches'], r['passes']) if r['batching'] == 'on' else '(not counted)'} | "
                     f"{fmt(r['limit_rows_per_s'], 0)} ({r['limit_rows_at']}) | "
                     f"{fmt(r['served_over_limit'], 3)} | {r['failed']} |")
    L.append("\n### On ÷ off\n")
    cs = b["concurrency"]
    L.append("| model | " + " | ".join(f"req/s c={c}" for c in cs) + " | "
             + " | ".join(f"p50 c={c}" for c in cs) + " |")
    L.append("|---|" + "---|" * (2 * len(cs)))
    for model, v in b["models"].items():
        rr = v["on_over_off"]
        L.append(f"| {model} | " + " | ".join(f"{fmt(rr[str(c)]['rps'], 2)}" for c in cs)
                 + " | " + " | ".join(f"{fmt(rr[str(c)]['p50'], 2)}" for c in cs) + " |")
    return "\n".join(L) + "\n"

def turnover(entries):
    """From the master's log: per retirement, retiring -> replacement started -> ready (ms)."""
    ret = re.compile(r"^worker (\d+) \(pid (\d+)\) retiring")
    started = re.compile(r"^worker (\d+) \(pid (\d+), generation (\d+)\) started")
    ready = re.compile(r"^worker (\d+) \(pid (\d+), generation (\d+)\) ready in ([\d.]+) ms")
    pending = {}  # slot -> [retiring ts, started ts]
    out = []
    boots = []
    for e in entries:
        if e["ts"] is None:
            continue
        m = ret.match(e["msg"])
        if m:
            pending[m.group(1)] = [e["ts"], None]
            continue
        m = started.match(e["msg"])
        if m and m.group(1) in pending and pending[m.group(1)][1] is None:
            pending[m.group(1)][1] = e["ts"]
            continue
        m = ready.match(e["msg"])
        if m:
            if int(m.group(3)) > 0:
                boots.append(float(m.group(4)))
            if m.group(1) in pending:
                r, s = pending.pop(m.group(1))
                out.append({"total_ms": (e["ts"] - r) * 1e3,
                            "to_start_ms": (s - r) * 1e3 if s else None,
                            "boot_ms": (e["ts"] - s) * 1e3 if s else None})
    return out, boots


def measure_recycling(cfg):
    """A fresh server for every (repetition, concurrency) run: when wrk stops it closes
    connections with requests in flight, and a worker whose last request is dropped that
    way never retires (see docs/performance.md), which would stall the next run. After each
    run one more POST (3 s deadline) checks that the server still answers."""
    out = {}
    for mr in (1, 10, 100, 0):
        runs = {c: [] for c in cfg["recycle_c"]}
        t, boots, answered, died = [], [], [], 0
        for rep in range(cfg["reps"]):
            for c in cfg["recycle_c"]:
                srv = Server("mlp", 2, max_requests=mr, tag=f"recycle-{mr}-c{c}-r{rep}")
                try:
                    srv.wait_ready()
                    runs[c].append(wrk(srv.port, MODELS["mlp"]["body"], c, cfg["load_s"]))
                    answered.append(post_once(srv.port, MODELS["mlp"]["body"], timeout=3) == 200)
                finally:
                    srv.stop()
                entries = read_log(srv.log_path)
                tt, bb = turnover(entries)
                t += tt
                boots += bb
                died += sum(1 for e in entries if "died while booting" in e["msg"])
        key = "persistent" if mr == 0 else str(mr)
        out[key] = {
            "max_requests": mr,
            "by_concurrency": {str(c): summarize(runs[c]) for c in runs},
            "retirements": len(t),
            "turnover_ms_p50": median([x["total_ms"] for x in t]),
            "turnover_ms_p90": (statistics.quantiles([x["total_ms"] for x in t], n=10)[8]
                                if len(t) >= 10 else None),
            "retiring_to_started_ms_p50": median([x["to_start_ms"] for x in t]),
            "started_to_ready_ms_p50": median([x["boot_ms"] for x in t]),
            "forked_ready_in_ms_p50": median(boots),
            "died_while_booting_lines": died,
            "answered_after_run": f"{sum(answered)}/{len(answered)}",
        }
        for c in runs:
            s = out[key]["by_concurrency"][str(c)]
            log(f"max-requests {key} c{c}: {s['rps']:.0f} req/s failed {s['failed']} "
                f"(non-2xx {s['non2xx']}, socket {s['socket_errors']})")
        log(f"max-requests {key}: {len(t)} retirements, turnover p50 {out[key]['turnover_ms_p50']}, "
            f"'died while booting' {died}, answered after run {out[key]['answered_after_run']}")
    return out


def exec_worker_boot(model):
    """Starts app-worker the way the master does when it execs one (config in the
    environment, listening socket on fd 3, control socket on fd 4); returns
    (spawn -> ready ms, the worker's boot_ms)."""
    m = MODELS[model]
    with open(m["metadata"]) as f:
        md = f.read()
    cfg = {
        "slot": 0, "generation": 0, "metadata_json": md, "metadata_path": m["metadata"],
        "model_path": m["model"], "device": "cpu", "gpu": None, "max_requests": 0,
        "max_worker_gpu_mb": None, "max_body_bytes": 1 << 20, "request_timeout_ms": 20000,
        "heartbeat_ms": 1000, "graceful_timeout_ms": 1000, "torch_threads": 1,
        "nvml_library": None, "has_control": True, "log_json": True,
    }
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    import fcntl
    lfd = fcntl.fcntl(lsock.fileno(), fcntl.F_DUPFD, 100)
    cfd = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD, 100)

    def child():
        os.dup2(lfd, 3)
        os.dup2(cfd, 4)

    env = dict(os.environ, VRAMFORK_WORKER_CONFIG=json.dumps(cfg), LISTEN_FDS="1",
               VRAMFORK_LOG="warn")
    env.pop("VRAMFORK_TEMPLATE", None)
    t0 = time.monotonic()
    # close_fds=False: subprocess would otherwise close fds 3 and 4 after preexec_fn.
    p = subprocess.Popen([os.path.join(BIN, "app-worker")], env=env, preexec_fn=child,
                         close_fds=False, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(lfd)
    os.close(cfd)
    theirs.close()
    ours.settimeout(30)
    buf = b""
    result = None
    try:
        while b"\n" not in buf:
            chunk = ours.recv(4096)
            if not chunk:
                break
            buf += chunk
        t1 = time.monotonic()
        msg = json.loads(buf.split(b"\n")[0])
        if msg.get("msg") == "ready":
            result = ((t1 - t0) * 1e3, msg["boot_ms"])
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        ours.close()
        lsock.close()
    return result


def time_cmd(cmd, env=None):
    t0 = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=30)
    return (time.monotonic() - t0) * 1e3


def measure_boot(cfg):
    n = cfg["boot_n"]
    # Process start of a Rust binary without libtorch (app), and of app-worker, which links
    # libtorch: without a configuration it exits right after the dynamic loader is done.
    env = {k: v for k, v in os.environ.items() if k not in ("VRAMFORK_WORKER_CONFIG",
                                                              "VRAMFORK_TEMPLATE")}
    plain = median([time_cmd([os.path.join(BIN, "app"), "--version"]) for _ in range(n)])
    torch = median([time_cmd([os.path.join(BIN, "app-worker")], env) for _ in range(n)])
    out = {"process_start_ms": plain, "libtorch_load_ms": torch - plain,
           "exec_no_libtorch_ms": plain, "exec_with_libtorch_ms": torch}
    for model in MODELS:
        runs = [r for r in (exec_worker_boot(model) for _ in range(n)) if r]
        out[f"exec_{model}"] = {
            "spawn_to_ready_ms": median([r[0] for r in runs]),
            "worker_process_ms": median([r[1]["process_ms"] for r in runs]),
            "worker_model_ms": median([r[1]["model_ms"] for r in runs]),
            "runs": len(runs),
        }
    log(f"boot: {out}")
    return out


def measure_cold(cfg):
    out = {}
    for model in MODELS:
        times, template = [], []
        for i in range(cfg["cold_n"]):
            srv = Server(model, 2, tag=f"cold-{model}-{i}")
            try:
                end = srv.t0 + 30
                t = None
                while time.monotonic() < end:
                    code = post_once(srv.port, MODELS[model]["body"])
                    if code == 200:
                        t = (time.monotonic() - srv.t0) * 1e3
                        break
                    if srv.proc.poll() is not None:
                        break
                    time.sleep(0.002)
                times.append(t)
                time.sleep(0.3)  # let the log catch up
                for e in read_log(srv.log_path):
                    m = re.match(r"template process \(pid \d+\) ready in ([\d.]+) ms", e["msg"])
                    if m:
                        template.append(float(m.group(1)))
            finally:
                srv.stop()
        out[model] = {"first_answer_ms_p50": median(times), "runs_ms": times,
                      "template_ready_ms_p50": median(template)}
        log(f"cold start {model}: {out[model]}")
    return out


# ---------------------------------------------------------------- outputs


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": os.uname().release,
            "mem_gib": round(mem_kb / 2**20, 1),
            "wrk": subprocess.run(["wrk", "--version"], capture_output=True,
                                  text=True).stdout.split(" Copyright")[0].strip()}


def fmt(x, nd=1):
    if x is None:
        return "–"
    return f"{x:.{nd}f}"


def targets(res):
    lim, srv, rec, cold = res["limit"], res["serving"], res["recycling"], res["cold_start"]

    def best(model):
        return max((srv[f"{model}/w2/c{c}"] for c in CONCURRENCY), key=lambda s: s["rps"])

    bm, bd = best("mlp"), best("medium")
    master_rss = max((p["rss_mb"] for m in res["memory"].values() for p in m
                      if p["role"] == "master"), default=None)
    r1 = rec["1"]
    r1_rps = max(s["rps"] for s in r1["by_concurrency"].values())
    r1_failed = sum(s["failed"] for s in r1["by_concurrency"].values())
    rows = [
        ("served ÷ limit, medium model, 2 workers (best concurrency)", "≥ 0.95",
         bd["rps"] / lim["medium"]["2proc_1thread_per_s"], 2, lambda v: v >= 0.95,
         f"c={bd['concurrency']}"),
        ("served ÷ limit, small MLP, 2 workers (best concurrency)", "≥ 0.8",
         bm["rps"] / lim["mlp"]["2proc_1thread_per_s"], 3, lambda v: v >= 0.8,
         f"c={bm['concurrency']}"),
        ("p50 latency, small MLP, c=1, 2 workers (ms)", "≤ 0.5",
         srv["mlp/w2/c1"]["p50_ms"], 3, lambda v: v <= 0.5, ""),
        ("cold start to first answer, small MLP (ms)", "≤ 500",
         cold["mlp"]["first_answer_ms_p50"], 0, lambda v: v is not None and v <= 500, ""),
        ("master RSS (MB)", "≤ 15", master_rss, 1, lambda v: v is not None and v <= 15, ""),
        ("--max-requests 1: turnover median (ms)", "≤ 25", r1["turnover_ms_p50"], 1,
         lambda v: v is not None and v <= 25, f"{r1['retirements']} retirements"),
        ("--max-requests 1: throughput, small MLP (req/s)", "≥ 100", r1_rps, 0,
         lambda v: v >= 100, ""),
        ("--max-requests 1: failed requests (wrk errors; and the server must still answer "
         "after each run)", "0", r1_failed, 0,
         lambda v: v == 0 and r1["answered_after_run"].split("/")[0]
         == r1["answered_after_run"].split("/")[1],
         f"server still answering after {r1['answered_after_run']} runs"),
    ]
    return [{"target": t, "goal": g, "measured": v, "met": bool(ok(v)) if v is not None else False,
             "note": note, "digits": nd} for t, g, v, nd, ok, note in rows]


def markdown(res):
    L = []
    m = res["machine"]
    L.append(f"# Benchmark results ({'quick' if res['quick'] else 'full'} run)\n")
    L.append(f"Machine: {m['nproc']} cores ({m['cpu']}), {m['mem_gib']} GiB, kernel {m['kernel']}; "
             f"load generator {m['wrk']} (`-t 1`), **sharing the same cores as the server**. "
             f"Medians of {res['config']['reps']} repetitions of {res['config']['load_s']} s each. "
             f"Command: `{res['command']}`.\n")
    L.append("## Targets\n")
    L.append("| target | goal | measured | met |")
    L.append("|---|---|---|---|")
    for t in res["targets"]:
        note = f" ({t['note']})" if t["note"] else ""
        L.append(f"| {t['target']} | {t['goal']} | {fmt(t['measured'], t['digits'])}{note} | "
                 f"{'yes' if t['met'] else '**no**'} |")
    L.append("\n## Limit: the model's own forward passes (forward-loop)\n")
    L.append("Measured before and after the served runs; medians over both.\n")
    L.append("| model | pass p50 (ms, 1 thread) | 2 processes × 1 thread (passes/s) | "
             "1 process × 2 threads (passes/s) |")
    L.append("|---|---|---|---|")
    for model, v in res["limit"].items():
        L.append(f"| {model} | {fmt(v['pass_p50_ms_1thread'], 3)} | "
                 f"{fmt(v['2proc_1thread_per_s'], 0)} | {fmt(v['1proc_2threads_per_s'], 0)} |")
    L.append("\n## Served through `app --production`\n")
    L.append("served ÷ limit uses the 2×1 limit for 2 workers and the 1×2 limit for 1 worker.\n")
    L.append("| model | workers | concurrency | req/s | served ÷ limit | p50 (ms) | p99 (ms) | failed |")
    L.append("|---|---|---|---|---|---|---|---|")
    for k, s in res["serving"].items():
        lim = res["limit"][s["model"]]["2proc_1thread_per_s" if s["workers"] == 2
                                       else "1proc_2threads_per_s"]
        L.append(f"| {s['model']} | {s['workers']} | {s['concurrency']} | {fmt(s['rps'], 0)} | "
                 f"{fmt(s['rps'] / lim, 3)} | {fmt(s['p50_ms'], 3)} | {fmt(s['p99_ms'], 3)} | "
                 f"{s['failed']} |")
    L.append("\n## Recycling (small MLP, 2 workers)\n")
    L.append("Turnover = master log's `retiring` line → the replacement's `ready` line "
             "(same slot); split at the replacement's `started` line.\n")
    L.append("A fresh server for each run; *answers after* = runs after which one more POST "
             "still got 200 within 3 s; *died while booting* = master log lines wrongly "
             "calling a retired worker a boot failure (each adds a 100 ms+ back-off).\n")
    L.append("| --max-requests | concurrency | req/s (runs) | p50 (ms) | p99 (ms) | failed (non-2xx / socket) | "
             "retirements | turnover p50 (ms) | retiring→started p50 | started→ready p50 | "
             "died while booting | answers after |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k, v in res["recycling"].items():
        for c, s in v["by_concurrency"].items():
            e = s["errors"]
            sock = (f"{s['socket_errors']}: read {e['read']}, connect {e['connect']}, "
                    f"write {e['write']}, timeout {e['timeout']}" if s["socket_errors"] else "0")
            L.append(f"| {k} | {c} | {fmt(s['rps'], 0)} ({', '.join(fmt(x, 0) for x in s['rps_all'])}) | {fmt(s['p50_ms'], 3)} | "
                     f"{fmt(s['p99_ms'], 3)} | {s['failed']} ({s['non2xx']} / {sock}) | "
                     f"{v['retirements']} | {fmt(v['turnover_ms_p50'])} | "
                     f"{fmt(v['retiring_to_started_ms_p50'])} | {fmt(v['started_to_ready_ms_p50'])} | "
                     f"{v['died_while_booting_lines']} | {v['answered_after_run']} |")
    b = res["boot"]
    L.append("\n## Worker boot\n")
    L.append("| what | ms (median) |")
    L.append("|---|---|")
    L.append(f"| process start (exec of `app --version`, no libtorch) | {fmt(b['process_start_ms'])} |")
    L.append(f"| exec of `app-worker` without config (loads libtorch, exits at once) | "
             f"{fmt(b['exec_with_libtorch_ms'])} |")
    e = b["exec_mlp"]
    L.append(f"| libtorch load ≈ exec'd worker's process_ms − process start | "
             f"{fmt(e['worker_process_ms'] - b['process_start_ms'])} |")
    for model in MODELS:
        e = b[f"exec_{model}"]
        L.append(f"| exec'd worker, {model}: spawn → ready | {fmt(e['spawn_to_ready_ms'])} |")
        L.append(f"| exec'd worker, {model}: worker's process_ms (exec → main, 10 ms ticks) | "
                 f"{fmt(e['worker_process_ms'])} |")
        L.append(f"| exec'd worker, {model}: model load (model_ms) | {fmt(e['worker_model_ms'])} |")
    r1 = res["recycling"]["1"]
    L.append(f"| forked worker (template), mlp: master's spawn → ready | "
             f"{fmt(r1['forked_ready_in_ms_p50'])} |")
    L.append("\n## Cold start (`app --production --workers 2` → first 200)\n")
    L.append("| model | first answer p50 (ms) | template ready p50 (ms) | runs (ms) |")
    L.append("|---|---|---|---|")
    for model, v in res["cold_start"].items():
        runs = ", ".join(fmt(x, 0) for x in v["runs_ms"])
        L.append(f"| {model} | {fmt(v['first_answer_ms_p50'], 0)} | "
                 f"{fmt(v['template_ready_ms_p50'], 0)} | {runs} |")
    L.append("\n## Memory (2 workers, after the load runs)\n")
    L.append("| model | process | RSS (MB) | PSS (MB) |")
    L.append("|---|---|---|---|")
    for model, procs in res["memory"].items():
        for p in procs:
            L.append(f"| {model} | {p['role']} | {fmt(p['rss_mb'])} | {fmt(p['pss_mb'])} |")
    if "metrics" in res:
        L.append(metrics_markdown(res["metrics"]))
    if "v2" in res:
        L.append(v2_markdown(res["v2"]))
    if "warm" in res:
        L.append(warm_markdown(res["warm"]))
    if "first" in res:
        L.append(first_markdown(res["first"]))
    if "batching" in res:
        L.append(batching_markdown(res["batching"]))
    L.append("\n![throughput and latency](results.svg)\n")
    return "\n".join(L) + "\n"


def metrics_markdown(mt):
    L = []
    L.append("\n## Metrics (`--metrics-port`) on vs off (small MLP, 2 workers, concurrency 8)\n")
    L.append(f"The two servers' runs interleaved, {mt['throughput']['on']['reps']} each.\n")
    L.append("| metrics | req/s (runs) | p50 (ms) | p99 (ms) | failed |")
    L.append("|---|---|---|---|---|")
    for k in ("off", "on"):
        t = mt["throughput"][k]
        L.append(f"| {k} | {fmt(t['rps'], 0)} ({', '.join(fmt(x, 0) for x in t['rps_all'])}) | "
                 f"{fmt(t['p50_ms'], 3)} | {fmt(t['p99_ms'], 3)} | {t['failed']} |")
    on, off = mt["throughput"]["on"]["rps"], mt["throughput"]["off"]["rps"]
    L.append(f"\non ÷ off: {fmt(on / off, 3)}\n")
    L.append("| workers | scrape p50 (ms) | slowest (ms) | body (bytes) | scrapes |")
    L.append("|---|---|---|---|---|")
    for w, v in mt["scrape"].items():
        L.append(f"| {w} | {fmt(v['p50_ms'], 2)} | {fmt(v['max_ms'], 2)} | {v['bytes']} | {v['n']} |")
    return "\n".join(L) + "\n"


def svg(res):
    """Top: throughput vs concurrency per model (limit dashed). Bottom: latency distribution
    (percentile vs latency, log scale) for 2 workers at each concurrency."""
    W, H = 960, 700
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    colors = {1: "#1f77b4", 2: "#d62728", 4: "#2ca02c", 8: "#9467bd"}
    import math

    def tick(v):
        if v >= 10000:
            return f"{v / 1000:.0f}k"
        if v >= 1000:
            return f"{v / 1000:.1f}k"
        return f"{v:.0f}" if v >= 10 else f"{v:.2g}"

    def panel(x0, y0, w, h, title, xlabels, ymax, series, hlines, ylabel, xlog=False,
              xrange_=None):
        out.append(f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle" '
                   f'font-weight="bold">{title}</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
        for i in range(6):
            yv = ymax * i / 5
            y = y0 + h - h * i / 5
            out.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{y}" y2="{y}" stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 5}" y="{y + 4}" text-anchor="end">{tick(yv)}</text>')
        out.append(f'<text x="{x0 - 55}" y="{y0 + h / 2}" transform="rotate(-90 {x0 - 55} '
                   f'{y0 + h / 2})" text-anchor="middle">{ylabel}</text>')
        return x0, y0, w, h

    # Throughput panels.
    pw, ph = 380, 230
    for i, model in enumerate(MODELS):
        x0, y0 = 90 + i * 470, 50
        lim2 = res["limit"][model]["2proc_1thread_per_s"]
        lim1 = res["limit"][model]["1proc_2threads_per_s"]
        vals = [res["serving"][f"{model}/w{w}/c{c}"]["rps"] for w in (1, 2) for c in CONCURRENCY]
        ymax = max(vals + [lim1, lim2]) * 1.1
        panel(x0, y0, pw, ph, f"{model}: requests/s vs concurrency", CONCURRENCY, ymax, None,
              None, "requests/s")
        xs = {c: x0 + pw * (j + 0.5) / len(CONCURRENCY) for j, c in enumerate(CONCURRENCY)}
        for c, x in xs.items():
            out.append(f'<text x="{x}" y="{y0 + ph + 16}" text-anchor="middle">{c}</text>')
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph + 32}" text-anchor="middle">'
                   f'concurrent connections (wrk -c)</text>')

        def yy(v):
            return y0 + ph - ph * v / ymax

        for w, col, lim in ((1, "#ff7f0e", lim1), (2, "#1f77b4", lim2)):
            pts = " ".join(f"{xs[c]:.1f},{yy(res['serving'][f'{model}/w{w}/c{c}']['rps']):.1f}"
                           for c in CONCURRENCY)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="2"/>')
            for c in CONCURRENCY:
                out.append(f'<circle cx="{xs[c]:.1f}" '
                           f'cy="{yy(res["serving"][f"{model}/w{w}/c{c}"]["rps"]):.1f}" r="3" '
                           f'fill="{col}"/>')
            out.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{yy(lim):.1f}" y2="{yy(lim):.1f}" '
                       f'stroke="{col}" stroke-dasharray="6 4"/>')
        lx, ly = x0 + 10, y0 + 15
        for k, (col, label) in enumerate((("#1f77b4", "2 workers (dashed: limit 2 proc × 1 thread)"),
                                          ("#ff7f0e", "1 worker (dashed: limit 1 proc × 2 threads)"))):
            out.append(f'<line x1="{lx}" x2="{lx + 20}" y1="{ly + 16 * k}" y2="{ly + 16 * k}" '
                       f'stroke="{col}" stroke-width="2"/>')
            out.append(f'<text x="{lx + 25}" y="{ly + 16 * k + 4}">{label}</text>')

    # Latency distributions.
    for i, model in enumerate(MODELS):
        x0, y0 = 90 + i * 470, 390
        ph2 = 240
        lats = [v for c in CONCURRENCY for v in res["serving"][f"{model}/w2/c{c}"]["pct_ms"].values()
                if v > 0]
        lo = 10 ** math.floor(math.log10(min(lats)))
        hi = 10 ** math.ceil(math.log10(max(lats)))
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 - 10}" text-anchor="middle" '
                   f'font-weight="bold">{model}, 2 workers: latency distribution</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph2}" fill="none" stroke="#444"/>')

        def xx(v):
            return x0 + pw * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

        def yy2(p):
            return y0 + ph2 - ph2 * p / 100

        d = lo
        while d <= hi * 1.0001:
            out.append(f'<line x1="{xx(d):.1f}" x2="{xx(d):.1f}" y1="{y0}" y2="{y0 + ph2}" '
                       f'stroke="#ddd"/>')
            out.append(f'<text x="{xx(d):.1f}" y="{y0 + ph2 + 16}" text-anchor="middle">{d:g}</text>')
            d *= 10
        for p in (0, 25, 50, 75, 90, 99, 100):
            if p in (90, 99):
                continue
            out.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{yy2(p)}" y2="{yy2(p)}" stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 5}" y="{yy2(p) + 4}" text-anchor="end">{p}</text>')
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph2 + 32}" text-anchor="middle">'
                   f'latency (ms, log scale)</text>')
        out.append(f'<text x="{x0 - 40}" y="{y0 + ph2 / 2}" transform="rotate(-90 {x0 - 40} '
                   f'{y0 + ph2 / 2})" text-anchor="middle">percentile</text>')
        for k, c in enumerate(CONCURRENCY):
            pct = res["serving"][f"{model}/w2/c{c}"]["pct_ms"]
            pts = " ".join(f"{xx(max(v, lo)):.1f},{yy2(float(p)):.1f}" for p, v in pct.items())
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colors[c]}" '
                       f'stroke-width="2"/>')
            out.append(f'<line x1="{x0 + 10}" x2="{x0 + 30}" y1="{y0 + 15 + 16 * k}" '
                       f'y2="{y0 + 15 + 16 * k}" stroke="{colors[c]}" stroke-width="2"/>')
            out.append(f'<text x="{x0 + 35}" y="{y0 + 19 + 16 * k}">c={c}</text>')
    out.append(f'<text x="10" y="{H - 8}" fill="#666">{res["machine"]["nproc"]} cores '
               f'({res["machine"]["cpu"]}); wrk shares the cores with the server; medians of '
               f'{res["config"]["reps"]} × {res["config"]["load_s"]} s</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench"))
    ap.add_argument("--command", default="scripts/bench")
    ap.add_argument("--only", choices=["metrics", "v2", "warm", "batching", "real", "first", "access", "tls",
                                       "shapes"],
                    help="run one measurement alone and write bench/<name>.json and .md")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite results.md and results.svg from results.json")
    a = ap.parse_args()
    if a.render:
        with open(os.path.join(a.out, "results.json")) as f:
            res = json.load(f)
        res["machine"]["wrk"] = res["machine"]["wrk"].split(" Copyright")[0]
        res["targets"] = targets(res)
        with open(os.path.join(a.out, "results.md"), "w") as f:
            f.write(markdown(res))
        with open(os.path.join(a.out, "results.svg"), "w") as f:
            f.write(svg(res))
        return 0
    if a.quick:
        cfg = {"reps": 1, "load_s": 2, "limit_s": 2, "boot_n": 3, "cold_n": 3,
               "recycle_c": [2], "scrapes": 10, "batch_reps": 1, "batch_load_s": 2,
               "first_starts": 3, "first_steady": 10}
    else:
        cfg = {"reps": 3, "load_s": 4, "limit_s": 3, "boot_n": 5, "cold_n": 5,
               "recycle_c": [2, 8], "scrapes": 50, "batch_reps": 3, "batch_load_s": 3,
               "first_starts": 7, "first_steady": 20}
    os.makedirs(TMP, exist_ok=True)
    t0 = time.monotonic()
    res = {"quick": a.quick, "config": cfg, "command": a.command, "machine": machine(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if a.only:
        measure, render, title = {
            "metrics": (measure_metrics, metrics_markdown, "Metrics cost"),
            "v2": (measure_v2, v2_markdown, "v2 encodings"),
            "warm": (measure_warm, warm_markdown, "Template warm-up"),
            "batching": (measure_batching, batching_markdown, "Dynamic batching"),
            "real": (measure_real, real_markdown, "Real architectures"),
            "access": (measure_access, access_markdown, "Access log cost"),
            "tls": (measure_tls, tls_markdown, "TLS cost"),
            "first": (measure_first, first_markdown, "Warm exec'd workers"),
            "shapes": (measure_shapes, shapes_markdown, "Model shapes"),
        }[a.only]
        res[a.only] = measure(cfg)
        res["elapsed_s"] = time.monotonic() - t0
        with open(os.path.join(a.out, f"{a.only}.json"), "w") as f:
            json.dump(res, f, indent=1)
        m = res["machine"]
        with open(os.path.join(a.out, f"{a.only}.md"), "w") as f:
            f.write(f"# {title} ({'quick' if a.quick else 'full'} run)\n\n"
                    f"Machine: {m['nproc']} cores ({m['cpu']}), {m['mem_gib']} GiB; load generator "
                    f"{m['wrk']} (`-t 1`) on the same cores. Command: `{a.command}`.\n"
                    + render(res[a.only]))
        log(f"done in {res['elapsed_s']:.0f} s: {a.out}/{a.only}.json, {a.only}.md")
        return 0
    res["limit"] = measure_limits(cfg)
    res["boot"] = measure_boot(cfg)
    res["cold_start"] = measure_cold(cfg)
    res["serving"], res["memory"] = measure_serving(cfg)
    res["recycling"] = measure_recycling(cfg)
    res["metrics"] = measure_metrics(cfg)
    res["v2"] = measure_v2(cfg)
    res["warm"] = measure_warm(cfg)
    res["first"] = measure_first(cfg)
    res["batching"] = measure_batching(cfg)
    res["real"] = measure_real(cfg)
    res["shapes"] = measure_shapes(cfg)
    res["limit"] = measure_limits(cfg, res["limit"])
    res["targets"] = targets(res)
    res["elapsed_s"] = time.monotonic() - t0
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(markdown(res))
    with open(os.path.join(a.out, "results.svg"), "w") as f:
        f.write(svg(res))
    log(f"done in {res['elapsed_s']:.0f} s: {a.out}/results.json, results.md, results.svg")
    for t in res["targets"]:
        log(f"{'MET    ' if t['met'] else 'NOT MET'} {t['target']}: {fmt(t['measured'], t['digits'])} "
            f"(goal {t['goal']})")


if __name__ == "__main__":
    sys.exit(main())
