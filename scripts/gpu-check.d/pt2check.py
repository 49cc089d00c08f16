"""The `.pt2` check of the short GPU window (docs/gpu-checks.md, third command): with the
machine's own torch, export a small MLP with `torch.export` on the GPU (`cuda:0`) and compile
the same program into an AOTInductor package there (`torch._inductor.aoti_compile_and_package`),
serve each with `app --production` (one worker, the plan placing it on the GPU), and check
each answer against eager PyTorch within a tolerance; one table row per artifact.

usage: python3 pt2check.py --bin DIR [--out DIR] [--work DIR] [--cpu]

  --bin DIR   where `app` and `app-worker` are (gpu-pack/, or target/debug here)
  --out DIR   where `pt2.txt` (the rows) goes (default: $OUT, else the work folder)
  --work DIR  scratch folder (default: ${TMPDIR:-/tmp}/vf-pt2-check, emptied first)
  --cpu       the dry mode: the same steps on the CPU (a CPU package compiled with
              TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1, which CPU kernels need; it changes nothing
              on the GPU, whose kernels have no OpenMP team), the servers given --device cpu.
              tests/pt2_gpu_check.rs runs it, so that the script is not first run on a GPU.

Exit status: 0 every row PASS, 1 a row FAIL, 2 it cannot run here (no torch, no CUDA
without --cpu, no binaries)."""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

ROWS = [[0.5, -1.0, 2.0, 0.25], [1.0, 2.0, 3.0, 4.0], [-3.0, 0.0, 0.5, 1.5]]
READY_S = 90  # a worker's load and warm-up, at most
HEADER = "| artifact | device | made in (s) | served in (s) | max abs diff vs eager | tolerance | result |"


def say(*a):
    print(*a, flush=True)


def make(work, device):
    """The MLP, its eager answers, a torch.export program and an AOTInductor package of it,
    made on `device`; (eager outputs, [(name, path, seconds)])."""
    import torch
    from torch.export import Dim

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    ).eval().to(device)
    x = torch.tensor(ROWS, dtype=torch.float32, device=device)
    with torch.no_grad():
        eager = model(x).cpu().tolist()
    example = (torch.randn(2, 4, device=device),)
    batch = {0: Dim("batch", max=64)}
    made = []
    t0 = time.monotonic()
    program = torch.export.export(model, example, dynamic_shapes=(batch,))
    path = os.path.join(work, "mlp_program.pt2")
    torch.export.save(program, path)
    made.append(("ExportedProgram (Native Runtime)", path, time.monotonic() - t0, None))
    t0 = time.monotonic()
    path = os.path.join(work, "mlp_aoti.pt2")
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=path)
        why = None
    except Exception as e:  # noqa: BLE001 - no compiler, no Triton: that row's FAIL
        why = f"the compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    made.append(("AOTInductor package", path, time.monotonic() - t0, why))
    return eager, made


def metadata(work, tag, model, gpu):
    meta = {
        "name": "pt2 check",
        "model": model,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        # batching pads a one-row batch to an AOTInductor package's two-row minimum
        "max_batch_size": 4,
    }
    if gpu:
        meta.update({"est_gpu_mem_min": 500, "est_gpu_mem_typ": 2000})
    path = os.path.join(work, f"{tag}-meta.json")
    with open(path, "w") as f:
        json.dump(meta, f)
    return path


def events(log_path):
    """The server log's JSON events (one per line; other lines skipped)."""
    out = []
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def fields(e):
    return e.get("fields", e)


def serve(binary, meta, log_path, env, cpu):
    """Starts `app --production` on `meta`; (process, port, device, seconds) once its worker
    is ready, or raises with the log's tail."""
    args = [os.path.join(binary, "app"), "--production", "--workers", "1", "--port", "0",
            "--metadata", meta, "--log-format", "json"]
    if cpu:
        args += ["--device", "cpu"]
    t0 = time.monotonic()
    log = open(log_path, "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    port = device = None
    while time.monotonic() - t0 < READY_S:
        if proc.poll() is not None:
            break
        for e in events(log_path):
            f = fields(e)
            m = re.search(r"listening on https?://[^ ]*:(\d+)", str(f.get("message", "")))
            if m:
                port = int(m.group(1))
            if f.get("event") == "worker_ready":
                device = f.get("device")
        if port and device:
            return proc, port, device, time.monotonic() - t0
        time.sleep(0.2)
    stop(proc)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-3000:]
    raise RuntimeError(f"no worker ready within {READY_S} s (status {proc.poll()}):\n{tail}")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def answer(port):
    body = json.dumps({"inputs": ROWS}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["outputs"]


def max_diff(a, b):
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return float("inf")
        return max((max_diff(x, y) for x, y in zip(a, b)), default=0.0)
    return abs(float(a) - float(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "vf-pt2-check"))
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    for b in ("app", "app-worker"):
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            say(f"pt2check: no {b} in {a.bin}")
            return 2
    try:
        import torch
    except ImportError as e:
        say(f"pt2check: python3 has no torch ({e})")
        return 2
    if not a.cpu and not torch.cuda.is_available():
        say("pt2check: torch sees no CUDA device here (run with --cpu for the dry mode)")
        return 2
    device = "cpu" if a.cpu else "cuda:0"
    tol = 1e-5 if a.cpu else 1e-4
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    out = a.out or a.work
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    if a.cpu:
        # CPU kernels take their OpenMP team from the worker, not from this machine's cores.
        os.environ["TORCHINDUCTOR_CPP_DYNAMIC_THREADS"] = "1"
    gpu = torch.cuda.get_device_name(0) if not a.cpu else "none (dry mode, --cpu)"
    say(f"torch {torch.__version__}, device {device}, GPU {gpu}")
    eager, made = make(a.work, device)
    rows, failed = [], False
    for i, (kind, path, made_s, why) in enumerate(made):
        meta = metadata(a.work, f"pt2-{i}", path, not a.cpu)
        log = os.path.join(a.work, f"app-pt2-{i}.log")
        served_s, diff, on, verdict = None, None, "-", "FAIL"
        proc = None
        try:
            if why:
                raise RuntimeError(why)
            proc, port, on, served_s = serve(a.bin, meta, log, env, a.cpu)
            diff = max_diff(answer(port), eager)
            want = "cpu" if a.cpu else "cuda:0"
            verdict = "PASS" if diff <= tol and on == want else "FAIL"
            if on != want:
                say(f"{kind}: the worker runs on {on}, not {want}")
        except Exception as e:  # noqa: BLE001 - every failure is this row's FAIL
            say(f"{kind}: {e}")
        finally:
            if proc is not None:
                stop(proc)
        failed |= verdict != "PASS"
        rows.append(f"| {kind} | {on} | {made_s:.1f} | "
                    f"{'-' if served_s is None else f'{served_s:.1f}'} | "
                    f"{'-' if diff is None else f'{diff:.2e}'} | {tol:g} | {verdict} |")
    text = "\n".join([f"torch {torch.__version__}; GPU: {gpu}", HEADER,
                      "|---|---|---|---|---|---|---|"] + rows) + "\n"
    with open(os.path.join(out, "pt2.txt"), "w") as f:
        f.write(text)
    say(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
