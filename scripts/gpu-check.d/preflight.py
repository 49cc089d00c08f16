"""scripts/gpu-check's preflight: what must hold before the first step, checked in seconds, so
that a GPU machine that cannot run the check says so at once instead of failing every step
one by one. Standard library only (the GPU machine's python3 has no other packages we can
count on, and may have no binutils beside it).

  preflight.py floor [--build=FILE] [--missing-ok] BIN...
                                   the glibc / libstdc++ / libgcc_s versions the binaries need
                                   (their .gnu.version_r, read from the ELF files themselves)
                                   against what this machine's loader would give them
  preflight.py torch               where python3's torch is and its version, without importing
                                   it (an import takes seconds; step libs imports it)
  preflight.py nvml-hold           loads libnvidia-ml.so.1, calls nvmlInit_v2 and keeps NVML
                                   open until its stdin closes (the check's whole run)
  preflight.py mps                 whether an MPS control daemon answers here

`floor` runs `ldd` (else the loader itself, LD_TRACE_LOADED_OBJECTS=1) to learn which file the
loader would pick for each library, with the LD_LIBRARY_PATH it is given. It prints one line
per binary and, on stdout, a summary; it exits 0 when everything is provided, 1 with one line
naming what is missing (the first line of stdout), 2 when it cannot read the binaries.

ELF layout (the System V gABI and the LSB's symbol versioning): the PT_DYNAMIC segment's
DT_VERNEED/DT_VERNEEDNUM give the versions a file needs (Elf64_Verneed: vn_version, vn_cnt,
vn_file, vn_aux, vn_next; Elf64_Vernaux: vna_hash, vna_flags, vna_other, vna_name,
vna_next), DT_VERDEF/DT_VERDEFNUM the versions a library defines (Elf64_Verdef: vd_version,
vd_flags, vd_ndx, vd_cnt, vd_hash, vd_aux, vd_next; Elf64_Verdaux: vda_name, vda_next; the
entry flagged VER_FLG_BASE is the file's own name), all names in DT_STRTAB; addresses map to
file offsets through the PT_LOAD segments. Read from the dynamic segment, not the section
headers, so a stripped file reads the same.
"""
import ctypes
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB = 0, 5
DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
VER_FLG_BASE = 1
# The libraries glibc itself ships: their GLIBC_x.y versions are the running glibc's.
GLIBC_FILES = re.compile(r"^(libc|libm|libpthread|libdl|librt|libutil|libresolv|libanl|libmvec|ld-linux[-\w]*)\.so")
# What each version prefix is called in a message, and which library provides it.
FAMILY = {"GLIBC": "glibc", "GLIBCXX": "libstdc++", "CXXABI": "libstdc++ (C++ ABI)", "GCC": "libgcc_s"}


def err(*a):
    print(*a, file=sys.stderr, flush=True)


class Elf:
    """The dynamic-section view of one little-endian ELF64 file."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.data = f.read()
        d = self.data
        if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
            raise ValueError(f"{path}: not a little-endian ELF64 file")
        phoff, = struct.unpack_from("<Q", d, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", d, 0x36)
        self.loads, self.dyn = [], {}
        dyn = None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", d, phoff + i * phentsize)
            if p_type == PT_LOAD:
                self.loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == PT_DYNAMIC:
                dyn = (p_offset, p_filesz)
        if dyn is None:
            return
        for off in range(dyn[0], dyn[0] + dyn[1], 16):
            tag, val = struct.unpack_from("<qQ", d, off)
            if tag == DT_NULL:
                break
            self.dyn.setdefault(tag, val)

    def offset(self, vaddr):
        for v, o, n in self.loads:
            if v <= vaddr < v + n:
                return o + vaddr - v
        raise ValueError(f"{self.path}: address {vaddr:#x} lies in no PT_LOAD segment")

    def string(self, index):
        at = self.offset(self.dyn[DT_STRTAB]) + index
        return self.data[at:self.data.index(b"\0", at)].decode(errors="replace")

    def needed_versions(self):
        """{library file name: [version names]} from DT_VERNEED."""
        out = {}
        if DT_VERNEED not in self.dyn:
            return out
        at = self.offset(self.dyn[DT_VERNEED])
        for _ in range(self.dyn.get(DT_VERNEEDNUM, 0)):
            _, cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", self.data, at)
            names, aux = out.setdefault(self.string(vn_file), []), at + vn_aux
            for _ in range(cnt):
                _, _, _, vna_name, vna_next = struct.unpack_from("<IHHII", self.data, aux)
                names.append(self.string(vna_name))
                if not vna_next:
                    break
                aux += vna_next
            if not vn_next:
                break
            at += vn_next
        return out

    def defined_versions(self):
        """The version names a library defines (DT_VERDEF), but its own base name."""
        out = []
        if DT_VERDEF not in self.dyn:
            return out
        at = self.offset(self.dyn[DT_VERDEF])
        for _ in range(self.dyn.get(DT_VERDEFNUM, 0)):
            _, flags, _, cnt, _, vd_aux, vd_next = struct.unpack_from("<HHHHIII", self.data, at)
            if cnt and not flags & VER_FLG_BASE:
                vda_name, _ = struct.unpack_from("<II", self.data, at + vd_aux)
                out.append(self.string(vda_name))
            if not vd_next:
                break
            at += vd_next
        return out


def split_version(name):
    """'GLIBCXX_3.4.30' -> ('GLIBCXX', (3, 4, 30)); None for names without numbers
    (GLIBC_PRIVATE)."""
    m = re.match(r"^([A-Z]+)_(\d+(?:\.\d+)*)$", name)
    return (m.group(1), tuple(int(x) for x in m.group(2).split("."))) if m else None


def dotted(v):
    return ".".join(map(str, v))


def highest(names, prefix):
    vs = [s[1] for s in map(split_version, names) if s and s[0] == prefix]
    return max(vs) if vs else None


def glibc_here():
    """The running glibc's version, as confstr(_CS_GNU_LIBC_VERSION) says ('glibc 2.36')."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        text = ""
    m = re.match(r"glibc (\d+(?:\.\d+)*)", text)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def resolve(binary):
    """(file name -> path or None, the loader's complaints) for one binary, as the loader
    would resolve it with this environment: ldd, else the loader's own trace mode."""
    env = dict(os.environ)
    try:
        p = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=20, env=env)
    except FileNotFoundError:
        env["LD_TRACE_LOADED_OBJECTS"] = "1"
        p = subprocess.run([binary], capture_output=True, text=True, timeout=20, env=env)
    paths, complaints = {}, []
    for line in (p.stdout + "\n" + p.stderr).splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))$", line)
        if m:
            paths[m.group(1)] = m.group(3)
        elif re.match(r"^/\S*ld-linux\S* \(0x", line):
            paths[os.path.basename(line.split()[0])] = line.split()[0]
        elif "not found" in line or "error while loading" in line:
            complaints.append(line)
    return paths, complaints


def built_on(build_file):
    """'Debian GNU/Linux 12 (bookworm), glibc 2.36' from the pack's BUILD, else ''."""
    try:
        kv = dict(l.split("=", 1) for l in open(build_file).read().splitlines() if "=" in l)
    except OSError:
        return ""
    parts = [kv.get("built_on", ""), f"glibc {kv['build_glibc']}" if kv.get("build_glibc") else ""]
    return ", ".join(p for p in parts if p)


def floor_check(binaries, build_file="", missing_ok=False):
    """(ok, the line naming what is missing or the summary, details). missing_ok: libraries
    that do not resolve are listed in the details only (python3's torch is not the build's,
    and step libs refuses it, naming both versions)."""
    details, problems = [], []
    need = {}  # prefix -> (version, binary, library)
    here = glibc_here()
    origin = built_on(build_file)
    origin = f"built on {origin}" if origin else "the build machine's"
    libs_seen = {}
    for b in binaries:
        name = os.path.basename(b)
        try:
            wanted = Elf(b).needed_versions()
        except (OSError, ValueError) as e:
            return None, f"cannot read {b}: {e}", details
        paths, complaints = resolve(b)
        details.append(f"{name}: needs " + "; ".join(
            f"{lib}: {', '.join(sorted(set(v)))}" for lib, v in sorted(wanted.items())) + f"; loader: {paths}")
        for lib, versions in wanted.items():
            for v in versions:
                s = split_version(v)
                if not s:
                    continue
                if s[0] not in need or s[1] > need[s[0]][0]:
                    need[s[0]] = (s[1], name, lib)
            if GLIBC_FILES.match(lib):
                top = highest(versions, "GLIBC")
                if top and here and top > here:
                    problems.append(("glibc", f"this machine's glibc is {dotted(here)}; the packed binaries need "
                                              f"{dotted(top)} ({name} needs GLIBC_{dotted(top)} from {lib}; "
                                              f"{origin}): build them on an older system, or use a newer image"))
                continue
            path = paths.get(lib)
            if not path:
                continue  # reported below as not found
            if path not in libs_seen:
                try:
                    libs_seen[path] = set(Elf(path).defined_versions())
                except (OSError, ValueError) as e:
                    details.append(f"cannot read {path}: {e}")
                    libs_seen[path] = None
            defined = libs_seen[path]
            if defined is None:
                continue
            missing = sorted((v for v in set(versions) if split_version(v) and v not in defined),
                             key=lambda v: split_version(v)[1])
            if missing:
                prefix = split_version(missing[-1])[0]
                has = highest(defined, prefix)
                what = FAMILY.get(prefix, lib)
                problems.append((what, f"this machine's {what} ({path}) provides {prefix} up to "
                                       f"{dotted(has) if has else 'none'}; the packed binaries need "
                                       f"{missing[-1]} ({name}; {origin}): build them on an older system, "
                                       f"or use a newer image"))
        gone = sorted(lib for lib, p in paths.items() if p is None)
        if gone and missing_ok:
            details.append(f"{name}: not found here (not judged: python3's torch is not the build's): {', '.join(gone)}")
        elif gone:
            problems.append(("libraries", f"{name}'s libraries do not resolve here: {', '.join(gone)} not found "
                                          f"(LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')})"))
        for c in complaints:
            details.append(f"{name}: the loader says: {c}")
        if complaints and not gone and not problems and not missing_ok:
            problems.append(("loader", f"{name} does not load here: {complaints[0]}"))
    stdcxx = [(p, highest(d, "GLIBCXX")) for p, d in libs_seen.items() if d is not None and "libstdc++" in p]
    summary = ("the binaries need " + ", ".join(
        f"{p}_{dotted(v[0])} ({v[1]})" for p, v in sorted(need.items()) if p in FAMILY)
        + f"; this machine: glibc {dotted(here) if here else '?'}"
        + "".join(f", {p} up to GLIBCXX_{dotted(v) if v else '?'}" for p, v in stdcxx))
    if problems:
        # glibc first: with it too old, nothing else can be judged
        problems.sort(key=lambda p: {"glibc": 0, "libraries": 2, "loader": 3}.get(p[0], 1))
        return False, problems[0][1], details + [p[1] for p in problems[1:]] + [summary]
    return True, summary, details


def cmd_floor(*args):
    build_file, missing_ok, binaries = "", False, []
    for a in args:
        if a.startswith("--build="):
            build_file = a.split("=", 1)[1]
        elif a == "--missing-ok":
            missing_ok = True
        else:
            binaries.append(a)
    ok, line, details = floor_check(binaries, build_file, missing_ok)
    print(line)
    for d in details:
        err(d)
    return 2 if ok is None else (0 if ok else 1)


def cmd_torch():
    """JSON: python3's torch, found but not imported: version (from its version.py), lib."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    out = {"python": sys.executable, "found": spec is not None and bool(spec.submodule_search_locations)}
    if out["found"]:
        d = list(spec.submodule_search_locations)[0]
        out["dir"], out["lib"] = d, os.path.join(d, "lib")
        try:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", open(os.path.join(d, "version.py")).read(), re.M)
            out["version"] = m.group(1) if m else None
        except OSError:
            out["version"] = None
    print(json.dumps(out))
    return 0


class NvmlHold:
    CANDIDATES = ("libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
                  "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1")
    MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}

    def __init__(self):
        given = os.environ.get("VRAMFORK_NVML_LIBRARY")
        tried = []
        self.lib = None
        for name in ([given] if given else self.CANDIDATES):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError as e:
                tried.append(str(e) if "/" in name else f"the loader's search path: {e}")
        if self.lib is None:
            raise RuntimeError("libnvidia-ml.so.1 is not found here (tried: " + "; ".join(tried)
                               + "): no NVIDIA driver is visible to this machine or container")
        self.path = opened_as(self.lib.nvmlInit_v2) or given or loaded_path("libnvidia-ml") or ""
        t0 = time.monotonic()
        rc = self.lib.nvmlInit_v2()
        self.init_s = time.monotonic() - t0
        if rc != 0:
            raise RuntimeError(f"NVML ({self.path}) does not start: nvmlInit_v2 returned {rc}")

    def gpus(self):
        L, P, U = self.lib, ctypes.c_void_p, ctypes.c_uint
        L.nvmlDeviceGetHandleByIndex_v2.argtypes = [U, ctypes.POINTER(P)]
        L.nvmlDeviceGetUUID.argtypes = [P, ctypes.c_char_p, U]
        L.nvmlDeviceGetComputeMode.argtypes = [P, ctypes.POINTER(U)]
        n = U(0)
        L.nvmlDeviceGetCount_v2(ctypes.byref(n))
        out = []
        for i in range(n.value):
            h, buf, mode = P(), ctypes.create_string_buffer(96), U(0)
            if L.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                continue
            L.nvmlDeviceGetUUID(h, buf, 96)
            m = self.MODES.get(mode.value, "[N/A]") if L.nvmlDeviceGetComputeMode(h, ctypes.byref(mode)) == 0 else "[N/A]"
            out.append({"index": i, "uuid": buf.value.decode(errors="replace"), "compute_mode": m})
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from vfcheck import visible_rows  # CUDA's rule for CUDA_VISIBLE_DEVICES, as the plan applies it
        seen = visible_rows(out, os.environ.get("CUDA_VISIBLE_DEVICES"))
        for g in out:
            g["visible"] = g in seen
        return out


class DlInfo(ctypes.Structure):  # Dl_info, <dlfcn.h>
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def opened_as(function):
    """The path under which the loader opened the library holding `function` (dladdr's
    dli_fname: e.g. /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, where a bare
    'libnvidia-ml.so.1' was found), or None."""
    for lib in (None, "libdl.so.2"):  # dladdr is in libc from glibc 2.34, in libdl before
        try:
            dladdr = ctypes.CDLL(lib).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        info = DlInfo()
        if dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            path = info.dli_fname.decode(errors="replace")
            return path if path.startswith("/") else os.path.abspath(path)
    return None


def loaded_path(fragment):
    """The absolute path of the mapped file whose name holds `fragment` (from /proc/self/maps):
    where the loader really found a library."""
    if not fragment:
        return None
    try:
        for line in open("/proc/self/maps"):
            f = line.split(None, 5)
            if len(f) == 6 and fragment in os.path.basename(f[5].strip()):
                return f[5].strip()
    except OSError:
        pass
    return None


def cmd_nvml_hold():
    """Prints 'gpu INDEX UUID COMPUTE_MODE visible|hidden' for each GPU (hidden: not left by
    CUDA_VISIBLE_DEVICES), then 'ready INIT_SECONDS LIBRARY_PATH' (or 'error TEXT'), then keeps NVML initialised until stdin closes or TERM arrives: while any
    process holds NVML open the driver keeps an idle GPU initialised, so a fresh CUDA process
    does not pay for re-initialising it (without persistence mode it would)."""
    try:
        ctypes.CDLL(None).prctl(15, b"vf-nvml-hold", 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        hold = NvmlHold()
        for g in hold.gpus():
            print(f"gpu {g['index']} {g['uuid']} {g['compute_mode']} {'visible' if g['visible'] else 'hidden'}")
        print(f"ready {hold.init_s:.3f} {hold.path}", flush=True)
    except RuntimeError as e:
        print(f"error {e}", flush=True)
        return 1
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, KeyboardInterrupt):
        pass
    hold.lib.nvmlShutdown()
    return 0


def cmd_mps():
    """Whether an MPS control daemon answers at $CUDA_MPS_PIPE_DIRECTORY/control (default
    /tmp/nvidia-mps): where one does, CUDA processes become its clients. The daemon
    (`nvidia-cuda-mps-control -d`) listens as a SOCK_SEQPACKET socket, so that is how it is
    asked (a stream socket is refused with EPROTOTYPE), as the master asks
    (src/master/resources/mps.rs). Prints the reason or nothing; exit 0 when one answers,
    1 when not."""
    d = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    path = os.path.join(d, "control")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(2)
    try:
        s.connect(path)
    except OSError:
        return 1
    finally:
        s.close()
    print(f"an MPS control daemon answers at {path}")
    return 0


COMMANDS = {"floor": cmd_floor, "torch": cmd_torch, "nvml-hold": cmd_nvml_hold, "mps": cmd_mps}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        err(f"usage: preflight.py {{{','.join(COMMANDS)}}} ARGS...")
        sys.exit(2)
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
