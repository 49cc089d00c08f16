#!/usr/bin/env python3
"""scripts/bench --only ledger: the GPU-memory ledger's cost and --idle-release.

On one simulated A100 (the NVML stand-in of tests/nvml-mock with `--simulated-gpus`: the
workers run the small MLP fixture on the CPU, declaring 4000 MB each):

- **first request after an idle release**: `app --production --idle-release 1`; ROUNDS times,
  wait for its `idle_released` event (every worker exited, the reservation given back), then
  time one `POST /` from the connection's opening to the whole answer (200), beside the
  master's `idle_readmitted` figure (request seen → first worker ready) and a warm server's
  steady `POST /` for scale. Workers on GPUs are started by exec (no template: a template is
  only used for CPU workers), so this is an exec'd worker's boot, model load and warm-up.
- **the ledger at start**: `app plan --json` (which reads the ledger under its lock before it
  plans) with `--ledger DIR` vs `--ledger off`, interleaved, ROUNDS each.
- **per TTIN**: a server planned beside a neighbour's reservation, its neighbour stopped,
  then SIGTTIN: from the `ttin` event to the `ledger_reserved` event that writes the grown
  reservation (the loop turn in between also starts the worker).

Stdlib only. Usage: ledger.py --command CMD [--bin DIR] [--nvml LIB] [--rounds N]
Writes bench/ledger.{json,md}.
"""
import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BIN, OUT, ROOT, free_port  # noqa: E402

BODY = '{"inputs": [[1.0, 2.0, 3.0, 4.0]]}'
GPUS = {"driver": "550.54.15", "gpus": [{
    "name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-sim-0000-0000-0000-0000-000000000000",
    "total_mb": 40960, "free_mb": 40960, "processes": [], "lost": False}]}


def epoch(ts):
    """Seconds since the epoch of an RFC 3339 UTC timestamp of the JSON log."""
    whole, _, frac = ts.rstrip("Z").partition(".")
    t = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return t.timestamp() + float("0." + (frac or "0"))


class Server:
    """`app` with JSON logs, its events read as they come."""

    def __init__(self, a, work, typ_mb, more, name):
        meta = os.path.join(work, f"{name}.json")
        with open(meta, "w") as f:
            json.dump({"name": name, "model": os.path.join(ROOT, "tests", "fixtures", "mlp.pt"),
                       "input": {"shape": [-1, 4]}, "est_gpu_mem_min": 1000,
                       "est_gpu_mem_typ": typ_mb}, f)
        self.port = free_port()
        env = dict(os.environ, VRAMFORK_LOG="info,vramfork::master=debug",
                   VRAMFORK_LOG_FORMAT="json", NVML_MOCK_FILE=os.path.join(work, "gpus.json"),
                   VRAMFORK_LEDGER=os.path.join(work, "ledger"))
        self.events, self.cv = [], threading.Condition()
        self.proc = subprocess.Popen(
            [os.path.join(a.bin, "app"), "--metadata", meta, "--port", str(self.port),
             "--nvml-library", a.nvml, "--simulated-gpus", "--production", *more],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
            start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            try:
                v = json.loads(line)
                name = v["fields"]["event"]
            except (ValueError, KeyError, TypeError):
                continue
            with self.cv:
                self.events.append((name, v))
                self.cv.notify_all()

    def wait(self, name, after=0, timeout=120):
        """The first event `name` at index >= `after`, and its index."""
        return self.wait_any((name,), after, timeout)

    def wait_any(self, names, after=0, timeout=120):
        """The first event named one of `names` at index >= `after`, and its index."""
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                for i, (n, v) in enumerate(self.events[after:], after):
                    if n in names:
                        return v, i
                left = end - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    sys.exit(f"bench ledger: no {' or '.join(names)} event from the server")
                self.cv.wait(left)

    def mark(self):
        with self.cv:
            return len(self.events)

    def ready(self):
        ev, _ = self.wait("listening")
        n = ev["fields"]["workers"]
        at = 0
        while True:
            pool, at = self.wait("pool", at)
            if pool["fields"]["ready"] >= n:
                return n
            at += 1

    def post(self):
        t = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", "/", BODY, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            sys.exit(f"bench ledger: POST / answered {r.status}")
        return (time.monotonic() - t) * 1e3

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def ms(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def after_release(a, work):
    s = Server(a, work, 4000, ["--idle-release", "1"], "idle")
    try:
        workers = s.ready()
        steady = [s.post() for _ in range(20)]
        first, master = [], []
        for _ in range(a.rounds):
            m = s.mark()
            s.wait("idle_released", m)
            m = s.mark()
            first.append(s.post())
            ev, _ = s.wait("idle_readmitted", m)
            master.append(ev["fields"]["ms"])
            print(f"first request after a release: {first[-1]:.0f} ms "
                  f"(master: worker ready {master[-1]:.0f} ms after)", file=sys.stderr)
    finally:
        s.stop()
    return {"workers": workers, "first_ms": ms(first), "readmitted_ms": ms(master),
            "steady_ms": ms(steady[5:])}


def plan_time(a, work, ledger):
    meta = os.path.join(work, "plan.json")
    with open(meta, "w") as f:
        json.dump({"name": "plan", "model": os.path.join(ROOT, "tests", "fixtures", "mlp.pt"),
                   "input": {"shape": [-1, 4]}, "est_gpu_mem_typ": 4000}, f)
    env = dict(os.environ, NVML_MOCK_FILE=os.path.join(work, "gpus.json"))
    t = time.monotonic()
    subprocess.run([os.path.join(a.bin, "app"), "plan", "--json", "--metadata", meta,
                    "--nvml-library", a.nvml, "--simulated-gpus", "--production",
                    "--ledger", ledger], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return (time.monotonic() - t) * 1e3


def per_ttin(a, work):
    first = Server(a, work, 4000, [], "first")
    first.ready()
    second = Server(a, work, 4000, [], "second")
    out = []
    try:
        second.ready()
        first.stop()
        for _ in range(3):
            m = second.mark()
            second.proc.send_signal(signal.SIGTTIN)
            ttin, i = second.wait_any(("ttin", "ttin_refused"), m)
            if ttin["fields"]["event"] != "ttin":
                break
            wrote, _ = second.wait("ledger_reserved", i)
            out.append((epoch(wrote["timestamp"]) - epoch(ttin["timestamp"])) * 1e3)
            second.wait("worker_ready", i)
    finally:
        second.stop()
        first.stop()
    return ms(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--bin", default=BIN)
    ap.add_argument("--nvml", default=os.path.join(ROOT, "target", "nvml-mock", "debug",
                                                   "libnvml_mock.so"))
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    if not os.path.exists(a.nvml):
        subprocess.run(["cargo", "build", "--quiet", "-p", "nvml-mock", "--target-dir",
                        os.path.join(ROOT, "target", "nvml-mock")], check=True, cwd=ROOT)
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "gpus.json"), "w") as f:
            json.dump(GPUS, f)
        idle = after_release(a, work)
        on, off = [], []
        for _ in range(a.rounds):
            on.append(plan_time(a, work, os.path.join(work, "ledger")))
            off.append(plan_time(a, work, "off"))
        ttin = per_ttin(a, work)
    result = {
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": a.command, "bin": os.path.relpath(a.bin, ROOT), "idle_release": idle,
        "plan_ledger_ms": ms(on), "plan_no_ledger_ms": ms(off), "ttin_to_reserved_ms": ttin,
    }
    with open(os.path.join(OUT, "ledger.json"), "w") as f:
        json.dump(result, f, indent=1)
    f_ms = lambda d: f"{d['median']:.1f} ms ({d['min']:.1f} … {d['max']:.1f}, n={d['n']})"
    with open(os.path.join(OUT, "ledger.md"), "w") as f:
        f.write(f"# The GPU-memory ledger and --idle-release\n\n`{a.command}`, {result['when']}, "
                f"binaries of `{result['bin']}`, one simulated A100 (workers run the small MLP "
                "on the CPU).\n\n| what | median (min … max, runs) |\n|---|---|\n"
                f"| first `POST /` after an idle release, connect → answer | {f_ms(idle['first_ms'])} |\n"
                f"| the master: that request seen → first worker ready | {f_ms(idle['readmitted_ms'])} |\n"
                f"| a warm server's `POST /` (new connection) | {f_ms(idle['steady_ms'])} |\n"
                f"| `app plan`, `--ledger DIR` | {f_ms(result['plan_ledger_ms'])} |\n"
                f"| `app plan`, `--ledger off` | {f_ms(result['plan_no_ledger_ms'])} |\n"
                f"| TTIN: `ttin` event → `ledger_reserved` | {f_ms(ttin)} |\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
