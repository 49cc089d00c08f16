#!/usr/bin/env python3
"""scripts/bench --only pt2: each format vramfork serves against its own loop.

For the MLP 64-256-256-16, the CIFAR-style CNN, ResNet-50 and BERT-base (random weights,
made here: pt2_models.py), each as TorchScript, as a torch.export
program (the Native Runtime) and as an AOTInductor package (dynamic threads), built once by
pt2_models.py in bench/tmp/pt2: `app --production`, 2 workers x 1 torch thread, POST / JSON of
one row; at c = 1, 4, 16 each served run (wrk) between two runs of the artifact's own loop
in Python (one thread per process; 1 process at c = 1, 2 at c >= 4), so that a slow stretch of
this shared machine hits both sides of each ratio (every format with `max_batch_size` 8: see
pt2_models.py); also the first worker's load time (from
its `ready in` line) and the PSS of the 2 workers. Writes bench/pt2.{json,md}.

Usage: pt2.py --command CMD [--quick] [--models mlp256,cnn,resnet50,bert_base]
"""
import argparse
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as R  # noqa: E402
from common import OUT, ROOT, log, median  # noqa: E402

PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)
DIR = os.path.join(OUT, "tmp", "pt2")
KINDS = {"torchscript": "pt", "program": "pt2", "aoti": "aoti.pt2"}
MODELS = ("mlp256", "cnn", "resnet50", "bert_base")
READY = re.compile(r"^worker \d+ \(pid (\d+), generation \d+\) ready in ([\d.]+) ms")


def own_loop(model, kind, procs, secs):
    """Passes/s of `procs` loop processes of the artifact, summed."""
    path = os.path.join(DIR, f"{model}.{KINDS[kind]}")
    cmd = [PY, os.path.join(HERE, "pt2_models.py"), "loop", path, kind, model, str(secs)]
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    return sum(json.loads(p.communicate(timeout=secs + 120)[0])["per_s"] for p in ps)


def measure(model, kind, reps, secs):
    with open(os.path.join(DIR, f"{model}.body")) as f:
        body = f.read()
    srv = R.Server("mlp", 2, tag=f"pt2-{model}-{kind}",
                   metadata=os.path.join(DIR, f"{model}.{kind}.json"),
                   extra=("--torch-threads", "1"))
    try:
        srv.wait_ready(deadline_s=300, body=body)
        ready = [(int(m.group(1)), float(m.group(2))) for e in R.read_log(srv.log_path)
                 if (m := READY.match(e["msg"]))]
        loads = [ms for _, ms in ready]
        workers = {pid for pid, _ in ready}
        pss = sum(p["pss_mb"] for p in R.memory(srv) if p["pid"] in workers)
        row = {"model": model, "kind": kind, "load_ms": min(loads) if loads else None,
               "workers_pss_mb": round(pss, 1), "c": {}}
        R.wrk(srv.port, body, 2, 1)  # warm-up
        for c in (1, 4, 16):
            procs = 1 if c == 1 else 2
            r = R.interleaved_runs(srv.port, body, c, secs, reps,
                                   lambda: own_loop(model, kind, procs, secs))
            row["c"][str(c)] = {"served_rps": median([x["rps"] for x in r["runs"]]),
                                "loop_per_s": median(r["loops"]),
                                "ratio": median(r["ratios"]),
                                "ratios": [round(x, 3) for x in r["ratios"]]}
            log(f"pt2 {model} {kind} c={c}: served {row['c'][str(c)]['served_rps']:.0f} req/s, "
                f"own loop {row['c'][str(c)]['loop_per_s']:.0f}/s, ratio {row['c'][str(c)]['ratio']:.3f}")
        return row
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS), help="a comma list of " + ", ".join(MODELS))
    a = ap.parse_args()
    reps, secs = (1, 2) if a.quick else (3, 3)
    os.makedirs(R.TMP, exist_ok=True)
    subprocess.run([PY, os.path.join(HERE, "pt2_models.py"), "build", DIR, a.models], check=True,
                   stdout=subprocess.DEVNULL)
    rows = [measure(m, k, reps, secs) for m in a.models.split(",") for k in KINDS]
    res = {"command": a.command, "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "bin": os.path.relpath(R.BIN, ROOT), "reps": reps, "seconds": secs,
           "cpus": os.cpu_count(), "rows": rows}
    with open(os.path.join(OUT, "pt2.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# Each format served ÷ its own loop\n\n`{a.command}`, {res['when']}, binaries of "
          f"`{res['bin']}`, {res['cpus']} CPUs shared with wrk and the loops; 2 workers x 1 torch "
          f"thread, `max_batch_size` 8, POST / JSON of one row; each served run between two runs of the artifact's "
          f"own loop in Python (1 process at c=1, 2 at c>=4), {reps} pairs of {secs} s, medians.\n",
          "| model | format | load ms | PSS of 2 workers (MB) | c=1 served ÷ loop | c=4 | c=16 |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r['c'][c]['served_rps']:.0f} ÷ {r['c'][c]['loop_per_s']:.0f} = "
                 f"**{r['c'][c]['ratio']:.2f}**" for c in ("1", "4", "16")]
        md.append(f"| {r['model']} | {r['kind']} | {r['load_ms'] or '-'} | {r['workers_pss_mb']} | "
                  + " | ".join(cells) + " |")
    with open(os.path.join(OUT, "pt2.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
