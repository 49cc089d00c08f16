#!/usr/bin/env python3
"""scripts/bench --only lending: three apps on one GPU where two fit, traffic alternating.

On one simulated A100 (the NVML stand-in of tests/nvml-mock with `--simulated-gpus`: the
workers run the small MLP fixture on the CPU), three apps declaring 16,000 MB each (the
GPU's 36,864 MB share holds two, with the reserve). Bursts of BURST sequential `POST /` go
to app 0, 1, 2, 0, 1, … (ROUNDS bursts); each burst's first request is the one that may find
its app without room. Two modes, each with fresh servers:

- **lending**: `--evictable-after IDLE` — an app without room asks the least valuable idle
  neighbour, and its request waits for the room;
- **timer**: `--idle-release IDLE --evictable-after off` — what there was before lending:
  idle apps give their room back on a timer, and a request at an app without room is
  answered 503 at once.

Reported per mode: requests answered 200 and 503, and the first request of a burst, connect
→ answer, p50 and p99 (over the 200s). Stdlib only.
Usage: lending.py --command CMD [--bin DIR] [--nvml LIB] [--rounds N]
Writes bench/lending.{json,md}.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BIN, OUT, ROOT  # noqa: E402
from ledger import BODY, GPUS, Server  # noqa: E402

TYP_MB = 16_000
IDLE_S = "2"
BURST = 5


def post(port):
    """One `POST /` on a new connection: its status and connect → answer in ms."""
    t = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    c.request("POST", "/", BODY, {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, (time.monotonic() - t) * 1e3


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def run(a, mode):
    flags = ["--workers", "1"] + (["--evictable-after", IDLE_S] if mode == "lending"
             else ["--idle-release", IDLE_S, "--evictable-after", "off"])
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "gpus.json"), "w") as f:
            json.dump(GPUS, f)
        servers = []
        try:
            for i in range(3):
                if i == 2 and mode == "timer":
                    # Before lending, the third app could start only once one had released.
                    servers[0].wait("idle_released")
                s = Server(a, work, TYP_MB, flags, f"app{i}")
                s.ready()
                servers.append(s)
            ok, refused, first = 0, 0, []
            for r in range(a.rounds):
                s = servers[r % 3]
                for k in range(BURST):
                    status, took = post(s.port)
                    if status == 200:
                        ok += 1
                        if k == 0:
                            first.append(took)
                    else:
                        refused += 1
                print(f"{mode}: burst {r} to app{r % 3}: first {first[-1] if first else 0:.0f} ms, "
                      f"{ok} ok, {refused} refused", file=sys.stderr)
        finally:
            for s in servers:
                s.stop()
    return {"ok": ok, "refused": refused, "first_p50_ms": pct(first, 50),
            "first_p99_ms": pct(first, 99), "bursts": a.rounds, "burst": BURST}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--bin", default=BIN)
    ap.add_argument("--nvml", default=os.path.join(ROOT, "target", "nvml-mock", "debug",
                                                   "libnvml_mock.so"))
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    if not os.path.exists(a.nvml):
        subprocess.run(["cargo", "build", "--quiet", "-p", "nvml-mock", "--target-dir",
                        os.path.join(ROOT, "target", "nvml-mock")], check=True, cwd=ROOT)
    result = {"when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": a.command, "bin": os.path.relpath(a.bin, ROOT),
              "lending": run(a, "lending"), "timer": run(a, "timer")}
    with open(os.path.join(OUT, "lending.json"), "w") as f:
        json.dump(result, f, indent=1)
    f_ms = lambda v: "–" if v is None else f"{v:.0f} ms"
    rows = "".join(
        f"| {m} | {r['ok']} | {r['refused']} | {f_ms(r['first_p50_ms'])} | {f_ms(r['first_p99_ms'])} |\n"
        for m, r in (("lending (`--evictable-after 2`)", result["lending"]),
                     ("timer only (`--idle-release 2`)", result["timer"])))
    with open(os.path.join(OUT, "lending.md"), "w") as f:
        f.write(f"# Lending: three apps on one GPU where two fit\n\n`{a.command}`, {result['when']}, "
                f"binaries of `{result['bin']}`, one simulated A100 (workers run the small MLP on "
                f"the CPU), apps of {TYP_MB} MB, {a.rounds} bursts of {BURST} requests to app 0, 1, 2, "
                "0, … in turn.\n\n| mode | answered 200 | answered 503 | first request of a burst, "
                "p50 | p99 |\n|---|---|---|---|---|\n" + rows)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
