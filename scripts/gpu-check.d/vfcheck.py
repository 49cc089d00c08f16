"""scripts/gpu-check's helper: models, NVML, HTTP, comparisons and log checks, one subcommand
per call (COMMANDS at the end). A comparison prints its one-line figure on stdout, the details
on stderr (the step's log), and exits 0 (as expected), 1 (not) or 3 (could not be checked
here). Standard library only, but torch where a command says so: it runs under the GPU
machine's python3, which has no other packages we can count on.

The pure functions (parse_*, log_events, device_verdict, visible_rows, plan_vs_smi, hw_check,
version_verdict, plan_follows_footprint, …) need neither a GPU nor torch.

NVML is read through ctypes (class Nvml), with the layouts of NVIDIA's nvml.h (as shipped by
nvml-wrapper-sys, rust-nvml/nvml-wrapper: nvmlMemory_t, whose `used` is "Sum of Reserved and
Allocated device memory"; nvmlProcessInfo_v2_t, which nvmlDeviceGetComputeRunningProcesses_v3
fills; NVML_VALUE_NOT_AVAILABLE = -1 for a size it does not know). The library is
$VRAMFORK_NVML_LIBRARY when set (the simulated NVML of tests/nvml-mock in the rehearsal), else
the driver's libnvidia-ml.so.1: the same one nvidia-smi and the master read. One process
polling NVML answers in microseconds; nvidia-smi is a new process each time, whose start-up
can take seconds without persistence mode.
"""
import ctypes
import json
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import http.client

GIB = float(1 << 30)
MIB = 1 << 20
# nvidia-smi --query-gpu fields, the name last (a name could hold a comma).
SMI_GPU_QUERY = "index,uuid,memory.total,memory.free,memory.used,name"
HW_ROUND = 0.006  # GiB: hwFetch prints 2 decimals (0.005) of figures nvidia-smi gives in MiB


def err(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- pure helpers -----------------------------------------------------------------------

def to_int(s):
    try:
        return int(float(s))
    except (TypeError, ValueError):
        return None


def parse_smi_gpus(text):
    """`nvidia-smi --query-gpu=SMI_GPU_QUERY --format=csv,noheader,nounits` -> dicts (MiB)."""
    out = []
    for line in text.splitlines():
        c = [x.strip() for x in line.split(",")]
        if len(c) < 6 or to_int(c[0]) is None:
            continue
        out.append({"index": to_int(c[0]), "uuid": c[1], "total": to_int(c[2]), "free": to_int(c[3]),
                    "used": to_int(c[4]), "name": ", ".join(c[5:])})
    return out


def visible_rows(rows, spec):
    """The GPUs of nvidia-smi's list (parse_smi_gpus) that CUDA_VISIBLE_DEVICES=spec lets a
    process use, by CUDA's rule as src/master/resources/visible.rs applies it to the plan: entries
    are indices (nvidia-smi's order) or unique GPU-… UUID prefixes; an empty value hides every
    GPU; the list ends at the first entry that names no GPU. MIG-… entries name no whole GPU
    here (nvidia-smi's --query-gpu lists whole GPUs only). None: no variable, every GPU."""
    if spec is None:
        return list(rows)
    keep = []
    for entry in [e.strip() for e in spec.split(",") if e.strip()]:
        if entry.isdigit():
            chosen = [r for r in rows if r["index"] == int(entry)]
        elif entry.startswith("GPU-") and len(entry) > 4:
            chosen = [r for r in rows if r["uuid"].startswith(entry)]
        else:
            chosen = []
        if len(chosen) != 1:
            break
        if chosen[0] not in keep:
            keep.append(chosen[0])
    return keep


HW_RE = re.compile(r"^(?P<name>.+), (?P<total>[0-9.]+) GiB total, (?P<avail>[0-9.]+) GiB available, "
                   r"(?P<peak>[0-9.]+) GiB peak used$")


def parse_hwfetch(line):
    """'NVIDIA H100 80GB HBM3, 79.19 GiB total, 75.02 GiB available, 1.23 GiB peak used' -> dict."""
    m = HW_RE.match(line.strip()) if isinstance(line, str) else None
    if not m:
        return None
    return {"name": m["name"], "total": float(m["total"]), "avail": float(m["avail"]),
            "peak": float(m["peak"])}


READY_EVENT = re.compile(r'\bevent="?worker_ready\b')
READY_MSG = re.compile(r"\bworker \d+ \(pid (\d+), generation \d+\) ready in ")
PID_FIELD = re.compile(r"(?:^|[\s{,])pid=(\d+)")
DEVICE_FIELD = re.compile(r'\bdevice=(?:"([^"]*)"|([^\s,}]+))')
LOADED_MSG = re.compile(r"\bmodel loaded\b")


def _device(m):
    return None if not m else (m.group(1) if m.group(1) is not None else m.group(2))


def log_events(lines):
    """A server log (text, or --log-format json) -> (ready, loaded): ready = [(pid, device or
    None)] per worker_ready event; loaded = {pid: device} from the workers' 'model loaded'."""
    ready, loaded = [], {}
    for line in lines:
        line = line.rstrip("\n")
        if line.lstrip().startswith("{"):
            try:
                j = json.loads(line)
            except ValueError:
                j = None
            if isinstance(j, dict):
                f = j.get("fields") if isinstance(j.get("fields"), dict) else {}
                span = j.get("span") if isinstance(j.get("span"), dict) else {}
                if f.get("event") == "worker_ready":
                    ready.append((to_int(f.get("pid")), f.get("device")))
                elif f.get("message") == "model loaded":
                    loaded[to_int(span.get("pid", f.get("pid")))] = f.get("device")
                continue
        if READY_EVENT.search(line) or READY_MSG.search(line):
            m = PID_FIELD.search(line) or READY_MSG.search(line)
            ready.append((to_int(m.group(1)) if m else None, _device(DEVICE_FIELD.search(line))))
        elif LOADED_MSG.search(line):
            m = PID_FIELD.search(line)
            loaded[to_int(m.group(1)) if m else None] = _device(DEVICE_FIELD.search(line))
    return ready, loaded


READY_MS = re.compile(r"\bready in (\d+(?:\.\d+)?) ms\b")


def boot_seconds(lines):
    """Each worker's boot, in seconds, from its worker_ready event (`ms`: started to ready):
    a fresh CUDA process's start shows here (a GPU re-initialised for each one would add
    seconds to every boot)."""
    out = []
    for line in lines:
        line = line.rstrip("\n")
        if line.lstrip().startswith("{"):
            try:
                f = (json.loads(line).get("fields") or {})
            except (ValueError, AttributeError):
                continue
            if f.get("event") == "worker_ready" and isinstance(f.get("ms"), (int, float)):
                out.append(f["ms"] / 1e3)
            continue
        m = READY_MS.search(line)
        if m and (READY_EVENT.search(line) or READY_MSG.search(line)):
            out.append(float(m.group(1)) / 1e3)
    return out


def device_verdict(ready, loaded, simulated=False):
    """(ok, text) for workers placed on a GPU: each must report a cuda device (in a rehearsal
    on the simulated NVML, 'cpu (simulated GPU)'). worker_ready's device= is used where the
    build logs it, else the worker's own 'model loaded' line."""
    if not ready and not loaded:
        return True, ""
    if any(d for _, d in ready):
        devs, how = [(p, d) for p, d in ready if d], "worker_ready device="
    else:
        devs = [(p, d) for p, d in loaded.items() if d]
        if not devs:
            return True, "worker device not reported by this build"
        how = "their 'model loaded' lines"
    want = "a simulated GPU" if simulated else "cuda"
    good = (lambda d: "simulated GPU" in d) if simulated else (lambda d: str(d).startswith("cuda"))
    bad = [(p, d) for p, d in devs if not good(str(d))]
    if bad:
        return False, f"workers placed on a GPU, not on {want}: " + ", ".join(
            f"pid {p} device={d}" for p, d in bad[:4]) + f" ({how})"
    return True, f"{len(devs)}/{len(devs)} workers on {want} ({how})"


def cap_failures(lines):
    """'could not cap' (a warning of older builds) or 'cannot cap the CUDA allocator' (a load
    error of newer ones): the allocator ran, or would have run, without its cap."""
    return [l.rstrip("\n") for l in lines if "could not cap" in l or "cannot cap the CUDA allocator" in l]


def version_verdict(found, found_cuda, expected):
    """python3's torch against the one the worker was built with: (ok, text). Exact: another
    release is another C++ ABI for tch 0.24, another +cuXYZ another CUDA runtime."""
    if found == expected:
        return True, f"python3's torch is {found} (torch.version.cuda {found_cuda}), as the build's"
    return False, (f"refused: python3's torch is {found or 'not importable'} (torch.version.cuda "
                   f"{found_cuda}), but app-worker was built against {expected}; its lib/ would give "
                   f"the worker another libtorch ABI or CUDA runtime, so it is not put on LD_LIBRARY_PATH. "
                   f"Run with a python3 whose torch is {expected}")


def plan_vs_smi(plan, before, after, smi_driver=None, cvd=None):
    """`app plan --json` against nvidia-smi read just before and just after it: (ok, details,
    figure). Only the GPUs CUDA_VISIBLE_DEVICES=cvd leaves the plan are compared (the others
    are listed as hidden). Whole GPUs by UUID: name; total within 1 MiB; free within what
    nvidia-smi read around it (±2 MiB rounding); usable = min(total × fraction, free) −
    reserve from those readings; fits = usable // per-worker MB; workers = min(cpu bound,
    Σ fits). MIG instances are only matched to their GPU (nvidia-smi's whole-GPU figures do
    not apply)."""
    ok, out, figs = True, [], []
    b_by, a_by = {g["uuid"]: g for g in before}, {g["uuid"]: g for g in after}
    visible = visible_rows(before, cvd)
    hidden = [g for g in before if g not in visible]
    if hidden:
        out.append(f"CUDA_VISIBLE_DEVICES={cvd} hides " + ", ".join(
            f"GPU {g['index']} ({g['uuid']})" for g in hidden) + ": not compared")
    pg = plan.get("gpus") or []
    plan_uuids = {g.get("uuid") for g in pg}
    mig_parents = {g["mig"].get("parent") for g in pg if isinstance(g.get("mig"), dict)}
    for s in visible:
        if s["uuid"] not in plan_uuids and s["index"] not in mig_parents:
            ok = False
            out.append(f"MISMATCH: nvidia-smi lists GPU {s['index']} ({s['uuid']}), the plan does not")
    per = plan.get("est_gpu_mem_typ") or 0
    reserve = plan.get("reserve_mb")
    lo_sum = hi_sum = 0
    for g in pg:
        uuid, label = g.get("uuid", ""), g.get("label") or f"GPU {g.get('index')}"
        if isinstance(g.get("mig"), dict) or uuid.startswith("MIG-"):
            out.append(f"{label} ({uuid}): a MIG instance, planned {g.get('fits')} workers; not compared")
            lo_sum += g.get("fits") or 0
            hi_sum += g.get("fits") or 0
            continue
        b, a = b_by.get(uuid), a_by.get(uuid)
        if not b or not a:
            ok = False
            out.append(f"MISMATCH: the plan's {label} ({uuid}) is not in nvidia-smi's list")
            continue
        if b not in visible:
            ok = False
            out.append(f"MISMATCH: the plan uses {label} ({uuid}), which CUDA_VISIBLE_DEVICES={cvd} hides")
        lo, hi = min(b["free"], a["free"]), max(b["free"], a["free"])
        checks = [("name", g.get("name") == b["name"], f"plan {g.get('name')!r}, nvidia-smi {b['name']!r}"),
                  ("total", abs((g.get("total_mb") or 0) - b["total"]) <= 1,
                   f"plan {g.get('total_mb')} MiB, nvidia-smi {b['total']} MiB"),
                  ("free", lo - 2 <= (g.get("free_mb") or 0) <= hi + 2,
                   f"plan {g.get('free_mb')} MiB, nvidia-smi {lo}..{hi} MiB just before and after")]
        frac = g.get("fraction")
        fit_txt = ""
        if frac is not None and reserve is not None and g.get("usable_mb") is not None:
            cap = int((g.get("total_mb") or 0) * frac)
            ulo, uhi = max(0, min(cap, lo) - reserve), max(0, min(cap, hi) - reserve)
            checks.append(("usable", ulo - 2 <= g["usable_mb"] <= uhi + 2,
                           f"plan {g['usable_mb']} MiB, from nvidia-smi {ulo}..{uhi} MiB "
                           f"(min({g.get('total_mb')} × {frac}, free) − reserve {reserve})"))
            if per and plan.get("mode") in (None, "gpu_memory", "GpuMemory") and g.get("fits") is not None:
                flo, fhi = max(0, ulo - 2) // per, (uhi + 2) // per
                admit = (plan.get("est_gpu_mem_min") or 0) + reserve  # less free: no worker
                if hi < admit:
                    flo = fhi = 0
                elif lo < admit:
                    flo = 0
                mode = g.get("compute_mode", "default")
                if mode in ("exclusive_process", "exclusive_thread"):
                    flo, fhi = min(flo, 1), min(fhi, 1)
                elif mode == "prohibited":
                    flo = fhi = 0
                if g.get("excluded") and g.get("fits") == 0 and flo > 0:
                    checks.append(("fits", False, f"plan excludes it ({g['excluded']}), nvidia-smi's figures give {flo}"))
                else:
                    checks.append(("fits", flo <= g["fits"] <= fhi,
                                   f"plan {g['fits']}, nvidia-smi's figures give {flo}..{fhi} at {per} MiB per worker"))
                lo_sum += flo
                hi_sum += fhi
                fit_txt = f", fits {g['fits']} × {per} MiB"
        for what, good, text in checks:
            out.append(f"{label}: {what}: {text}: {'ok' if good else 'MISMATCH'}")
            ok &= good
        figs.append(f"{label} {b['name']}: free {g.get('free_mb')} MiB (nvidia-smi {lo}..{hi}), "
                    f"usable {g.get('usable_mb')} MiB{fit_txt}")
    if not pg and visible:
        figs.append("the plan has no GPU")
    workers, cpu_bound = plan.get("workers"), plan.get("cpu_bound")
    if cpu_bound is not None and workers is not None and plan.get("source") in (None, "plan") and per:
        elo, ehi = min(cpu_bound, lo_sum), min(cpu_bound, hi_sum)
        good = elo <= workers <= ehi
        out.append(f"workers: plan {workers}, min(cpu bound {cpu_bound}, Σ fits {lo_sum}..{hi_sum}) = "
                   f"{elo}..{ehi}: {'ok' if good else 'MISMATCH'}")
        ok &= good
    pdrv = plan.get("driver_version")
    if pdrv and smi_driver:
        good = pdrv == smi_driver
        out.append(f"driver: plan {pdrv}, nvidia-smi {smi_driver}: {'ok' if good else 'MISMATCH'}")
        ok &= good
    figure = "; ".join(figs) + f"; plan {workers} workers (cpu bound {cpu_bound}, gpu bound {plan.get('gpu_bound')})"
    if hidden:
        figure += f"; {len(hidden)} GPU(s) hidden by CUDA_VISIBLE_DEVICES, not compared"
    if not ok:
        figure += "; MISMATCH: " + "; ".join(l for l in out if "MISMATCH" in l)
    return ok, out, figure


def hw_check(hw, smi_row, free_lo, free_hi, param_bytes, torch_peak, proc_mib):
    """A parsed hwFetch line against nvidia-smi's row for the worker's GPU (free read just
    before and after the request), the model's weights, torch's own peak allocated bytes for
    the same model and input (within 10 %), and the worker's own GPU memory (None: unknown).
    Returns (state, details, figure), state 'ok', 'fail' or 'partial' (all but the
    per-process check passed)."""
    out, ok = [], True
    t = smi_row["total"] / 1024
    checks = [("name", hw["name"] == smi_row["name"], f"{hw['name']!r} vs nvidia-smi {smi_row['name']!r}"),
              ("total", abs(hw["total"] - t) <= HW_ROUND, f"{hw['total']} GiB vs nvidia-smi {t:.3f}"),
              ("available", free_lo / 1024 - HW_ROUND <= hw["avail"] <= free_hi / 1024 + HW_ROUND,
               f"{hw['avail']} GiB vs nvidia-smi free {free_lo / 1024:.3f}..{free_hi / 1024:.3f}"),
              ("peak covers the weights", hw["peak"] >= param_bytes / GIB - HW_ROUND,
               f"{hw['peak']} GiB vs weights {param_bytes / GIB:.3f}")]
    if torch_peak:
        tp = torch_peak / GIB
        checks.append(("peak near torch's own", abs(hw["peak"] - tp) <= max(0.1 * tp, HW_ROUND),
                       f"{hw['peak']} GiB vs torch's max_memory_allocated {tp:.3f} (10 %)"))
    if proc_mib is not None:
        checks.append(("peak within the process", hw["peak"] <= proc_mib / 1024 + HW_ROUND,
                       f"{hw['peak']} GiB vs NVML's {proc_mib} MiB for the worker"))
    for what, good, text in checks:
        out.append(f"{what}: {text}: {'ok' if good else 'MISMATCH'}")
        ok &= good
    fig = (f"{hw['total']} GiB total (smi {t:.2f}), {hw['avail']} available (smi free "
           f"{free_lo / 1024:.2f}..{free_hi / 1024:.2f}), {hw['peak']} peak (torch {torch_peak / GIB:.2f}"
           f"{'' if proc_mib is None else f', process {proc_mib / 1024:.2f}'})")
    if not ok:
        return "fail", out, fig + "; MISMATCH: " + "; ".join(l for l in out if l.endswith("MISMATCH"))
    return ("ok" if proc_mib is not None else "partial"), out, fig


def get_path(doc, path):
    """doc['a'][0]['b'] for 'a.0.b'; None when absent."""
    for k in path.split("."):
        if isinstance(doc, list) and k.isdigit() and int(k) < len(doc):
            doc = doc[int(k)]
        elif isinstance(doc, dict) and k in doc:
            doc = doc[k]
        else:
            return None
    return doc


def cap_of(plan):
    """(index, uuid, cap MiB, how) of the first placed worker: the plan's cap_mb where the build
    gives it, else memory_fraction × the GPU's total."""
    a = get_path(plan, "placement.0.gpu")
    if not isinstance(a, dict):
        return None
    g = next((g for g in plan.get("gpus", []) if g.get("uuid") == a.get("uuid")), {})
    if a.get("cap_mb"):
        return a.get("index"), a.get("uuid"), int(a["cap_mb"]), "cap_mb"
    frac = a.get("memory_fraction") or g.get("memory_fraction")
    if frac and g.get("total_mb"):
        return a.get("index"), a.get("uuid"), int(frac * g["total_mb"]), f"memory_fraction {frac:.4f} × {g['total_mb']} MiB"
    return None


def plan_follows_footprint(doc):
    """`app plan --measure --json`: whether the plan follows from its own measured footprint
    (two separate measurements may straddle a `fits` boundary, so worker
    counts are never compared across runs): per worker = max(footprint × headroom,
    est_gpu_mem_min) (within 1 MiB: rounding), each GPU's fits = usable // per, the GPU bound
    their sum, workers the least of the bounds. (ok, text)."""
    plan = doc.get("plan") if isinstance(doc.get("plan"), dict) else doc
    per, fp, head = plan.get("est_gpu_mem_typ"), get_path(doc, "measured.footprint_mb"), doc.get("headroom")
    if not per or fp is None:
        return False, f"no footprint or per-worker figure (footprint {fp}, est_gpu_mem_typ {per})"
    problems = []
    if isinstance(head, (int, float)):
        want_per = max(fp * head, plan.get("est_gpu_mem_min") or 0)
        if abs(per - want_per) > 1:
            problems.append(f"per worker {per} MiB, not max({fp} × {head}, est_gpu_mem_min) = {want_per:.0f}")
    fits = 0
    for g in plan.get("gpus") or []:
        if g.get("usable_mb") is None or g.get("fits") is None:
            continue
        f = g["usable_mb"] // max(per, (plan.get("cuda_context_mb") or 0) + 64)
        mode = g.get("compute_mode", "default")
        if mode in ("exclusive_process", "exclusive_thread"):
            f = min(f, 1)
        elif mode == "prohibited" or g.get("excluded"):
            f = 0
        if g["fits"] != f:
            problems.append(f"{g.get('label')}: fits {g['fits']}, its figures give {f}")
        fits += g["fits"]
    if plan.get("gpu_bound") is not None and plan["gpu_bound"] != fits:
        problems.append(f"gpu bound {plan['gpu_bound']}, Σ fits {fits}")
    bounds = {k: v for k, v in plan.items() if k.endswith("_bound") and isinstance(v, int)}
    got = plan.get("workers")
    if bounds and got != min(bounds.values()):
        problems.append(f"workers {got}, the least bound is {min(bounds.values())} ({bounds})")
    text = (f"footprint {fp} MiB -> {per} MiB a worker, {got} workers "
            f"({', '.join(f'{k} {v}' for k, v in bounds.items())})")
    return not problems, text + ("; MISMATCH: " + "; ".join(problems) if problems else "")


# ---- NVML ---------------------------------------------------------------------------------

NVML_NOT_AVAILABLE = (1 << 64) - 1
NVML_INSUFFICIENT_SIZE = 7


class Memory(ctypes.Structure):  # nvmlMemory_t (v1): used = reserved + allocated
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_v2_t, filled by ..._v3
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    """The few NVML calls the checks need; whole GPUs (MIG instances through their parent,
    whose process list is the aggregate, as nvml.h documents for a privileged caller)."""

    CANDIDATES = ("libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
                  "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1")

    def __init__(self):
        given = os.environ.get("VRAMFORK_NVML_LIBRARY")
        last = None
        for name in ([given] if given else self.CANDIDATES):
            try:
                self.lib = ctypes.CDLL(name)
                self.path = name
                break
            except OSError as e:
                last = e
        else:
            raise RuntimeError(f"cannot load NVML: {last}")
        L, P, U = self.lib, ctypes.c_void_p, ctypes.c_uint
        L.nvmlDeviceGetHandleByIndex_v2.argtypes = [U, ctypes.POINTER(P)]
        L.nvmlDeviceGetUUID.argtypes = [P, ctypes.c_char_p, U]
        L.nvmlDeviceGetName.argtypes = [P, ctypes.c_char_p, U]
        L.nvmlDeviceGetMemoryInfo.argtypes = [P, ctypes.POINTER(Memory)]
        L.nvmlDeviceGetComputeRunningProcesses_v3.argtypes = [P, ctypes.POINTER(U), ctypes.POINTER(ProcessInfo)]
        self.check(L.nvmlInit_v2(), "nvmlInit_v2")

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: NVML error {rc}")

    def handles(self):
        n = ctypes.c_uint(0)
        self.check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), "nvmlDeviceGetCount_v2")
        out = []
        for i in range(n.value):
            h = ctypes.c_void_p()
            self.check(self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)), "nvmlDeviceGetHandleByIndex_v2")
            out.append(h)
        return out

    def text(self, fn, h):
        buf = ctypes.create_string_buffer(96)  # NVML_DEVICE_UUID_V2_BUFFER_SIZE, ..._NAME_V2_...
        self.check(fn(h, buf, 96), fn.__name__)
        return buf.value.decode(errors="replace")

    def gpu(self, i, h):
        m = Memory()
        self.check(self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), "nvmlDeviceGetMemoryInfo")
        return {"index": i, "uuid": self.text(self.lib.nvmlDeviceGetUUID, h),
                "name": self.text(self.lib.nvmlDeviceGetName, h),
                "total": m.total // MIB, "free": m.free // MIB, "used": m.used // MIB}

    def processes(self, h):
        """[(pid, used MiB or None)] of the device's compute processes."""
        for _ in range(5):  # the list can grow between the two calls
            n = ctypes.c_uint(0)
            rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), None)
            if rc == 0 and n.value == 0:
                return []
            if rc not in (0, NVML_INSUFFICIENT_SIZE):
                self.check(rc, "nvmlDeviceGetComputeRunningProcesses_v3")
            room = n.value + 8
            arr = (ProcessInfo * room)()
            n = ctypes.c_uint(room)
            rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), arr)
            if rc == NVML_INSUFFICIENT_SIZE:
                continue
            self.check(rc, "nvmlDeviceGetComputeRunningProcesses_v3")
            return [(p.pid, None if p.usedGpuMemory == NVML_NOT_AVAILABLE else p.usedGpuMemory // MIB)
                    for p in arr[:n.value]]
        raise RuntimeError("nvmlDeviceGetComputeRunningProcesses_v3: the list kept growing")

    def processes_or_empty(self, h):
        """processes(h), or [] where NVML refuses to list them (some sandboxes): the caller
        then falls back to the GPU's used memory."""
        try:
            return self.processes(h)
        except RuntimeError as e:
            err(f"NVML lists no processes here: {e}")
            return []

    def by_uuid(self, uuid):
        """(gpu dict, handle) of the whole GPU with this UUID; None when there is none (a MIG
        UUID, or a GPU NVML does not list)."""
        for i, h in enumerate(self.handles()):
            if self.text(self.lib.nvmlDeviceGetUUID, h) == uuid:
                return self.gpu(i, h), h
        return None


# ---- processes (no ps: slim images lack it) -------------------------------------------------

def proc_stat(pid):
    """(state, ppid) from /proc/<pid>/stat; None when gone. The command name may hold spaces
    and parentheses, so the fields are read after its last ')'."""
    try:
        s = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    f = s[s.rfind(")") + 2:].split()
    return f[0], int(f[1])


def alive(pid):
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def descendants(root):
    """Every live process under root (children, their children, …), from /proc."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st and st[0] not in ("Z", "X"):
                parent[int(d)] = st[1]
    out, todo = [], [int(root)]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return sorted(out)


def visible_devices(pid):
    """The CUDA_VISIBLE_DEVICES a process was started with (None: unset or unreadable)."""
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(b"CUDA_VISIBLE_DEVICES="):
            return e.split(b"=", 1)[1].decode()
    return None


def ours_on(nv, h, master):
    """{pid: MiB or None} of NVML's processes on handle h that are the master or under it."""
    mine = set(descendants(master)) | {int(master)}
    return {p: u for p, u in nv.processes(h) if p in mine}


# ---- commands -------------------------------------------------------------------------------

def cmd_torch_info(out_file):
    """torch as this python3 sees it, as JSON in out_file: version, CUDA, lib/ folder, devices."""
    info = {"version": None, "cuda": None, "lib": None, "cuda_available": False, "devices": []}
    try:
        import torch
        info.update(version=torch.__version__, cuda=torch.version.cuda,
                    lib=os.path.join(os.path.dirname(torch.__file__), "lib"))
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                info["devices"].append(f"cuda:{i}: {p.name}, {p.total_memory / GIB:.2f} GiB")
    except Exception as e:  # an import error is a finding, not a crash
        info["error"] = repr(e)
    json.dump(info, open(out_file, "w"), indent=1)
    err(json.dumps(info))
    return 0


def cmd_version_check(info_file, expected):
    info = json.load(open(info_file))
    ok, text = version_verdict(info.get("version"), info.get("cuda"), expected)
    print(text)
    return 0 if ok else 1


def cmd_nvml_gpus():
    """Every GPU NVML lists, with its compute processes (the environment record)."""
    nv = Nvml()
    print(f"NVML library: {nv.path}")
    for i, h in enumerate(nv.handles()):
        g = nv.gpu(i, h)
        g["processes"] = nv.processes_or_empty(h)
        print(json.dumps(g))
    return 0


def cmd_gpu_of(pid, plan_file=""):
    """The UUID of the GPU a worker was given: its CUDA_VISIBLE_DEVICES, else the plan's."""
    u = visible_devices(int(pid))
    if not u and plan_file:
        u = get_path(json.load(open(plan_file)), "placement.0.gpu.uuid")
    print(u or "")
    return 0 if u else 1


def cmd_ours(master):
    print(" ".join(map(str, descendants(int(master)))))
    return 0


def cmd_gpu_memory(uuid):
    """'<used MiB> <free MiB>' of one whole GPU (never summed over GPUs)."""
    got = Nvml().by_uuid(uuid)
    if not got:
        err(f"NVML lists no whole GPU {uuid}")
        return 3
    print(got[0]["used"], got[0]["free"])
    return 0


def cmd_probe(uuid, master, worker_pid, limit="10"):
    """Whether NVML lists the worker on its GPU, and its figure. NVML's list can lag behind a
    new context, so it is read until the worker shows or `limit` seconds pass. Prints JSON:
    visible, worker_mib, ours {pid: MiB}, gpu_used, foreign."""
    nv = Nvml()
    got = nv.by_uuid(uuid)
    if not got:
        print(json.dumps({"error": f"NVML lists no whole GPU {uuid} (a MIG instance?)"}))
        return 3
    h = got[1]
    end = time.monotonic() + float(limit)
    while True:
        procs = dict(nv.processes_or_empty(h))
        mine = set(descendants(int(master))) | {int(master)}
        ours = {p: u for p, u in procs.items() if p in mine}
        if int(worker_pid) in procs or time.monotonic() > end:
            break
        time.sleep(0.1)
    res = {"visible": int(worker_pid) in procs, "worker_mib": procs.get(int(worker_pid)),
           "ours": {str(k): v for k, v in ours.items()}, "master_listed": int(master) in procs,
           "gpu_used": nv.gpu(got[0]["index"], h)["used"],
           "foreign": sorted(p for p in procs if p not in mine)}
    print(json.dumps(res))
    return 0


def cmd_until(uuid, master, mode, at_most, limit):
    """Waits until our GPU memory is at most `at_most` MiB: mode 'pids' = the sum of NVML's
    figures for the master and every process under it, 'gpu' = the GPU's used memory (where
    NVML cannot see our pids). Prints '<seconds> <MiB>'; exit 1 when `limit` s pass first."""
    nv = Nvml()
    got = nv.by_uuid(uuid)
    if not got:
        err(f"NVML lists no whole GPU {uuid}")
        return 3
    i, h = got[0]["index"], got[1]
    t0, at_most = time.monotonic(), int(at_most)
    while True:
        if mode == "pids":
            v = sum(u or 0 for u in ours_on(nv, h, master).values())
        else:
            v = nv.gpu(i, h)["used"]
        dt = time.monotonic() - t0
        if v <= at_most:
            print(f"{dt:.2f} {v}")
            return 0
        if dt > float(limit):
            print(f"{dt:.2f} {v}")
            return 1
        time.sleep(0.05)


def cmd_kill9(master, uuid, mode, at_most, limit):
    """kill -9 of the master, sent and timed from this one process: it
    reads our pids first (the master and everything under it), kills, then polls /proc and
    NVML every 10 ms until every one of them is gone and none holds GPU memory (mode 'pids':
    no pid of ours in NVML's list; 'gpu': the GPU's used memory at most `at_most` MiB).
    Prints JSON: workers_gone_s, gpu_free_s (null: not within `limit`), polls, before."""
    nv = Nvml()
    got = nv.by_uuid(uuid)
    if not got:
        print(json.dumps({"error": f"NVML lists no whole GPU {uuid}"}))
        return 3
    i, h = got[0]["index"], got[1]
    handles = nv.handles()
    mine = set(descendants(int(master))) | {int(master)}
    before = {p: u for hh in handles for p, u in nv.processes_or_empty(hh) if p in mine}
    used_before = nv.gpu(i, h)["used"]
    res = {"pids": sorted(mine), "before": {str(k): v for k, v in before.items()}, "used_before": used_before,
           "workers_gone_s": None, "gpu_free_s": None, "polls": 0, "mode": mode}
    t0 = time.monotonic()
    os.kill(int(master), signal.SIGKILL)
    while time.monotonic() - t0 < float(limit):
        dt = time.monotonic() - t0
        res["polls"] += 1
        if res["workers_gone_s"] is None and not any(alive(p) for p in mine):
            res["workers_gone_s"] = round(dt, 3)
        if res["gpu_free_s"] is None:
            if mode == "pids":  # on every GPU: a worker may have gone to another
                held = [p for hh in handles for p, _ in nv.processes(hh) if p in mine]
                free = not held
            else:
                res["used_now"] = nv.gpu(i, h)["used"]
                free = res["used_now"] <= int(at_most)
            if free:
                res["gpu_free_s"] = round(dt, 3)
        if res["workers_gone_s"] is not None and res["gpu_free_s"] is not None:
            break
        time.sleep(0.01)
    res["left"] = [p for p in mine if alive(p)]
    print(json.dumps(res))
    return 0


# What torch 2.11's C10_CUDA_CHECK raises for a failed CUDA call (c10_cuda_check_implementation,
# read from its libc10_cuda.so with `strings`): "CUDA error: " + cudaGetErrorString, the
# "Search for `<cudaGetErrorName>'" help, the asynchronous-report suffix, the
# CUDA_LAUNCH_BLOCKING hint and, in a build without device-side assertions, the
# TORCH_USE_CUDA_DSA line. Here for cudaErrorInvalidConfiguration, whose words are
# libcudart.so.13's. A worker must answer with the first line (the error), not the last (a hint).
CUDA_ERROR_NAME, CUDA_ERROR_WORDS = "cudaErrorInvalidConfiguration", "invalid configuration argument"
CUDA_ERROR_TEXT = (
    f"CUDA error: {CUDA_ERROR_WORDS}\n"
    f"Search for `{CUDA_ERROR_NAME}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html "
    "for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def error_names_cuda_error(resp_file):
    """(ok, text): the 500's error names the CUDA error (its words), not only a hint line of
    libtorch's text (TORCH_USE_CUDA_DSA, CUDA_LAUNCH_BLOCKING)."""
    try:
        body = json.load(open(resp_file))
    except (OSError, ValueError) as e:
        return False, f"no JSON answer: {e}"
    e = body.get("error") if isinstance(body, dict) else None
    e = e.get("message", json.dumps(e)) if isinstance(e, dict) else str(e)
    if CUDA_ERROR_WORDS in e:
        return True, f"the error names it ({CUDA_ERROR_WORDS!r})"
    hint = next((h for h in ("TORCH_USE_CUDA_DSA", "CUDA_LAUNCH_BLOCKING", "asynchronously reported") if h in e), None)
    return False, (f"the error does not name the CUDA error ({CUDA_ERROR_WORDS!r})"
                   + (f"; it gives libtorch's hint line instead ({hint})" if hint else "") + f": {e[:200]!r}")


def cmd_error_names(resp_file):
    ok, text = error_names_cuda_error(resp_file)
    print(text)
    return 0 if ok else 1


def make_models(work, width, layers):
    import torch
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(4, 8)
            self.l2 = torch.nn.Linear(8, 3)

        def forward(self, x):
            x = x.to(self.l1.weight.device)
            return self.l2(torch.relu(self.l1(x))).cpu()

    class Big(torch.nn.Module):
        """`layers` layers of width × width float32; [-1, width] -> [-1, 8]."""

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            x = x.to(self.anchor.device)
            for layer in self.layers:
                x = torch.tanh(layer(x) * 0.01)
            return x[:, :8].cpu()

    class Alloc(torch.nn.Module):
        """[[mb]] -> allocates that many MiB on the model's device. Its buffer is on the GPU
        from the load on, so the caching allocator exists when the worker sets its cap."""

        def __init__(self):
            super().__init__()
            self.register_buffer("anchor", torch.ones(1))

        def forward(self, x):
            mb = int(x.flatten()[0].item())
            t = torch.ones(mb * 1024 * 256, dtype=torch.float32, device=self.anchor.device)
            return (t.sum() / (1024 * 256) * self.anchor).reshape(1, 1).cpu()

    class Cnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 32, 3, padding=1)
            self.c2 = torch.nn.Conv2d(32, 64, 3, padding=1)
            self.c3 = torch.nn.Conv2d(64, 128, 3, padding=1)
            self.fc = torch.nn.Linear(128, 10)

        def forward(self, x):
            x = x.to(self.c1.weight.device)
            x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
            x = torch.max_pool2d(torch.relu(self.c2(x)), 2)
            x = torch.relu(self.c3(x)).mean(dim=(2, 3))
            return self.fc(x).cpu()

    class CudaErr(torch.nn.Module):
        """[-1, 4]: after work on the model's device, a row starting with 7 raises libtorch's
        whole text for a CUDA error that leaves the context usable (cudaErrorInvalidConfiguration;
        CUDA_ERROR_TEXT), so the worker answers it alone and checks its device; else x * 2 + 1."""

        def __init__(self):
            super().__init__()
            self.register_buffer("anchor", torch.ones(1))
            self.message = CUDA_ERROR_TEXT

        def forward(self, x):
            x = x.to(self.anchor.device) * self.anchor
            if bool((x[:, 0] == 7).any()):
                raise RuntimeError(self.message)
            return (x * 2 + 1).cpu()

    p = lambda f: os.path.join(work, f)
    torch.manual_seed(0)
    # Saved from the device they run on: a plain torch::jit::load (forward-loop) puts them
    # back there, and each moves its input to its weights and its output to the CPU, so the
    # model's own loop and a worker do the same copies. Workers load them onto their GPU
    # anyway (map_location).
    with torch.no_grad():
        for name, cls in (("mlp.pt", Mlp), ("big.pt", Big), ("alloc.pt", Alloc), ("cnn.pt", Cnn),
                          ("cudaerr.pt", CudaErr)):
            torch.jit.script(cls().to(dev).eval()).save(p(name))
    json.dump({"inputs": [[1.0, 2.0, 3.0, 4.0]]}, open(p("mlp.json.in"), "w"))
    json.dump({"inputs": [[0.5] * width]}, open(p("big.json.in"), "w"))
    json.dump({"inputs": torch.rand(1, 3, 64, 64).round(decimals=3).tolist()}, open(p("cnn.json.in"), "w"))
    for f in ("mlp.pt", "big.pt", "alloc.pt", "cnn.pt", "cudaerr.pt"):
        err(f, os.path.getsize(p(f)), "bytes")
    return cuda


def cmd_models(work, width, layers):
    """Makes the models with this machine's torch. Exit 0 with CUDA (alloc.pt checked on it),
    3 without (the models are made on the CPU; a rehearsal needs no more)."""
    cuda = make_models(work, int(width), int(layers))
    if not cuda:
        err("torch sees no CUDA device: the models were made on the CPU")
        return 3
    import torch
    # alloc.pt as a worker loads it: its buffer must land on the GPU.
    m = torch.jit.load(os.path.join(work, "alloc.pt"), map_location="cuda")
    dev = m.anchor.device
    out = m(torch.tensor([[1.0]], device="cuda"))
    err(f"alloc.pt loaded on cuda: anchor buffer on {dev}; [[1]] -> {out.item():.1f} MiB")
    if dev.type != "cuda" or abs(out.item() - 1.0) > 1e-3:
        err("alloc.pt does not behave as expected")
        return 1
    return 0


def cmd_metadata(path, model, mn, typ, shape):
    json.dump({"name": os.path.basename(model), "model": model, "est_gpu_mem_min": int(mn),
               "est_gpu_mem_typ": int(typ), "input": {"shape": json.loads(shape), "dtype": "float32"}},
              open(path, "w"), indent=2)
    return 0


def request(port, path, body, timeout=60):
    data = open(body, "rb").read() if os.path.isfile(body) else body.encode()
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=timeout)
    try:
        c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.getheader("X-Worker-Pid", "0"), r.read()
    finally:
        c.close()


def cmd_post(port, path, body, out):
    """Prints '<status> <worker pid>'; status 0 when no answer came (reset, timeout)."""
    try:
        status, pid, data = request(int(port), path, body)
    except Exception as e:
        err(f"no answer: {e!r}")
        print("0 0")
        return 0
    open(out, "wb").write(data)
    print(status, pid)
    return 0


def cmd_field(path, key):
    v = get_path(json.load(open(path)), key)
    print("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))
    return 0


def cmd_cap(plan_file):
    c = cap_of(json.load(open(plan_file)))
    if not c:
        err("the plan gives the first worker no allocator cap")
        return 1
    print(*c[:3], c[3].replace(" ", "_"))
    return 0


def cmd_plan_vs_smi(plan_file, before_file, after_file, driver=""):
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    ok, out, fig = plan_vs_smi(json.load(open(plan_file)), parse_smi_gpus(open(before_file).read()),
                               parse_smi_gpus(open(after_file).read()), driver or None, cvd)
    for l in out:
        err(l)
    print(fig)
    return 0 if ok else 1


def cmd_hw_check(resp_file, smi_file, uuid, free_lo, free_hi, param_bytes, torch_peak, proc_mib):
    line = json.load(open(resp_file)).get("hwFetch")
    err("hwFetch:", line)
    hw = parse_hwfetch(line)
    if not hw:
        print(f"no hwFetch line of the expected form: {line!r}")
        return 1
    rows = [r for r in parse_smi_gpus(open(smi_file).read()) if r["uuid"] == uuid]
    if len(rows) != 1:
        print(f"the worker's GPU {uuid} is not one row of nvidia-smi's list")
        return 1
    state, out, fig = hw_check(hw, rows[0], int(free_lo), int(free_hi), int(param_bytes), int(torch_peak),
                               None if proc_mib in ("", "none") else int(proc_mib))
    for l in out:
        err(l)
    print(f"'{line}': {fig}")
    return {"ok": 0, "fail": 1, "partial": 3}[state]


def cmd_log_check(simulated, *files):
    """Every server log of a step: 'could not cap' lines fail it; so does a worker that
    reports a device other than cuda (or, rehearsing, a simulated GPU). Prints one figure,
    with each worker's boot in seconds."""
    lines = []
    for f in files:
        try:
            lines += open(f, errors="replace").read().splitlines()
        except OSError as e:
            err(f"cannot read {f}: {e}")
    caps = cap_failures(lines)
    ok, dev = device_verdict(*log_events(lines), simulated == "1")
    parts = []
    if caps:
        parts.append(f"{len(caps)} 'could not cap' line(s): {caps[0].strip()[-160:]}")
    if dev:
        parts.append(("device: " if ok else "FAIL device: ") + dev)
    boots = boot_seconds(lines)
    if boots:
        parts.append("worker boots " + ", ".join(f"{b:.2f}" for b in boots[:8]) + (" …" if len(boots) > 8 else "") + " s")
    print("; ".join(parts))
    return 0 if ok and not caps else 1


def cmd_own_peak(model, width):
    """torch's own figures for MODEL on cuda, loaded as a worker loads it and run twice at
    [1, width] (a warm-up and a request): weights bytes, max allocated, max reserved."""
    import torch
    m = torch.jit.load(model, map_location="cuda").eval()
    weights = sum(t.numel() * t.element_size() for t in list(m.parameters()) + list(m.buffers()))
    x = torch.full((1, int(width)), 0.5)
    with torch.no_grad():
        for _ in range(2):
            m(x.cuda()).cpu()
    torch.cuda.synchronize()
    a, r = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    err(f"weights {weights / MIB:.0f} MiB, max allocated {a / MIB:.0f} MiB, max reserved {r / MIB:.0f} MiB "
        f"(PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')})")
    print(weights, a, r)
    return 0


def _client(port, body, stop_at, threads, q):
    counts, errors = [0] * threads, []

    def one(i):
        c = None
        while time.time() < stop_at:
            try:
                if c is None:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                if r.status == 200:
                    counts[i] += 1
                else:
                    errors.append(r.status)
            except Exception as e:
                errors.append(repr(e)[:80])
                c = None

    ts = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put((sum(counts), errors))


def cmd_served(port, body, seconds, clients):
    """Requests per second over `seconds` from `clients` keep-alive connections, spread over
    up to 4 client processes (one Python process alone would be the bottleneck)."""
    clients = int(clients)
    procs_n = max(1, min(4, clients // 4))
    data = open(body, "rb").read()
    q = multiprocessing.get_context("fork").Queue()
    t0 = time.time()
    stop = t0 + float(seconds)
    share = [clients // procs_n + (1 if i < clients % procs_n else 0) for i in range(procs_n)]
    ps = [multiprocessing.get_context("fork").Process(target=_client, args=(int(port), data, stop, n, q))
          for n in share]
    for p in ps:
        p.start()
    done, errors = 0, []
    for _ in ps:
        n, e = q.get(timeout=float(seconds) + 90)
        done += n
        errors += e
    for p in ps:
        p.join(10)
    rate = done / (time.time() - t0)
    err(f"served: {done} answers, {rate:.1f}/s with {clients} clients in {procs_n} processes, "
        f"{len(errors)} errors {errors[:5]}")
    print(f"{rate:.3f}")
    return 0 if not errors else 1


def cmd_profile_check(*files):
    """app plan --measure --json outputs: each plan follows its own footprint; the footprints
    agree within 10 %. Prints the figure; exit 1 on a mismatch."""
    docs = [json.load(open(f)) for f in files]
    ok, parts, fps = True, [], []
    for f, d in zip(files, docs):
        good, text = plan_follows_footprint(d)
        ok &= good
        parts.append(f"{os.path.basename(f)}: {text}{'' if good else ' MISMATCH'}")
        fps.append(get_path(d, "measured.footprint_mb"))
    if all(isinstance(x, (int, float)) for x in fps) and fps:
        spread = max(fps) - min(fps)
        good = spread <= 0.10 * max(fps)
        ok &= good
        parts.append(f"footprints {fps} MiB: spread {spread} {'<=' if good else '>'} 10 %")
    print("; ".join(parts))
    return 0 if ok else 1


COMMANDS = {"torch-info": cmd_torch_info, "version-check": cmd_version_check, "nvml-gpus": cmd_nvml_gpus,
            "gpu-of": cmd_gpu_of, "ours": cmd_ours, "gpu-memory": cmd_gpu_memory, "probe": cmd_probe,
            "until": cmd_until, "kill9": cmd_kill9, "models": cmd_models, "metadata": cmd_metadata,
            "post": cmd_post, "field": cmd_field, "cap": cmd_cap, "plan-vs-smi": cmd_plan_vs_smi,
            "hw-check": cmd_hw_check, "log-check": cmd_log_check, "own-peak": cmd_own_peak,
            "served": cmd_served, "profile-check": cmd_profile_check,
            "error-names": cmd_error_names}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        err(f"usage: vfcheck.py {{{','.join(COMMANDS)}}} ARGS...")
        sys.exit(2)
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
