#!/usr/bin/env python3
"""scripts/bench --only tracing: what exporting spans costs.

Four servers of the same model, 2 workers each, their wrk runs at c=16 interleaved (the order
alternating from round to round): tracing off (no OTEL_* variable); on, every request sampled
(OTEL_TRACES_SAMPLER=always_on) and exported to a collector on loopback that decodes every
export and counts its spans (otlp_sink.py: its CPU time over the traced runs is reported,
since it shares the server's cores); on, to a collector nobody listens on (every export
refused, the spans dropped and counted); and on, a tenth of the requests sampled
(traceidratio 0.1) and exported to the same collector. For the small MLP (POST / JSON) and the
CIFAR-style CNN (POST / JSON, bench/tmp/real). Writes bench/tracing.{json,md}: req/s, p50,
p99 and each traced server's ratio to the untraced one, and the CPU each answered request
cost the workers, their span exporter threads and the collector (from /proc).

Usage: tracing.py --command CMD [--quick]
"""
import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as R  # noqa: E402
from common import OUT, ROOT, cpu_seconds, free_port, get, log, threads_cpu_seconds  # noqa: E402

PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)


def receiver():
    """The collector on loopback (otlp_sink.py): (process, port)."""
    p = subprocess.Popen([PY, os.path.join(HERE, "otlp_sink.py")], stdout=subprocess.PIPE,
                         text=True)
    return p, json.loads(p.stdout.readline())["listening"]


def received(port):
    return json.loads(get(port, "/count")[1])


def server(model, tag, otel):
    """`R.Server` of `model` with the OTEL_* variables `otel` (none: tracing off)."""
    saved = {k: os.environ.get(k) for k in otel}
    os.environ.update(otel)
    try:
        if model == "mlp":
            srv = R.Server("mlp", 2, tag=tag)
            srv.wait_ready()
        else:
            srv = R.real_server(model, tag)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return srv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    reps, secs = (2, 2) if a.quick else (5, 4)
    rx, rx_port = receiver()
    dead = free_port()  # nobody listens there
    variants = {
        "off": {},
        "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rx_port}",
               "OTEL_TRACES_SAMPLER": "always_on"},
        "unreachable": {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{dead}",
                        "OTEL_TRACES_SAMPLER": "always_on"},
        "tenth": {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rx_port}",
                  "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    }
    rows = []
    try:
        for model in ("mlp", "cnn"):
            if model == "mlp":
                body = R.MODELS["mlp"]["body"]
            else:
                _, body, _ = R.real_request("cnn")
            srvs = {k: server(model, f"tracing-{model}-{k}", v) for k, v in variants.items()}
            try:
                for s in srvs.values():
                    R.wrk(s.port, body, 2, 1)  # warm-up
                sink = {"cpu_s": 0.0, "seconds": 0.0}
                # CPU µs per answered request: the workers' (all their threads), their span
                # exporter threads' alone, and the collector's; per variant, every round.
                per_req = {k: {"workers": [], "exporter": [], "collector": []} for k in srvs}
                workers = {k: [p for p, c in s.pids().items() if c.startswith("vf-worker")]
                           for k, s in srvs.items()}

                def one(k):
                    pids = workers[k]
                    before = (sum(cpu_seconds(p) for p in pids),
                              threads_cpu_seconds(pids, "vf-span-export"), cpu_seconds(rx.pid))
                    r = R.wrk(srvs[k].port, body, 16, secs)
                    after = (sum(cpu_seconds(p) for p in pids),
                             threads_cpu_seconds(pids, "vf-span-export"), cpu_seconds(rx.pid))
                    n = max(r["requests"], 1)
                    for key, b, a in zip(("workers", "exporter", "collector"), before, after):
                        per_req[k][key].append((a - b) / n * 1e6)
                    if k == "on":
                        sink["cpu_s"] += after[2] - before[2]
                        sink["seconds"] += secs
                    return r

                spans_before = received(rx_port)["spans"]
                runs = R.interleaved(list(srvs), reps, one)
                spans = received(rx_port)["spans"] - spans_before
            finally:
                for s in srvs.values():
                    s.stop()
            got = {k: R.summarize(v) for k, v in runs.items()}
            row = {"model": model, "c": 16, **{k: {x: got[k][x] for x in ("rps", "p50_ms", "p99_ms",
                                                                         "failed", "rps_all")}
                                               for k in got}}
            row["on_ratio"] = got["on"]["rps"] / got["off"]["rps"]
            # The collector's share of the two cores while the traced server ran, and the spans
            # it took (over every round).
            row["collector_cpu_share"] = sink["cpu_s"] / sink["seconds"]
            row["spans_received"] = spans
            row["unreachable_ratio"] = got["unreachable"]["rps"] / got["off"]["rps"]
            row["tenth_ratio"] = got["tenth"]["rps"] / got["off"]["rps"]
            row["cpu_us_per_request"] = {k: {x: R.median(v) for x, v in d.items()}
                                         for k, d in per_req.items()}
            log(f"tracing {model} c=16: off {got['off']['rps']:.0f}, on {got['on']['rps']:.0f} "
                f"({row['on_ratio']:.3f}), unreachable {got['unreachable']['rps']:.0f} "
                f"({row['unreachable_ratio']:.3f}), a tenth sampled {got['tenth']['rps']:.0f} "
                f"({row['tenth_ratio']:.3f}) req/s; the collector took "
                f"{row['collector_cpu_share']:.2f} of a core for {spans} spans")
            rows.append(row)
    finally:
        rx.kill()
        rx.wait()
    res = {"command": a.command, "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "bin": os.path.relpath(R.BIN, ROOT), "reps": reps, "seconds": secs,
           "cpus": os.cpu_count(), "rows": rows}
    with open(os.path.join(OUT, "tracing.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# What exporting spans costs\n\n`{a.command}`, {res['when']}, binaries of `{res['bin']}`, "
          f"{res['cpus']} CPUs shared with wrk and the receiver; 2 workers, c=16, {reps} runs of "
          f"{secs} s per server, interleaved; medians. *on*: every request sampled and exported to "
          "a collector on loopback that decodes every export (its CPU, in cores, while the traced "
          "server ran: the last column; it shares the server's cores); *unreachable*: exported to "
          "a port nobody listens on (all dropped and counted); *a tenth*: to the same collector, a "
          "tenth of the requests sampled (`traceidratio` 0.1).\n",
          "| model | off (req/s) | on (req/s, ratio) | unreachable (req/s, ratio) | a tenth (req/s, ratio) | p99 ms off / on / unreachable | collector CPU |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['off']['rps']:.0f} | {r['on']['rps']:.0f}, **{r['on_ratio']:.3f}** | "
                  f"{r['unreachable']['rps']:.0f}, **{r['unreachable_ratio']:.3f}** | "
                  f"{r['tenth']['rps']:.0f}, **{r['tenth_ratio']:.3f}** | "
                  f"{r['off']['p99_ms']:.1f} / {r['on']['p99_ms']:.1f} / {r['unreachable']['p99_ms']:.1f} | "
                  f"{r['collector_cpu_share']:.2f} |")
    md += ["\nCPU per answered request, in µs (medians over the rounds): the workers' processes "
           "(every thread), their span exporter threads alone (part of the former), and the "
           "collector's. A request's cost on a saturated machine is what it takes from the rate.\n",
           "| model | workers off / on / unreachable | exporter threads on / unreachable | collector on |",
           "|---|---|---|---|"]
    for r in rows:
        c = r["cpu_us_per_request"]
        md.append(f"| {r['model']} | {c['off']['workers']:.1f} / {c['on']['workers']:.1f} / "
                  f"{c['unreachable']['workers']:.1f} | {c['on']['exporter']:.1f} / "
                  f"{c['unreachable']['exporter']:.1f} | {c['on']['collector']:.1f} |")
    with open(os.path.join(OUT, "tracing.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
