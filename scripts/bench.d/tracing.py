#!/usr/bin/env python3
"""scripts/bench --only tracing: what exporting spans costs (issue 58).

Three servers of the same model, 2 workers each, their wrk runs at c=16 interleaved (the order
alternating from round to round): tracing off (no OTEL_* variable); on, every request sampled
(OTEL_TRACES_SAMPLER=always_on) and exported to a collector on loopback that decodes every
export and counts its spans (otlp_sink.py: its CPU time over the traced runs is reported,
since it shares the server's cores); and on, to a collector nobody listens on (every export
refused, the spans dropped and counted). For the small MLP (POST / JSON) and the
CIFAR-style CNN (POST / JSON, bench/tmp/real). Writes bench/tracing.{json,md}: req/s, p50,
p99 and each traced server's ratio to the untraced one.

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
from common import OUT, ROOT, cpu_seconds, free_port, get, log  # noqa: E402

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

                def one(k):
                    before = cpu_seconds(rx.pid) if k == "on" else None
                    r = R.wrk(srvs[k].port, body, 16, secs)
                    if before is not None:
                        sink["cpu_s"] += cpu_seconds(rx.pid) - before
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
            log(f"tracing {model} c=16: off {got['off']['rps']:.0f}, on {got['on']['rps']:.0f} "
                f"({row['on_ratio']:.3f}), unreachable {got['unreachable']['rps']:.0f} "
                f"({row['unreachable_ratio']:.3f}) req/s; the collector took "
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
          "a port nobody listens on (all dropped and counted).\n",
          "| model | off (req/s) | on (req/s, ratio) | unreachable (req/s, ratio) | p99 ms off / on / unreachable | collector CPU |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['off']['rps']:.0f} | {r['on']['rps']:.0f}, **{r['on_ratio']:.3f}** | "
                  f"{r['unreachable']['rps']:.0f}, **{r['unreachable_ratio']:.3f}** | "
                  f"{r['off']['p99_ms']:.1f} / {r['on']['p99_ms']:.1f} / {r['unreachable']['p99_ms']:.1f} | "
                  f"{r['collector_cpu_share']:.2f} |")
    with open(os.path.join(OUT, "tracing.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
