#!/usr/bin/env python3
"""A stand-in `nvidia-smi` for the GPU check's rehearsal (tests/gpu_check.rs): it answers the
queries scripts/gpu-check makes, and only those, in the format driver 580's nvidia-smi prints
them, from the simulated NVML (tests/nvml-mock, loaded through ctypes from
$VRAMFORK_NVML_LIBRARY; its machine is $NVML_MOCK_FILE), so that nvidia-smi, the master and the
check's own NVML reader all see one machine, as on a real one where nvidia-smi is NVML's
front end.

Answered (nvidia-smi(1), e.g. https://manpages.ubuntu.com/manpages/plucky/man1/nvidia-smi.1.html):
  nvidia-smi                      a header with 'Driver Version: … CUDA Version: …'
  nvidia-smi -L                   'GPU 0: NAME (UUID: GPU-…)'
  --query-gpu=F,… --format=csv[,noheader][,nounits] [-i INDEX|GPU-UUID]
        F: index, uuid, name, driver_version, memory.total, memory.free, memory.used (MiB;
        used = total − free − reserved, as nvidia-smi has shown it since the driver reports
        reserved memory apart), compute_mode (Default, Exclusive_Thread, Prohibited,
        Exclusive_Process), mig.mode.current (Enabled, Disabled, [N/A])
  --query-compute-apps=F,… --format=…
        F: gpu_uuid, pid, used_memory (also used_gpu_memory; [N/A] when NVML does not know)
Values are separated by ", "; without nounits sizes carry " MiB"; the header names sizes
'memory.total [MiB]'. With no compute process the answer is empty.

Anything else (another field, option or a MIG UUID given to -i, which the real one refuses
for --query-gpu too) exits 2 with a message; every call, answered or not, is appended to
$NVIDIA_SMI_STANDIN_LOG when set, so the test can check that nothing unknown was asked.
"""
import ctypes
import os
import sys
import time

MIB = 1 << 20


def log(line):
    path = os.environ.get("NVIDIA_SMI_STANDIN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def refuse(msg):
    log("REFUSED " + " ".join(sys.argv[1:]) + " :: " + msg)
    print(msg, file=sys.stderr)
    sys.exit(2)


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


def nvml():
    lib = ctypes.CDLL(os.environ.get("VRAMFORK_NVML_LIBRARY") or "libnvidia-ml.so.1")
    P = ctypes.c_void_p
    lib.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(P)]
    for f in ("nvmlDeviceGetUUID", "nvmlDeviceGetName"):
        getattr(lib, f).argtypes = [P, ctypes.c_char_p, ctypes.c_uint]
    lib.nvmlDeviceGetMemoryInfo_v2.argtypes = [P, ctypes.POINTER(MemoryV2)]
    lib.nvmlDeviceGetComputeRunningProcesses_v3.argtypes = [P, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(Proc)]
    lib.nvmlDeviceGetComputeMode.argtypes = [P, ctypes.POINTER(ctypes.c_uint)]
    lib.nvmlDeviceGetMigMode.argtypes = [P, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)]
    if lib.nvmlInit_v2() != 0:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", file=sys.stderr)
        sys.exit(9)
    return lib


def text(fn, *args):
    buf = ctypes.create_string_buffer(96)
    if fn(*args, buf, 96) != 0:
        return "[N/A]"
    return buf.value.decode()


def gpus(lib):
    n = ctypes.c_uint(0)
    lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
    out = []
    for i in range(n.value):
        h = ctypes.c_void_p()
        lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
        m = MemoryV2(version=ctypes.sizeof(MemoryV2) | (2 << 24))
        lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m))
        mode = ctypes.c_uint(0)
        cm = ["Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process"]
        compute = cm[mode.value] if lib.nvmlDeviceGetComputeMode(h, ctypes.byref(mode)) == 0 and mode.value < 4 else "[N/A]"
        cur, pend = ctypes.c_uint(0), ctypes.c_uint(0)
        mig = ("Enabled" if cur.value == 1 else "Disabled") \
            if lib.nvmlDeviceGetMigMode(h, ctypes.byref(cur), ctypes.byref(pend)) == 0 else "[N/A]"
        out.append({"h": h, "index": i, "uuid": text(lib.nvmlDeviceGetUUID, h), "name": text(lib.nvmlDeviceGetName, h),
                    "memory.total": m.total // MIB, "memory.free": m.free // MIB,
                    "memory.used": (m.total - m.free - m.reserved) // MIB, "compute_mode": compute,
                    "mig.mode.current": mig})
    return out


def driver(lib):
    buf = ctypes.create_string_buffer(80)
    lib.nvmlSystemGetDriverVersion(buf, 80)
    return buf.value.decode()


def cuda(lib):
    v = ctypes.c_int(0)
    lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(v))
    return f"{v.value // 1000}.{(v.value % 1000) // 10}"


def processes(lib, g):
    n = ctypes.c_uint(0)
    lib.nvmlDeviceGetComputeRunningProcesses_v3(g["h"], ctypes.byref(n), None)
    if n.value == 0:
        return []
    arr = (Proc * (n.value + 8))()
    n = ctypes.c_uint(n.value + 8)
    if lib.nvmlDeviceGetComputeRunningProcesses_v3(g["h"], ctypes.byref(n), arr) != 0:
        return []
    return [(p.pid, None if p.used == (1 << 64) - 1 else p.used // MIB) for p in arr[:n.value]]


GPU_FIELDS = ("index", "uuid", "name", "driver_version", "memory.total", "memory.free", "memory.used",
              "compute_mode", "mig.mode.current")
APP_FIELDS = {"gpu_uuid": "gpu_uuid", "pid": "pid", "used_memory": "used_gpu_memory [MiB]",
              "used_gpu_memory": "used_gpu_memory [MiB]"}


def csv(rows, fields, headers, units, fmt):
    opts = fmt.split(",")
    if opts[0] != "csv" or any(o not in ("noheader", "nounits") for o in opts[1:]):
        refuse(f'"{fmt}" is not a valid format.')
    lines = [] if "noheader" in opts else [", ".join(headers)]
    for r in rows:
        vals = []
        for f in fields:
            v = r[f]
            if v is None:
                v = "[N/A]"
            elif f in units and "nounits" not in opts:
                v = f"{v} MiB"
            vals.append(str(v))
        lines.append(", ".join(vals))
    if lines:
        print("\n".join(lines))


def main(argv):
    log(" ".join(argv))
    lib = nvml()
    if not argv:
        gs = gpus(lib)
        print(time.strftime("%a %b %d %H:%M:%S %Y"))
        print("+" + "-" * 89 + "+")
        print(f"| NVIDIA-SMI {driver(lib):<22} Driver Version: {driver(lib):<14} CUDA Version: {cuda(lib):<9}|")
        print("+" + "-" * 89 + "+")
        for g in gs:
            print(f"| {g['index']:>3}  {g['name']:<40} {g['memory.used']:>8}MiB / {g['memory.total']:>6}MiB |")
        print("+" + "-" * 89 + "+")
        return 0
    if argv == ["-L"]:
        for g in gpus(lib):
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        return 0
    query = fmt = dev = None
    kind = None
    for a in argv:
        if a.startswith("--query-gpu="):
            kind, query = "gpu", a.split("=", 1)[1]
        elif a.startswith("--query-compute-apps="):
            kind, query = "apps", a.split("=", 1)[1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a.startswith("--id=") or a.startswith("-i="):
            dev = a.split("=", 1)[1]
        else:
            refuse(f"this stand-in does not answer {a!r}")
    if "-i" in argv:
        refuse("this stand-in takes -i as --id=")
    if not kind or not fmt:
        refuse("a query and --format are needed")
    fields = query.split(",")
    gs = gpus(lib)
    if dev is not None:
        if dev.startswith("MIG-"):
            refuse(f"Invalid combination of input arguments: {dev} is a MIG device; --query-gpu takes whole GPUs")
        gs = [g for g in gs if str(g["index"]) == dev or g["uuid"] == dev]
        if not gs:
            refuse("No devices were found")
    if kind == "gpu":
        for f in fields:
            if f not in GPU_FIELDS:
                refuse(f'Field "{f}" is not a valid field to query.')
        drv = driver(lib)
        for g in gs:
            g["driver_version"] = drv
        units = {"memory.total", "memory.free", "memory.used"}
        csv(gs, fields, [f + (" [MiB]" if f in units else "") for f in fields], units, fmt)
        return 0
    for f in fields:
        if f not in APP_FIELDS:
            refuse(f'Field "{f}" is not a valid field to query.')
    rows = []
    for g in gs:
        for pid, used in processes(lib, g):
            rows.append({"gpu_uuid": g["uuid"], "pid": pid, "used_memory": used, "used_gpu_memory": used})
    csv(rows, fields, [APP_FIELDS[f] for f in fields], {"used_memory", "used_gpu_memory"}, fmt)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
