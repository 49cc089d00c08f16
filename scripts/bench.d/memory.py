#!/usr/bin/env python3
"""scripts/bench --only memory: a model leaking 24 MB of host memory per request
(tests/support/make_memory_models.py's `leak`: each pass appends a written tensor to a module
attribute), served by `app --production --workers 4` under wrk at c = 4 for 60 s, without and
with --max-worker-memory-mb: the tree's memory over time (sampled twice a second: PSS summed
over its processes, shared pages counted once, and RSS summed, shared pages counted in each),
req/s with ÷ without, failed requests, recyclings and OOM kills.

Both runs are in a memory cgroup of LIMIT_MB made for them (cgroup v1: below this process's;
v2: beside it), so that the run without the option cannot take the machine's memory: there
the leak fills the cgroup within seconds, and the kernel's OOM killer takes workers (their
oom_score_adj makes them its choice), which the master replaces after a back-off. Needs root
(a writable memory controller); says so and exits 2 without.

Stdlib only. The model is built with $VRAMFORK_PYTHON (scripts/env.sh sets it).

Usage: memory.py --command CMD [--quick]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import OUT, ROOT, App, free_port  # noqa: E402

TMP = os.path.join(OUT, "tmp", "memory")
LEAK_MB = 24
LIMIT_MB = 2048
RECYCLE_MB = 240
WORKERS = 4
CONNS = 4
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(msg):
    common.log(msg, "bench memory")


class Cgroup:
    """A memory cgroup of LIMIT_MB for the runs; removed by close()."""

    def __init__(self):
        lines = open("/proc/self/cgroup").read().splitlines()
        v1 = [l.split(":", 2)[2] for l in lines if "memory" in l.split(":", 2)[1].split(",")]
        name = f"vf-bench-memory-{os.getpid()}"
        if v1:
            self.version, own = 1, "/sys/fs/cgroup/memory" + v1[0]
            self.dir, limit = os.path.join(own, name), "memory.limit_in_bytes"
        else:
            path = [l.split(":", 2)[2] for l in lines if l.startswith("0::")]
            own = "/sys/fs/cgroup" + (path[0] if path else "/")
            self.version, self.dir, limit = 2, os.path.join(os.path.dirname(own), name), "memory.max"
        try:
            os.mkdir(self.dir)
            with open(os.path.join(self.dir, limit), "w") as f:
                f.write(str(LIMIT_MB << 20))
        except OSError as e:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass
            print(f"scripts/bench --only memory: cannot make a memory cgroup at {self.dir} "
                  f"({e}); it needs root and a writable memory controller", file=sys.stderr)
            sys.exit(2)

    def oom_kills(self):
        f = "memory.oom_control" if self.version == 1 else "memory.events"
        text = open(os.path.join(self.dir, f)).read()
        return int(re.search(r"^oom_kill (\d+)", text, re.M).group(1))

    def pids(self):
        with open(os.path.join(self.dir, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]

    def close(self):
        for _ in range(300):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)
        log(f"could not remove {self.dir}")


def tree_memory(pids):
    """(PSS summed, RSS summed) in MB over `pids` (those gone meanwhile skipped)."""
    pss = rss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                text = f.read()
            pss += int(re.search(r"^Pss:\s+(\d+) kB", text, re.M).group(1)) << 10
            with open(f"/proc/{p}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
        except (OSError, AttributeError):
            pass
    return pss / (1 << 20), rss / (1 << 20)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def sample(text, name):
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def run(cg, metadata, tag, extra, seconds):
    port, mport = free_port(), free_port()
    logf = os.path.join(TMP, f"log-{tag}.txt")
    env = dict(os.environ, VRAMFORK_LOG_FORMAT="json")
    procs = os.path.join(cg.dir, "cgroup.procs")
    # Started by a shell that joins the cgroup first, so the master and all it starts are in.
    app = App(["--metadata", metadata, "--port", str(port), "--metrics-port", str(mport),
               "--workers", str(WORKERS)] + extra, logf, env=env,
              wrap=["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh"])
    try:
        app.wait(lambda: sample(scrape(mport), 'vramfork_workers{state="ready"}') >= WORKERS, 180)
        oom_before = cg.oom_kills()
        series, done = [], threading.Event()

        def sampler():
            t0 = time.monotonic()
            while not done.is_set():
                pss, rss = tree_memory(cg.pids())
                series.append((round(time.monotonic() - t0, 2), round(pss), round(rss)))
                done.wait(0.5)

        th = threading.Thread(target=sampler)
        th.start()
        w = wrk(port, seconds)
        done.set()
        th.join()
        text = scrape(mport)
        exits = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^vramfork_worker_exits_total\{reason="([^"]+)"\} (\S+)$', text, re.M)}
        events = open(logf).read()
        return {
            "args": extra,
            "rps_ok": w["ok"] / w["secs"],
            "requests": w["requests"],
            "ok": w["ok"],
            "failed": w["failed"],
            "errors": w["errors"],
            "p50_ms": w["p50_ms"],
            "p99_ms": w["p99_ms"],
            "pct_ms": w["pct_ms"],
            "max_ms": w["max_ms"],
            "oom_kills": cg.oom_kills() - oom_before,
            "worker_oom_killed": events.count('"event":"worker_oom_killed"'),
            "worker_memory_recycled": events.count('"event":"worker_memory_recycled"'),
            "exits": exits,
            "peak_pss_mb": max(s[1] for s in series),
            "peak_rss_mb": max(s[2] for s in series),
            "series": series,
        }
    finally:
        app.stop()


def wrk(port, seconds):
    cmd = ["wrk", "-t", "1", "-c", str(CONNS), "-d", f"{seconds}s", "--timeout", "30s",
           "-s", os.path.join(HERE, "post.lua"), f"http://127.0.0.1:{port}/"]
    env = dict(os.environ, BENCH_BODY=json.dumps({"inputs": [[float(LEAK_MB)]]}))
    env.pop("BENCH_BODY_FILE", None)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 60)
    for line in p.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            r = json.loads(line[len("BENCHJSON "):])
            e = r["errors"]
            failed = e["status"] + e["connect"] + e["read"] + e["write"] + e["timeout"]
            return {"secs": r["duration_us"] / 1e6, "requests": r["requests"],
                    "ok": r["requests"] - e["status"], "failed": failed, "errors": e,
                    "p50_ms": r["lat_us"]["pct"]["50"] / 1e3,
                    "p99_ms": r["lat_us"]["pct"]["99"] / 1e3,
                    "pct_ms": {k: v / 1e3 for k, v in r["lat_us"]["pct"].items()},
                    "max_ms": r["lat_us"]["max"] / 1e3}
    raise RuntimeError(f"wrk gave no result: {p.stdout} {p.stderr}")


def svg(res):
    """The tree's PSS (solid) and RSS (dashed) over time, both runs, and the cgroup's limit."""
    W, H, L, R, T, B = 760, 360, 64, 150, 30, 44
    runs = res["runs"]
    tmax = max(s[0] for r in runs.values() for s in r["series"]) or 1
    ymax = max([LIMIT_MB] + [s[2] for r in runs.values() for s in r["series"]]) * 1.05
    x = lambda t: L + (W - L - R) * t / tmax
    y = lambda mb: H - B - (H - T - B) * mb / ymax
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="18" font-size="14">Tree memory, {LEAK_MB} MB leaked per request, '
         f'c = {CONNS}, {WORKERS} workers, cgroup limit {LIMIT_MB} MB</text>']
    step = 500 if ymax > 1500 else 250
    for mb in range(0, int(ymax) + 1, step):
        o.append(f'<line x1="{L}" x2="{W - R}" y1="{y(mb):.1f}" y2="{y(mb):.1f}" stroke="#ddd"/>'
                 f'<text x="{L - 6}" y="{y(mb) + 4:.1f}" text-anchor="end">{mb}</text>')
    for t in range(0, int(tmax) + 1, 10):
        o.append(f'<text x="{x(t):.1f}" y="{H - B + 16}" text-anchor="middle">{t}</text>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">seconds</text>')
    o.append(f'<text x="14" y="{(T + H - B) / 2}" transform="rotate(-90 14 {(T + H - B) / 2})" '
             f'text-anchor="middle">MB</text>')
    o.append(f'<line x1="{L}" x2="{W - R}" y1="{y(LIMIT_MB):.1f}" y2="{y(LIMIT_MB):.1f}" '
             f'stroke="black" stroke-dasharray="2,3"/>')
    legend = [("limit", "black", "2,3")]
    for (tag, r), color in zip(runs.items(), ["#c0392b", "#2471a3"]):
        for i, dash in ((1, ""), (2, "6,4")):
            pts = " ".join(f"{x(s[0]):.1f},{y(s[i]):.1f}" for s in r["series"])
            o.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" '
                     f'stroke-dasharray="{dash}" points="{pts}"/>')
            legend.append((f"{tag} {'PSS' if i == 1 else 'RSS'}", color, dash))
    for k, (name, color, dash) in enumerate(legend):
        ly = T + 14 + 18 * k
        o.append(f'<line x1="{W - R + 10}" x2="{W - R + 34}" y1="{ly - 4}" y2="{ly - 4}" '
                 f'stroke="{color}" stroke-width="1.6" stroke-dasharray="{dash}"/>'
                 f'<text x="{W - R + 40}" y="{ly}">{name}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def render(res):
    runs = res["runs"]
    wo, wi = runs["without"], runs["with"]
    L = [f"# Host-memory recycling: a leaking model with and without --max-worker-memory-mb\n",
         f"Written by `{res['command']}` on {res['date']} ({res['machine']}). "
         f"{res['seconds']} s of wrk at c = {CONNS} per run, `--production --workers {WORKERS}`, "
         f"{LEAK_MB} MB kept by the model per request, both runs in a memory cgroup of "
         f"{LIMIT_MB} MB. Tree memory: sampled every 0.5 s over the cgroup's processes "
         "(master, template, workers); PSS counts the pages they share once, RSS in each.\n",
         "| run | req/s answered | failed | p50 ms | p99 ms | recycled | OOM kills | peak PSS MB | peak RSS MB |",
         "|---|---|---|---|---|---|---|---|---|"]
    for tag, r in runs.items():
        label = "without" if not r["args"] else f"with `{' '.join(r['args'])}`"
        L.append(f"| {label} | {r['rps_ok']:.1f} | {r['failed']} | {r['p50_ms']:.1f} | "
                 f"{r['p99_ms']:.1f} | {r['worker_memory_recycled']} | {r['oom_kills']} | "
                 f"{r['peak_pss_mb']} | {r['peak_rss_mb']} |")
    ratio = wi["rps_ok"] / wo["rps_ok"] if wo["rps_ok"] else float("inf")
    L.append(f"\nreq/s answered, with ÷ without: **{ratio:.2f}** (one run each, same machine, "
             "one after the other).\n")
    L.append("![tree memory over time](memory.svg)\n")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", default="scripts/bench --only memory")
    ap.add_argument("--quick", action="store_true", help="20 s per run instead of 60")
    a = ap.parse_args()
    seconds = 20 if a.quick else 60
    os.makedirs(TMP, exist_ok=True)
    model, metadata = os.path.join(TMP, "leak.pt"), os.path.join(TMP, "leak.json")
    subprocess.run([os.environ.get("VRAMFORK_PYTHON", "python3"),
                    os.path.join(ROOT, "tests", "support", "make_memory_models.py"), "leak",
                    model], check=True, stdout=subprocess.DEVNULL)
    with open(metadata, "w") as f:
        json.dump({"name": "leak", "model": model,
                   "input": {"shape": [1, 1], "dtype": "float32"}}, f)
    cg = Cgroup()
    load = os.getloadavg()[0]
    runs = {}
    try:
        for tag, extra in (("without", []), ("with", ["--max-worker-memory-mb", str(RECYCLE_MB)])):
            log(f"{tag}: {seconds} s")
            runs[tag] = run(cg, metadata, tag, extra, seconds)
            r = runs[tag]
            log(f"{tag}: {r['rps_ok']:.1f} req/s answered, {r['failed']} failed, "
                f"{r['worker_memory_recycled']} recycled, {r['oom_kills']} OOM kills, "
                f"peak PSS {r['peak_pss_mb']} MB")
    finally:
        cg.close()
    cpus = os.cpu_count()
    res = {"command": a.command, "seconds": seconds,
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{cpus} CPUs; load average {load:.1f} when it started",
           "limit_mb": LIMIT_MB, "leak_mb": LEAK_MB, "runs": runs}
    with open(os.path.join(OUT, "memory.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(OUT, "memory.md"), "w") as f:
        f.write(render(res))
    with open(os.path.join(OUT, "memory.svg"), "w") as f:
        f.write(svg(res))
    log("done: bench/memory.json, memory.md, memory.svg")


if __name__ == "__main__":
    main()
