"""Where a real model's served ÷ loop falls short (docs/performance.md): for MODEL
(cnn, cnn_v2, resnet50 or bert, built by `scripts/bench --only real`), alternates the model's own loop
(2 forward-loop processes × 1 torch thread) with the server under wrk at concurrency C (2
workers × 1 torch thread, --metrics-port), ROUNDS times, and prints per run: passes or
requests per second, the mean time of a pass (the loop's own p50; the server's from
vramfork_forward_duration_seconds), and how busy the server's two model threads were. If
the server's passes take as long as the loop's and its model threads are busy all the time,
served ÷ loop is 1; the two figures say which of the two is missing.

    python3 scripts/bench.d/pass_diag.py resnet50 [C=4] [ROUNDS=3] [--synthetic]

The loop runs on the values the requests carry (forward-loop's DATA); --synthetic gives it
forward-loop's own values instead, as the bench did before 2026-11-25.
"""
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (the bench's own helpers)

name = sys.argv[1]
pos = [a for a in sys.argv[1:] if not a.startswith("--")]
conc = int(pos[1]) if len(pos) > 1 else 4
rounds = int(pos[2]) if len(pos) > 2 else 3
secs = 6
path, body, hl = run.real_request(name)
m = run.REAL_MODELS[name]
srv = run.Server("mlp", 2, tag=f"diag-{name}", metrics=True,
                 metadata=os.path.join(run.REAL, f"{run.files(name)}.json"))
with open(os.path.join(run.REAL, f"{run.files(name)}.ready")) as f:
    srv.wait_ready(deadline_s=180, body=f.read())


def forward():
    t = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics").read().decode()
    s = float(re.search(r"^vramfork_forward_duration_seconds_sum (\S+)", t, re.M).group(1))
    c = float(re.search(r"^vramfork_forward_duration_seconds_count (\S+)", t, re.M).group(1))
    return s, c


try:
    run.wrk(srv.port, body, 2, 2, path, hl)
    for _ in range(rounds):
        lp = run.loops(os.path.join(run.REAL, f"{run.files(name)}.pt"), m["shape"], 2, 1, secs, slack=120,
                       data=None if "--synthetic" in sys.argv else run.real_data(name))
        print(f"loop: {lp['per_s']:.2f} passes/s, pass p50 {lp['pass_p50_ms']:.2f} ms", flush=True)
        time.sleep(2.5)  # heartbeats carry the figures
        s0, c0 = forward()
        t0 = time.time()
        r = run.wrk(srv.port, body, conc, secs, path, hl)
        wall = time.time() - t0
        time.sleep(2.5)
        s1, c1 = forward()
        print(f"served c={conc}: {r['rps']:.2f} req/s ({r['rps'] / lp['per_s']:.3f} of this loop); "
              f"passes {c1 - c0:.0f}, mean pass {(s1 - s0) / (c1 - c0) * 1e3:.2f} ms, "
              f"model threads busy {(s1 - s0) / (wall * 2):.3f}", flush=True)
finally:
    srv.stop()
