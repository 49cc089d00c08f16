#!/usr/bin/env python3
"""scripts/bench --only grpc: the KServe v2 gRPC service against REST (v2 binary) for the
small MLP fixture and the CIFAR-style CNN (built by make_real.py), 2 workers x 1 torch
thread, at c = 1, 4, 16: REST through wrk (c connections), gRPC through NVIDIA's client
(tritonclient.grpc, async_infer in a closed loop) on one channel (one process, one
connection, c calls in flight) and on several (min(c, 4) processes, each its own channel
and connection, c calls in flight together). Each served run sits between two runs of the
model's own loop (forward-loop on the request's values: 2 processes x 1 thread, 1 process at
c = 1), and is given as served ÷ the mean of the two. Writes bench/grpc.json and
bench/grpc.md. Runs with the torch venv's Python (tritonclient, numpy); the measurement
helpers are run.py's.

The client is Python (grpcio's C core under tritonclient's Python wrapper) on the same
cores as the server: at high rates it costs more CPU per call than wrk does, so a gRPC row
below its REST row is partly the client's cost. Both are stated as measured.

usage: grpc_bench.py [--quick] [--command CMD]
       grpc_bench.py --client PORT MODEL SHAPE RAW CONC SECS [INPUT]   (one load process;
                                                                 INPUT: input__0)
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as R  # noqa: E402  (scripts/bench.d/run.py: stdlib only)

MODELS = {
    "mlp": {"label": "small MLP (fixture)", "metadata": R.MODELS["mlp"]["metadata"],
            "model": R.MODELS["mlp"]["model"], "name": "mlp-fixture", "shape": [1, 4],
            "ready": R.MODELS["mlp"]["body"]},
    "cnn": {"label": "CIFAR-style CNN (7 conv3x3)", "metadata": os.path.join(R.REAL, "cnn.json"),
            "model": os.path.join(R.REAL, "cnn.pt"), "name": "cnn", "shape": [1, 3, 32, 32],
            "ready_file": os.path.join(R.REAL, "cnn.ready")},
}
CONCURRENCY = [1, 4, 16]
MAX_CHANNELS = 4


def raw_values(name):
    """The request's values, raw little-endian float32 (forward-loop's DATA too)."""
    if name == "cnn":
        return R.real_data("cnn")
    path = os.path.join(R.TMP, "grpc-mlp.raw")
    with open(path, "wb") as f:
        f.write(struct.pack("<4f", 1.0, 2.0, 3.0, 4.0))
    return path


def rest_request(m, raw):
    """(path, body, header length) of the v2 binary request with the same values."""
    with open(raw, "rb") as f:
        data = f.read()
    head = json.dumps({"inputs": [{"name": "input__0", "datatype": "FP32", "shape": m["shape"],
                                   "parameters": {"binary_data_size": len(data)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return f"/v2/models/{m['name']}/infer", head + data, len(head)


def client(port, model, shape, raw, conc, secs, input_name="input__0"):
    """One load process: one channel (its own connection), `conc` calls in flight; waits for
    a line on stdin to start; prints calls answered per second and errors."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    shape = [int(x) for x in shape.split(",")]
    x = np.fromfile(raw, dtype="<f4").reshape(shape)
    # Its own subchannel: channels in one process would otherwise share one connection.
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}", channel_args=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_send_message_length", 1 << 26), ("grpc.max_receive_message_length", 1 << 26)])
    inp = grpcclient.InferInput(input_name, shape, "FP32")
    inp.set_data_from_numpy(x)
    c.infer(model, [inp])
    print("ready", flush=True)
    sys.stdin.readline()
    lock = threading.Lock()
    st = {"done": 0, "errors": 0, "lat": []}
    finished = threading.Semaphore(0)
    t0 = time.monotonic()
    end = t0 + secs

    def issue():
        sent = time.monotonic()

        def cb(result, error):
            now = time.monotonic()
            with lock:
                if error is None:
                    st["done"] += 1
                    st["lat"].append(now - sent)
                else:
                    st["errors"] += 1
            if now < end:
                issue()
            else:
                finished.release()
        c.async_infer(model, [inp], cb)

    for _ in range(conc):
        issue()
    for _ in range(conc):
        finished.acquire()
    took = time.monotonic() - t0
    lat = sorted(st["lat"]) or [0.0]
    print(json.dumps({"done": st["done"], "errors": st["errors"], "secs": took,
                      "p50_ms": lat[len(lat) // 2] * 1e3}), flush=True)


def grpc_load(port, m, raw, c, channels, secs):
    """`c` calls in flight over `channels` load processes (channels): req/s summed."""
    per = [c // channels + (1 if i < c % channels else 0) for i in range(channels)]
    shape = ",".join(map(str, m["shape"]))
    ps = [subprocess.Popen([sys.executable, __file__, "--client", str(port), m["name"], shape, raw,
                            str(k), str(secs), m.get("input", "input__0")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True) for k in per]
    try:
        for p in ps:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a gRPC load process did not start")
        for p in ps:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = [json.loads(p.stdout.readline()) for p in ps]
    finally:
        for p in ps:
            try:
                p.wait(timeout=secs + 60)
            except subprocess.TimeoutExpired:
                p.kill()
    return {"rps": sum(r["done"] / r["secs"] for r in res), "errors": sum(r["errors"] for r in res),
            "p50_ms": R.median([r["p50_ms"] for r in res]), "channels": channels}


def measure(cfg):
    out = {"models": {}}
    for name, m in MODELS.items():
        raw = raw_values(name)
        path, body, hl = rest_request(m, raw)
        shape = ",".join(map(str, m["shape"]))
        secs = cfg["load_s"]
        pass_ms = R.loops(m["model"], shape, 1, 1, cfg["limit_s"], data=raw)["pass_p50_ms"]
        srv = R.Server("mlp", 2, tag=f"grpc-{name}", metadata=m["metadata"],
                       extra=["--torch-threads", "1"])
        row = {"label": m["label"], "pass_ms": pass_ms, "c": {}}
        try:
            ready = m.get("ready")
            if ready is None:
                with open(m["ready_file"]) as f:
                    ready = f.read()
            srv.wait_ready(deadline_s=120, body=ready)
            R.wrk(srv.port, body, 1, 1, path, hl)
            grpc_load(srv.port, m, raw, 1, 1, 1)
            for c in CONCURRENCY:
                procs = R.loop_procs(c)

                def loop():
                    return R.loops(m["model"], shape, procs, 1, secs, data=raw)["per_s"]

                kinds = [("rest", lambda: R.wrk(srv.port, body, c, secs, path, hl)),
                         ("grpc_1", lambda: grpc_load(srv.port, m, raw, c, 1, secs))]
                if c > 1:
                    k = min(c, MAX_CHANNELS)
                    kinds.append(("grpc_n", lambda: grpc_load(srv.port, m, raw, c, k, secs)))
                cell = {}
                for _ in range(cfg["reps"]):
                    before = loop()
                    for kind, run_one in kinds:
                        r = run_one()
                        after = loop()
                        x = cell.setdefault(kind, {"rps": [], "ratio": [], "failed": 0})
                        x["rps"].append(r["rps"])
                        x["ratio"].append(r["rps"] / ((before + after) / 2))
                        x["failed"] += r.get("failed", r.get("errors", 0))
                        x["channels"] = r.get("channels", c)
                        before = after
                for x in cell.values():
                    x["rps_all"], x["rps"] = x["rps"], R.median(x["rps"])
                    x["ratios"], x["ratio"] = [round(v, 3) for v in x["ratio"]], R.median(x["ratio"])
                row["c"][str(c)] = cell
                R.log(f"grpc {name} c={c}: " + ", ".join(
                    f"{k} {x['rps']:.0f} req/s ({x['ratio']:.2f} of loop, {x['failed']} failed)"
                    for k, x in cell.items()))
        finally:
            srv.stop()
        out["models"][name] = row
    return out


def markdown(r, cmd):
    lines = ["# gRPC vs REST (v2 binary), served ÷ the model's own loop", "",
             f"`{cmd}` on {r['machine']['nproc']} × {r['machine']['cpu']}, {r['when']}. 2 workers × 1 torch thread. REST: wrk, c "
             "connections. gRPC: tritonclient.grpc `async_infer` in a closed loop, on one channel "
             f"(one connection) and on min(c, {MAX_CHANNELS}) channels (one process and connection "
             "each). Each served run sits between two runs of the model's own loop; ÷ loop is "
             "served ÷ their mean. The gRPC client is Python on the same cores.", "",
             "| model | pass (ms) | c | REST req/s | ÷ loop | gRPC 1 channel req/s | ÷ loop | "
             "gRPC n channels req/s | ÷ loop | gRPC 1 ÷ REST |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["models"].values():
        for c in CONCURRENCY:
            x = row["c"][str(c)]
            n = x.get("grpc_n")
            lines.append(
                f"| {row['label']} | {row['pass_ms']:.3f} | {c} | {x['rest']['rps']:.0f} | "
                f"{x['rest']['ratio']:.2f} | {x['grpc_1']['rps']:.0f} | {x['grpc_1']['ratio']:.2f} | "
                + (f"{n['rps']:.0f} ({n['channels']}) | {n['ratio']:.2f}" if n else "— | —")
                + f" | {x['grpc_1']['rps'] / x['rest']['rps']:.2f} |")
    fails = sum(x["failed"] for row in r["models"].values() for cell in row["c"].values()
                for x in cell.values())
    lines += ["", f"Failed requests or calls: {fails}.", ""]
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, model, shape, raw, conc, secs = sys.argv[2:8]
        return client(port, model, shape, raw, int(conc), float(secs), *sys.argv[8:9])
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--command", default="scripts/bench --only grpc")
    a = ap.parse_args()
    cfg = {"reps": 1, "load_s": 3, "limit_s": 2} if a.quick else {"reps": 2, "load_s": 6, "limit_s": 3}
    os.makedirs(R.TMP, exist_ok=True)
    r = measure(cfg)
    r["machine"] = R.machine()
    r["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    r["cfg"] = cfg
    out = os.path.join(R.ROOT, "bench")
    with open(os.path.join(out, "grpc.json"), "w") as f:
        json.dump(r, f, indent=1)
    with open(os.path.join(out, "grpc.md"), "w") as f:
        f.write(markdown(r, a.command))
    R.log(f"wrote {out}/grpc.json and grpc.md")


if __name__ == "__main__":
    sys.exit(main())
