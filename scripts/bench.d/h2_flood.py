#!/usr/bin/env python3
"""scripts/bench --only h2flood: a normal client's rate beside a WINDOW_UPDATE flood.

`app --production --workers 2` serving the small MLP; a normal client (one process, HTTP/1.1
keep-alive, one request at a time) counts its answers for SECONDS alone, then for SECONDS
while FLOODERS processes flood WINDOW_UPDATE(+1) frames on HTTP/2 connections (each on one
connection until the server ends it, as the issue's probe), then for SECONDS while they
flood and open a new connection each time the server ends one, and so on for ROUNDS rounds,
interleaved. Prints and writes the rates, the ratios flooded ÷ alone per round and their
medians, and how many flood connections the server ended (bench/h2flood.{json,md}).

Stdlib only. Usage: h2_flood.py --command CMD [--bin DIR] [--seconds S] [--rounds N]
"""
import argparse
import http.client
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BIN, OUT, ROOT, App, free_port  # noqa: E402
BODY = '{"inputs": [[1.0, 2.0, 3.0, 4.0]]}'
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
WINDOW_UPDATE = b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x01"
FLOODERS = 4


def normal(port, seconds, out):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            c.request("POST", "/", BODY, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            n += r.status == 200
            if r.getheader("Connection", "").lower() == "close":
                c.close()
        except OSError:
            c.close()
    out.put(n)


def flood(port, seconds, out, reconnect):
    ended, end = 0, time.monotonic() + seconds
    batch = WINDOW_UPDATE * 4096
    while time.monotonic() < end and (reconnect or not ended):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(PREFACE)
        try:
            while time.monotonic() < end:
                s.sendall(batch)
        except OSError:
            ended += 1
        s.close()
    if not reconnect:
        time.sleep(max(0.0, end - time.monotonic()))
    out.put(ended)


def phase(port, seconds, flooders, reconnect=False):
    """The normal client's answers a second, and the flood connections the server ended."""
    nq, fq = mp.Queue(), mp.Queue()
    procs = [mp.Process(target=flood, args=(port, seconds, fq, reconnect))
             for _ in range(flooders)]
    procs.append(mp.Process(target=normal, args=(port, seconds, nq)))
    for p in procs:
        p.start()
    rps = nq.get() / seconds
    ended = sum(fq.get() for _ in range(flooders))
    for p in procs:
        p.join()
    return rps, ended


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--bin", default=BIN)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    port = free_port()
    meta = os.path.join(ROOT, "tests", "fixtures", "mlp.json")
    srv = App(["--workers", "2", "--metadata", meta, "--port", str(port)],
              os.path.join(OUT, "tmp", "h2flood.log"), binary_dir=a.bin)
    try:
        srv.wait_ready(port)
        rounds = []
        for i in range(a.rounds):
            alone, _ = phase(port, a.seconds, 0)
            flooded, ended = phase(port, a.seconds, FLOODERS)
            again, ended_again = phase(port, a.seconds, FLOODERS, reconnect=True)
            rounds.append({"alone_rps": alone, "flood_rps": flooded,
                           "ratio": flooded / alone if alone else 0.0,
                           "flood_connections_ended": ended,
                           "reconnecting_rps": again,
                           "reconnecting_ratio": again / alone if alone else 0.0,
                           "reconnecting_connections_ended": ended_again})
            print(f"round {i + 1}: alone {alone:.0f} req/s; beside {FLOODERS} flooding "
                  f"connections {flooded:.0f} req/s ({flooded / max(alone, 1e-9):.2f}, "
                  f"{ended} ended); beside {FLOODERS} flooders reconnecting {again:.0f} req/s "
                  f"({again / max(alone, 1e-9):.2f}, {ended_again} ended)",
                  file=sys.stderr, flush=True)
    finally:
        srv.stop()
    result = {
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": a.command, "bin": os.path.relpath(a.bin, ROOT), "seconds": a.seconds,
        "flooders": FLOODERS, "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_reconnecting_ratio": statistics.median(r["reconnecting_ratio"] for r in rounds),
    }
    with open(os.path.join(OUT, "h2flood.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(OUT, "h2flood.md"), "w") as f:
        f.write(f"# A normal client beside a WINDOW_UPDATE flood\n\n`{a.command}`, "
                f"{result['when']}, binaries of `{result['bin']}`: small MLP, 2 workers, one "
                f"HTTP/1.1 keep-alive client, {FLOODERS} flooding processes, {a.seconds:g} s "
                "phases interleaved: alone, beside flooding connections that stop when the "
                "server ends them (as the issue's probe), beside flooders that reconnect at "
                "once.\n\n| round | alone (req/s) | beside the flood (req/s, ratio, "
                "connections ended) | beside reconnecting flooders (req/s, ratio, connections "
                "ended) |\n|---|---|---|---|\n")
        for i, r in enumerate(rounds):
            f.write(f"| {i + 1} | {r['alone_rps']:.0f} | {r['flood_rps']:.0f}, "
                    f"{r['ratio']:.2f}, {r['flood_connections_ended']} | "
                    f"{r['reconnecting_rps']:.0f}, {r['reconnecting_ratio']:.2f}, "
                    f"{r['reconnecting_connections_ended']} |\n")
        f.write(f"\nMedian ratios: {result['median_ratio']:.2f} beside the flood, "
                f"{result['median_reconnecting_ratio']:.2f} beside reconnecting flooders.\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
