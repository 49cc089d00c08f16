#!/usr/bin/env python3
"""scripts/bench --only torchserve: the same TorchServe archive (`image_classifier`, a small
CNN with random weights, made by tests/support/make_torchserve.py) served by TorchServe 0.12
(Java 17; 2 workers, its batching off, then on: batchSize 8, maxBatchDelay 5 ms) and by
vramfork (2 workers, 1 torch thread each; batching off, then --max-batch-size 8
--batch-timeout-ms 5), on the same cores. Each takes the same PNG as the body of
POST /predictions/small from C clients on keep-alive connections (a Python load generator
sharing the cores, the same for both): req/s, p50 and p99 at C = 1, 4, 16; cold start (the
start command to the first 200 answer); memory (the PSS of the server's processes).
TorchServe's Python workers get OMP_NUM_THREADS=1, as vramfork's --torch-threads 1.
To bench/torchserve.{json,md}.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, App, free_port, log  # noqa: E402

PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)
TMP = os.path.join(ROOT, "bench/tmp/torchserve")
SECONDS = float(os.environ.get("VRAMFORK_BENCH_TS_SECONDS", "6"))
CONCURRENCY = [1, 4, 16]


def make():
    if not os.path.isfile(os.path.join(TMP, "art/expected.json")):
        os.makedirs(os.path.join(TMP, "art"), exist_ok=True)
        subprocess.run([PY, os.path.join(ROOT, "tests/support/make_torchserve.py"),
                        os.path.join(TMP, "art"), os.path.join(ROOT, "README.md")],
                       check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(TMP, "art/wide.png"), "rb") as f:
        return f.read()


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/predictions/small", body, {"Content-Type": "application/octet-stream"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def load(port, body, clients):
    """C clients on keep-alive connections for SECONDS: (req/s, p50 ms, p99 ms, failures)."""
    lat, failures, stop = [], [0], time.monotonic() + SECONDS
    lock = threading.Lock()

    def client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        while time.monotonic() < stop:
            t = time.monotonic()
            c.request("POST", "/predictions/small", body,
                      {"Content-Type": "application/octet-stream"})
            r = c.getresponse()
            r.read()
            if r.status == 200:
                mine.append(time.monotonic() - t)
            else:
                with lock:
                    failures[0] += 1
        c.close()
        with lock:
            lat.extend(mine)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else None  # noqa
    return {"rps": len(lat) / took, "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "failures": failures[0]}


def pss_mb(pid):
    """PSS of `pid` and its descendants, MB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
            # Any thread's children (Java starts its Python workers from other threads).
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return total / 1024


def measure(name, srv, port, body):
    try:
        srv.wait(lambda: post(port, body) == 200, 300)
        cold = time.monotonic() - srv.t0
        rows = {c: load(port, body, c) for c in CONCURRENCY}
        mem = pss_mb(srv.pid)
    finally:
        srv.stop()
    log(f"{name}: cold {cold:.1f} s, {mem:.0f} MB, " + ", ".join(
        f"c={c} {r['rps']:.0f} req/s" for c, r in rows.items()), "torchserve")
    return {"cold_start_s": cold, "pss_mb": mem, "load": rows}


def torchserve(batching, body):
    store = os.path.join(TMP, "store")
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(os.path.join(store, "model-store"))
    shutil.copy(os.path.join(TMP, "art/classifier.mar"), os.path.join(store, "model-store/small.mar"))
    port, mport, metrics = free_port(), free_port(), free_port()
    batch = (8, 5) if batching else (1, 100)
    models = {"small": {"1.0": {"defaultVersion": True, "marName": "small.mar", "minWorkers": 2,
                                "maxWorkers": 2, "batchSize": batch[0],
                                "maxBatchDelay": batch[1], "responseTimeout": 120}}}
    props = os.path.join(store, "config.properties")
    with open(props, "w") as f:
        f.write(f"inference_address=http://127.0.0.1:{port}\n"
                f"management_address=http://127.0.0.1:{mport}\n"
                f"metrics_address=http://127.0.0.1:{metrics}\n"
                "disable_token_authorization=true\ninstall_py_dep_per_model=false\n"
                "load_models=small.mar\n"
                f"models={json.dumps(models)}\n")
    ts = os.path.join(os.path.dirname(PY), "torchserve")
    env = dict(os.environ, OMP_NUM_THREADS="1", LOG_LOCATION=os.path.join(store, "logs"),
               METRICS_LOCATION=os.path.join(store, "logs"),
               PATH=os.path.dirname(PY) + ":" + os.environ.get("PATH", ""))
    srv = App.__new__(App)
    srv._start([ts, "--start", "--foreground", "--ncs", "--disable-token-auth",
                "--model-store", os.path.join(store, "model-store"), "--ts-config", props],
               os.path.join(TMP, f"torchserve-{batching}.log"), env)
    return measure(f"TorchServe, batching {'on' if batching else 'off'}", srv, port, body)


def vramfork(batching, body, bin_dir):
    meta = os.path.join(TMP, "app-metadata.json")
    with open(meta, "w") as f:
        json.dump({"name": "small", "model": "art/classifier.mar"}, f)
    port = free_port()
    args = ["--metadata", meta, "--port", str(port), "--workers", "2", "--torch-threads", "1"]
    if batching:
        args += ["--max-batch-size", "8", "--batch-timeout-ms", "5"]
    srv = App(args, os.path.join(TMP, f"vramfork-{batching}.log"), binary_dir=bin_dir)
    return measure(f"vramfork, batching {'on' if batching else 'off'}", srv, port, body)


def main():
    body = make()
    bin_dir = os.environ.get("VRAMFORK_BENCH_BIN")
    out = {"seconds_per_point": SECONDS, "cores": os.cpu_count(), "runs": {}}
    for batching in (False, True):
        out["runs"][f"vramfork, batching {'on' if batching else 'off'}"] = vramfork(
            batching, body, bin_dir)
        out["runs"][f"TorchServe, batching {'on' if batching else 'off'}"] = torchserve(
            batching, body)
    os.makedirs(os.path.join(ROOT, "bench"), exist_ok=True)
    with open(os.path.join(ROOT, "bench/torchserve.json"), "w") as f:
        json.dump(out, f, indent=1)
    lines = ["| server | c | req/s | p50 ms | p99 ms | failures |", "|---|---|---|---|---|---|"]
    for name, r in out["runs"].items():
        for c, row in r["load"].items():
            lines.append(f"| {name} | {c} | {row['rps']:.0f} | {row['p50_ms']:.1f} | "
                         f"{row['p99_ms']:.1f} | {row['failures']} |")
    lines += ["", "| server | cold start s | PSS MB |", "|---|---|---|"]
    for name, r in out["runs"].items():
        lines.append(f"| {name} | {r['cold_start_s']:.1f} | {r['pss_mb']:.0f} |")
    with open(os.path.join(ROOT, "bench/torchserve.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
