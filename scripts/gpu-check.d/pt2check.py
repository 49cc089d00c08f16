"""The `.pt2` part of the GPU check (docs/gpu-checks.md; scripts/gpu-check runs it as its steps
`pt2-program` and `pt2-package`, and it runs on its own too): with the machine's own torch,
export a small MLP with `torch.export` on the GPU (`cuda:0`) and compile the same program into
an AOTInductor package there (`torch._inductor.aoti_compile_and_package`), serve each with
`app --production` (one worker, the plan placing it on the GPU), and check each against eager
PyTorch: a first request, a second one of another size (kernels a package loads at their
first launch must still be there), one whose activations exceed the worker's allocator cap
(507, the worker replaced), then a next one (200). One table row per artifact.

usage: python3 pt2check.py --bin DIR --out DIR [--work DIR] [--deadline SECONDS]
                           [--only program|package] [--cpu]

  --bin DIR       where `app` and `app-worker` are (gpu-pack/, or target/debug here); a BUILD
                  file there (scripts/gpu-pack writes one) names the torch they need
  --out DIR       where `pt2.txt` (the table) goes: its header at the start, each row appended
                  and flushed as it finishes, so a run stopped at any point keeps every
                  finished row
  --work DIR      scratch folder (default: ${TMPDIR:-/tmp}/vf-pt2-check, emptied first)
  --deadline S    the whole run's time limit, its own (default 240): the program's row may
                  take 40 % of it (what it leaves goes to the package's row), every wait and
                  child process is bounded by its row's share, and a row whose share runs out
                  is written as TIME (out of time) while the next row still runs
  --only KIND     one row: `program` or `package`
  --cpu           the dry mode: the same steps on the CPU (a CPU package compiled with
                  TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1, which CPU kernels need; it changes nothing
                  on the GPU, whose kernels have no OpenMP team), the servers given --device
                  cpu; no allocator cap there, so the large request must answer 200.
                  tests/pt2_gpu_check.rs runs it, so that the script is not first run on a GPU.

Set-up, as scripts/gpu-check's: every server gets VRAMFORK_NVML_LIBRARY (the NVML this
process found and holds open for the run), VRAMFORK_LEDGER=off (each plans alone) and no other
VRAMFORK_* variable; the compile runs with TORCHINDUCTOR_COMPILE_THREADS=1 (two small kernels
need no pool of compile workers). The package's row is SKIP, naming what is missing, when no
C++ compiler ($CXX, else g++) or, on the GPU, no CUDA toolkit (CUDA_HOME, CUDA_PATH, nvcc on
PATH, /usr/local/cuda: where torch looks) is found. In its first seconds it stops (exit 2,
every row SKIP naming why) when the machine cannot run it: no binaries, no torch, another
torch than the binaries', no NVIDIA GPU (without --cpu).

Exit status: 0 every row PASS or SKIP, 1 a row FAIL or TIME, 2 it cannot run here.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = [[0.5, -1.0, 2.0, 0.25], [1.0, 2.0, 3.0, 4.0], [-3.0, 0.0, 0.5, 1.5]]
SECOND = ROWS[:1]  # another size: one row (batching pads it to a package's two-row minimum)
HIDDEN = 65536  # the MLP's hidden width: each row's activations take 256 KiB
MAX_ROWS = 1 << 16  # the batch dimension's bound in the export
DRY_LARGE_ROWS = 64  # the dry mode's "large" request: no cap on the CPU
PROGRAM_SHARE = 0.4  # of the deadline, for the program's row when both run
KINDS = {"program": "ExportedProgram (Native Runtime)", "package": "AOTInductor package"}
COLUMNS = ["artifact", "device", "made in (s)", "served in (s)", "first: max diff",
           "second: max diff", "over the cap", "next", "result", "finished (s)", "notes"]
T0 = time.monotonic()


def say(*a):
    print(*a, flush=True)


def left(end):
    return end - time.monotonic()


class OutOfTime(Exception):
    """The row's share of the deadline ran out while `what`."""


class Interrupted(BaseException):
    """TERM or INT (a `timeout` around the whole check): the row in hand is written, what
    this process started is stopped, and it exits."""


MAKING = []  # the make child running now: its process group is ended with this process


def on_signal(signum, _frame):
    for proc in MAKING:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    raise Interrupted(signal.Signals(signum).name)


class Table:
    """`pt2.txt`: header lines at once, each row appended, flushed and synced as it ends."""

    def __init__(self, path, title):
        self.path = path
        self.write("w", [title, "| " + " | ".join(COLUMNS) + " |",
                         "|" + "---|" * len(COLUMNS)])

    def write(self, mode, lines):
        with open(self.path, mode) as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())

    def row(self, cells):
        cells = dict(cells, **{"finished (s)": f"{time.monotonic() - T0:.1f}"})
        text = "| " + " | ".join(str(cells.get(c, "-")).replace("|", "/") for c in COLUMNS) + " |"
        self.write("a", [text])
        say(text)


# ---- in a child process: the model, its eager answers, the artifact ------------------------

def internal_make(kind, work, device):
    """Makes `kind` of the MLP on `device` in `work` (`<kind>.pt2`) and the eager answers
    (`eager.json`); prints one JSON line: seconds, or why it failed. Runs in its own process
    group so that its whole tree (Inductor's compile, g++) can be stopped at the deadline."""
    import torch
    from torch.export import Dim

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 3)
    ).eval().to(device)
    with torch.no_grad():
        eager = {n: model(torch.tensor(r, dtype=torch.float32, device=device)).cpu().tolist()
                 for n, r in (("first", ROWS), ("second", SECOND))}
    with open(os.path.join(work, "eager.json"), "w") as f:
        json.dump(eager, f)
    t0 = time.monotonic()
    example = (torch.randn(2, 4, device=device),)
    program = torch.export.export(model, example, dynamic_shapes=({0: Dim("batch", max=MAX_ROWS)},))
    path = os.path.join(work, f"{kind}.pt2")
    out = {"path": path}
    try:
        if kind == "program":
            torch.export.save(program, path)
        else:
            torch._inductor.aoti_compile_and_package(program, package_path=path)
    except Exception as e:  # noqa: BLE001 - no compiler, no Triton: that row's FAIL
        first = str(e).splitlines()[0] if str(e) else ""
        out["error"] = f"the {kind} could not be made: {type(e).__name__}: {first}"
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
    return 0


def make(kind, work, device, env, end):
    """Runs internal_make in a child (its own session), stopped at `end`; its JSON answer."""
    args = [sys.executable, os.path.abspath(__file__), "--internal-make", kind, "--work", work,
            "--device", device]
    log = open(os.path.join(work, f"make-{kind}.log"), "w")
    # A TERM between the child's start and its place in MAKING would leave it compiling in
    # its own session: the signals wait until it is there (the child unblocks them).
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env, text=True,
                                start_new_session=True)
        MAKING.append(proc)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    try:
        out, _ = proc.communicate(timeout=max(0.1, left(end)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise OutOfTime(f"making the {kind}")
    finally:
        MAKING.remove(proc)
        log.close()
    for line in reversed(out.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            pass
    with open(os.path.join(work, f"make-{kind}.log"), errors="replace") as f:
        tail = f.read().strip().splitlines()[-3:]
    return {"error": f"making the {kind} failed (status {proc.returncode}): {' / '.join(tail)}"}


# ---- the server ----------------------------------------------------------------------------

def metadata(work, kind, model, gpu):
    meta = {
        "name": "pt2 check",
        "model": model,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        # batching pads a one-row batch to an AOTInductor package's two-row minimum
        "max_batch_size": 4,
    }
    if gpu:
        meta.update({"est_gpu_mem_min": 500, "est_gpu_mem_typ": 2000})
    path = os.path.join(work, f"{kind}-meta.json")
    with open(path, "w") as f:
        json.dump(meta, f)
    return path


def fields(log_path):
    """The server log's JSON events' fields (one event per line; other lines skipped)."""
    out = []
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                out.append(e.get("fields", e) if isinstance(e, dict) else {})
    except OSError:
        pass
    return out


class Server:
    """`app --production --workers 1` on one artifact; its log is the step's."""

    def __init__(self, binary, meta, log_path, env, cpu):
        args = [os.path.join(binary, "app"), "--production", "--workers", "1", "--port", "0",
                "--profile-memory", "off", "--metadata", meta, "--log-format", "json"]
        if cpu:
            args += ["--device", "cpu"]
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.port = None

    def state(self):
        """(port, {pid: device} of the ready workers, why no worker can come)."""
        ready, why = {}, None
        for f in fields(self.log_path):
            m = re.search(r"listening on https?://[^ ]*:(\d+)", str(f.get("message", "")))
            if m:
                self.port = int(m.group(1))
            if f.get("event") == "worker_ready":
                ready[f.get("pid")] = f.get("device")
            if f.get("event") == "worker_exited" and f.get("phase") == "booting":
                # exit 3 is a model that does not load: the next boot would fail the same way
                why = f"the worker exited while booting ({f.get('message', '')})"
        if self.proc.poll() is not None:
            why = f"app exited with status {self.proc.returncode}"
        return self.port, ready, why

    def wait_ready(self, end, not_pids=()):
        """(pid, device) of a ready worker not in `not_pids`, once there is one."""
        while True:
            port, ready, why = self.state()
            fresh = [(p, d) for p, d in ready.items() if p not in not_pids]
            if port and fresh:
                return fresh[-1]
            if why:
                raise RuntimeError(f"{why}; the log's last lines: {self.tail()}")
            if left(end) <= 0:
                raise OutOfTime("waiting for a worker to be ready")
            time.sleep(0.1)

    def allowed_mb(self):
        """The worker's allocator cap as the allocator reads it back (its load's line)."""
        got = None
        with open(self.log_path, errors="replace") as f:
            for line in f:
                if "CUDA allocator capped" in line:
                    m = re.search(r'allowed_mb"?[=:] ?(\d+)', line)
                    got = int(m.group(1)) if m else got
        return got

    def tail(self):
        with open(self.log_path, errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        return " / ".join(lines[-4:])[-1500:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def post(port, rows, end):
    """(status, answer or error text, worker pid)."""
    body = json.dumps({"inputs": rows}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body,
                                 headers={"Content-Type": "application/json"})
    timeout = min(60.0, left(end))
    if timeout <= 0:
        raise OutOfTime("before a request")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())["outputs"], r.headers.get("X-Worker-Pid")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:300], e.headers.get("X-Worker-Pid")
    except (TimeoutError, OSError) as e:
        if left(end) <= 0:
            raise OutOfTime("waiting for an answer") from e
        raise


def max_diff(a, b):
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return float("inf")
        return max((max_diff(x, y) for x, y in zip(a, b)), default=0.0)
    return abs(float(a) - float(b))


# ---- one row -------------------------------------------------------------------------------

def missing_for(kind, cpu):
    """What the package's compile needs and this machine lacks, or None."""
    if kind != "package":
        return None
    missing = []
    cxx = os.environ.get("CXX") or "g++"  # torch._inductor.config.cpp.cxx
    if not shutil.which(cxx):
        missing.append(f"no C++ compiler ({'CXX=' + cxx if os.environ.get('CXX') else 'g++ is not on PATH'};"
                       " AOTInductor compiles the package with it)")
    if not cpu:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        nvcc = shutil.which("nvcc")
        if not home and not nvcc and not os.path.isdir("/usr/local/cuda"):
            missing.append("no CUDA toolkit (CUDA_HOME and CUDA_PATH unset, no nvcc on PATH, no "
                           "/usr/local/cuda; a CUDA package is built against its headers)")
        elif home and not os.path.isdir(home):
            missing.append(f"no CUDA toolkit at CUDA_HOME/CUDA_PATH={home}")
    return "; ".join(missing) or None


def check(cells, a, srv, eager, tol, end, notes):
    """The four requests of one row; fills `cells`, appends what failed to `notes`."""
    status, out, pid = post(srv.port, ROWS, end)
    d = max_diff(out, eager["first"]) if status == 200 else None
    cells["first: max diff"] = f"{d:.2e}" if d is not None else f"status {status}"
    if d is None or d > tol:
        notes.append(f"first request: {status} {'' if d is None else f'diff {d:.2e}'} {out if d is None else ''}".strip())
    status, out, _ = post(srv.port, SECOND, end)
    d = max_diff(out, eager["second"]) if status == 200 else None
    cells["second: max diff"] = f"{d:.2e}" if d is not None else f"status {status}"
    if d is None or d > tol:
        notes.append(f"second request: {status} {out if d is None else f'diff {d:.2e}'}")
    if a.cpu:
        rows, want = DRY_LARGE_ROWS, 200
    else:
        cap = srv.allowed_mb()
        if cap is None or cap > 16384:
            notes.append(f"the worker's allocator cap is {cap} MiB: no request above it can be sent")
            return
        # one activation of 1.25 × the cap (HIDDEN floats a row), more than the cap alone
        rows, want = min(MAX_ROWS, (cap << 20) * 5 // 4 // (HIDDEN * 4) + 64), 507
    status, out, over_pid = post(srv.port, [[0.5, -0.5, 1.0, 2.0]] * rows, end)
    cells["over the cap"] = f"{rows} rows: {status}" + ("" if a.cpu else f" (cap {cap} MiB)")
    if status != want:
        notes.append(f"{rows} rows answered {status} (want {want}): {str(out)[:200]}")
    if want == 507 and status == 507:
        srv.wait_ready(end, not_pids={int(over_pid)} if over_pid else set())
    status, out, _ = post(srv.port, ROWS, end)
    d = max_diff(out, eager["first"]) if status == 200 else None
    cells["next"] = f"{status}" + ("" if d is None else f", diff {d:.2e}")
    if d is None or d > tol:
        notes.append(f"next request: {status} {out if d is None else f'diff {d:.2e}'}")


def one_row(kind, a, env, table, end):
    """Makes, serves and checks one artifact within `end`; writes its row; its result."""
    device = "cpu" if a.cpu else "cuda:0"
    tol = 1e-4
    cells, notes, srv = {"artifact": KINDS[kind], "device": "-"}, [], None
    result = "FAIL"
    try:
        why = missing_for(kind, a.cpu)
        if why:
            cells["notes"] = f"SKIP: {why}"
            result = "SKIP"
            return result
        made = make(kind, a.work, device, env, end)
        cells["made in (s)"] = f"{made.get('seconds', 0):.1f}"
        if made.get("error"):
            notes.append(made["error"])
            return result
        with open(os.path.join(a.work, "eager.json")) as f:
            eager = json.load(f)
        t0 = time.monotonic()
        meta = metadata(a.work, kind, made["path"], not a.cpu)
        srv = Server(a.bin, meta, os.path.join(a.work, f"app-{kind}.log"), env, a.cpu)
        _, on = srv.wait_ready(end)
        cells["served in (s)"], cells["device"] = f"{time.monotonic() - t0:.1f}", on
        if on != device:
            notes.append(f"the worker runs on {on}, not {device}")
        check(cells, a, srv, eager, tol, end, notes)
        result = "FAIL" if notes else "PASS"
    except OutOfTime as e:
        result = "TIME"
        notes.append(f"out of time: the row's share of the deadline ran out {e}")
    except Interrupted as e:
        notes.append(f"interrupted ({e})")
        raise
    except Exception as e:  # noqa: BLE001 - every other failure is this row's FAIL
        notes.append(f"{type(e).__name__}: {e}")
    finally:
        if srv is not None:
            srv.stop()
            notes.append(f"log {os.path.basename(srv.log_path)}")
        if result != "SKIP":
            cells["result"] = result
            cells["notes"] = "; ".join(notes)
        else:
            cells["result"] = "SKIP"
        table.row(cells)
    return result


# ---- before any row: can this machine run it? ----------------------------------------------

def cannot_run(a, table_path, why):
    say(f"pt2check: {why}")
    if table_path:
        table = Table(table_path, f"pt2check: cannot run here: {why}")
        for kind in a.kinds:
            table.row({"artifact": KINDS[kind], "result": "SKIP", "notes": f"cannot run here: {why}"})
    return 2


def preflight(a, table_path):
    """(env for the children, a one-line title) or raises SystemExit(2) naming what is missing."""
    for b in ("app", "app-worker"):
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            raise SystemExit(cannot_run(a, table_path, f"no {b} in {a.bin}"))
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(cannot_run(a, table_path, f"python3 ({sys.executable}) has no torch"))
    tdir = list(spec.submodule_search_locations)[0]
    try:
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]",
                      open(os.path.join(tdir, "version.py")).read(), re.M)
        version = m.group(1) if m else "unknown"
    except OSError:
        version = "unknown"
    wanted = None
    try:
        for line in open(os.path.join(a.bin, "BUILD")):
            if line.startswith("torch="):
                wanted = line.strip().split("=", 1)[1]
    except OSError:
        pass
    if wanted and version != wanted:
        raise SystemExit(cannot_run(a, table_path, f"python3's torch is {version}, but the binaries "
                                    f"were built against {wanted} (another C++ ABI or CUDA runtime)"))
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("VRAMFORK_") and k != "VRAMFORK_NVML_LIBRARY")}
    env["VRAMFORK_LEDGER"] = "off"  # each server plans alone
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    lib = os.path.join(tdir, "lib")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    if a.cpu:
        # CPU kernels take their OpenMP team from the worker, not from this machine's cores.
        env["TORCHINDUCTOR_CPP_DYNAMIC_THREADS"] = "1"
        return env, f"torch {version}; dry mode on the CPU (--cpu)", None
    sys.path.insert(0, HERE)
    from preflight import NvmlHold  # the NVML scripts/gpu-check's preflight finds and holds

    try:
        hold = NvmlHold()
        gpus = [g for g in hold.gpus() if g["visible"]]
    except RuntimeError as e:
        raise SystemExit(cannot_run(a, table_path, f"no NVIDIA GPU here (run with --cpu for the dry mode): {e}"))
    if not gpus:
        raise SystemExit(cannot_run(a, table_path, "no NVIDIA GPU here: NVML lists none that "
                                    f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} leaves"))
    env["VRAMFORK_NVML_LIBRARY"] = hold.path
    return env, f"torch {version}; GPU {gpus[0]['uuid']}; NVML {hold.path}", hold


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin")
    ap.add_argument("--out")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "vf-pt2-check"))
    ap.add_argument("--deadline", type=float, default=240.0)
    ap.add_argument("--only", choices=sorted(KINDS))
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--internal-make")
    ap.add_argument("--device")
    a = ap.parse_args()
    if a.internal_make:
        # started with TERM and INT blocked (see make): Inductor's workers need them
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        return internal_make(a.internal_make, a.work, a.device)
    if not a.bin or not a.out:
        ap.error("--bin and --out are required")
    end = T0 + a.deadline
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    a.kinds = [a.only] if a.only else ["program", "package"]
    os.makedirs(a.out, exist_ok=True)
    table_path = os.path.join(a.out, "pt2.txt")
    env, title, _hold = preflight(a, table_path)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    a.work = os.path.abspath(a.work)
    table = Table(table_path, f"pt2check: {title}; deadline {a.deadline:g} s")
    say(f"pt2check: preflight passed in {time.monotonic() - T0:.1f} s: {title}")
    results = []
    try:
        for i, kind in enumerate(a.kinds):
            last = i == len(a.kinds) - 1
            row_end = end if last else min(end, time.monotonic() + PROGRAM_SHARE * left(end))
            results.append(one_row(kind, a, env, table, row_end))
    except Interrupted:
        return 130
    return 1 if any(r in ("FAIL", "TIME") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
