#!/usr/bin/env python3
"""Queue length against latency, to choose an autoscaling threshold (docs/deployment.md,
"Choosing the threshold"): one `app --production` pod's worth of workers serving the
CIFAR-style CNN (scripts/bench.d/make_real.py), driven by C closed-loop clients (each sends
its next request when the last is answered, on a fresh connection) for C in LEVELS, while a
sampler scrapes /metrics every 100 ms. Per level: throughput, latency percentiles, the mean
and highest `vramfork_requests_waiting` (listen + model) the scrapes saw, and the mean wait
and pass from the histograms. Writes OUT.json and OUT.md.

usage: queue_latency.py [--app target/release/app] [--dir bench/tmp/real] [--model cnn]
                        [--workers 2] [--levels 1,2,3,4,6,8,12,16] [--seconds 20]
                        [--out bench/queue] [--command "scripts/bench --only queue"]
For another model: --dir holds MODEL.json (its app metadata) and MODEL.body (a POST / body)."""
import argparse
import http.client
import json
import os
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BIN, OUT, App, free_port  # noqa: E402

CNN = "the CIFAR-style CNN (scripts/bench.d/make_real.py; 1×3×32×32)"


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, body


def scrape(port):
    """(requests waiting, {histogram: (count, sum)}) from one scrape."""
    _, text = get(port, "/metrics")
    waiting = sum(float(v) for v in re.findall(r'^vramfork_requests_waiting\{[^}]*\} (\S+)$', text, re.M))
    hist = {}
    for name in ("queue_wait", "forward_duration", "request_duration"):
        count = sum(float(v) for v in re.findall(rf"^vramfork_{name}_seconds_count(?:\{{[^}}]*\}})? (\S+)$", text, re.M))
        total = sum(float(v) for v in re.findall(rf"^vramfork_{name}_seconds_sum(?:\{{[^}}]*\}})? (\S+)$", text, re.M))
        hist[name] = (count, total)
    return waiting, hist


def client(port, body, stop, record):
    while not stop.is_set():
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        c.close()
        t1 = time.perf_counter()
        if not stop.is_set():
            record.append((r.status, t1 - t0))


def level(port, mport, body, clients, seconds):
    stop, record, samples = threading.Event(), [], []
    threads = [threading.Thread(target=client, args=(port, body, stop, record)) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2)  # the queue settles before anything is counted
    record.clear()
    _, h0 = scrape(mport)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(scrape(mport)[0])
        time.sleep(0.1)
    _, h1 = scrape(mport)
    answered = [d for s, d in record if s == 200]
    failed = len(record) - len(answered)
    stop.set()
    for t in threads:
        t.join()
    lat = sorted(answered)

    def pct(p):
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3

    def mean_of(name):
        dc, ds = h1[name][0] - h0[name][0], h1[name][1] - h0[name][1]
        return ds / dc * 1e3 if dc else None

    return {
        "clients": clients, "answered": len(answered), "failed": failed,
        "req_s": len(answered) / seconds,
        "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
        "waiting_mean": statistics.fmean(samples), "waiting_max": max(samples),
        "queue_wait_mean_ms": mean_of("queue_wait"), "pass_mean_ms": mean_of("forward_duration"),
    }


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--bin", default=BIN, help="where app is")
    a.add_argument("--dir", default="bench/tmp/real")
    a.add_argument("--model", default="cnn")
    a.add_argument("--workers", type=int, default=2)
    a.add_argument("--levels", default="1,2,3,4,6,8,12,16")
    a.add_argument("--seconds", type=float, default=20)
    a.add_argument("--out", default="bench/queue")
    a.add_argument("--command", default="scripts/bench --only queue")
    o = a.parse_args()
    port, mport = free_port(), free_port()
    env = dict(os.environ, VRAMFORK_LOG_FORMAT="json")
    server = App(["--metadata", os.path.join(o.dir, o.model + ".json"), "--port", str(port),
                  "--metrics-port", str(mport), "--workers", str(o.workers), "--torch-threads", "1",
                  "--max-queue-wait", "0"], os.path.join(OUT, "tmp", "queue.log"), env=env,
                 binary_dir=o.bin)
    try:
        server.wait(lambda: get(mport, "/health/ready")[0] == 200)
        with open(os.path.join(o.dir, o.model + ".body"), "rb") as f:
            body = f.read()
        rows = []
        for c in (int(x) for x in o.levels.split(",")):
            rows.append(level(port, mport, body, c, o.seconds))
            r = rows[-1]
            print(f"c={c}: {r['req_s']:.1f} req/s, p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, "
                  f"waiting {r['waiting_mean']:.2f} (max {r['waiting_max']:.0f})", file=sys.stderr)
    finally:
        server.stop()
    cpus = os.cpu_count()
    label = CNN if o.model == "cnn" else f"`{o.model}`"
    result = {"command": o.command, "workers": o.workers, "cpus": cpus, "seconds": o.seconds,
              "model": label + ", POST / JSON",
              "rows": rows}
    with open(o.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = [
        f"# Queue length against latency: {o.model}, {o.workers} workers",
        "",
        f"`{o.command}` — {o.workers} workers (`--torch-threads 1`, `--max-queue-wait 0`) serving",
        f"{label} on this machine's {cpus} CPUs, shared with the load generator (Python",
        f"closed-loop clients, a fresh connection per request) and with other work; {o.seconds:.0f} s",
        "per level after 2 s to settle; `waiting` is `vramfork_requests_waiting` (listen + model)",
        "sampled every 100 ms; wait and pass are the histograms' means over the level.",
        "",
        "| clients | req/s | p50 ms | p95 ms | p99 ms | waiting (mean) | waiting (max) | wait ms (mean) | pass ms (mean) | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['req_s']:.1f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} "
            f"| {r['waiting_mean']:.2f} | {r['waiting_max']:.0f} | {r['queue_wait_mean_ms'] or 0:.1f} "
            f"| {r['pass_mean_ms'] or 0:.1f} | {r['failed']} |")
    with open(o.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
