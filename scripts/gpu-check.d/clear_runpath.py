"""clear_runpath.py FILE...: overwrites each ELF64 file's DT_RUNPATH/DT_RPATH string (in place)
with a path that does not exist, so that the dynamic loader finds libtorch only through
LD_LIBRARY_PATH, as on the GPU machine, where the build machine's torch folder (which cargo's
build of tch wrote into the RUNPATH) does not exist. Used by scripts/gpu-pack; the strings
keep their length and place, so nothing else in the file moves.

ELF layout (the System V ABI's gABI, "Dynamic Section"): the PT_DYNAMIC segment is an array of
{Elf64_Sxword d_tag; Elf64_Xword d_val} ending at DT_NULL; DT_STRTAB (5) gives the string
table's address, DT_RPATH (15) and DT_RUNPATH (29) offsets into it; addresses map to file
offsets through the PT_LOAD segments.
"""
import struct
import sys

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 5, 15, 29
MARK = b"/.runpath-cleared-by-gpu-pack"


def clear(path):
    data = bytearray(open(path, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit(f"{path}: not a little-endian ELF64 file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dyn = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dyn = (p_offset, p_filesz)
    if dyn is None:
        return []
    entries, strtab = [], None
    for off in range(dyn[0], dyn[0] + dyn[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = val
        elif tag in (DT_RPATH, DT_RUNPATH):
            entries.append(val)
    if not entries:
        return []
    base = next((o + strtab - v for v, o, n in loads if v <= strtab < v + n), None)
    if base is None:
        raise SystemExit(f"{path}: DT_STRTAB lies in no PT_LOAD segment")
    cleared = []
    for e in entries:
        at = base + e
        end = data.index(b"\0", at)
        old = bytes(data[at:end])
        n = end - at
        new = (MARK + b"/" * n)[:n] if n >= len(MARK) else b"\0" * n
        data[at:end] = new
        cleared.append(old.decode(errors="replace"))
    open(path, "wb").write(data)
    return cleared


if __name__ == "__main__":
    for f in sys.argv[1:]:
        for old in clear(f):
            print(f"{f}: RUNPATH {old} cleared")
