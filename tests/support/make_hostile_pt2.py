"""Writes a hostile copy of a `.pt2` archive SRC to DST (every record of SRC kept, as it
was, under the archive's top folder) and prints {"path": DST, "bytes": ..., "entry": ...}:
the tests feed them to the server, which must refuse each at start naming what is wrong.

usage: make_hostile_pt2.py KIND SRC DST [ARG]
  outside DIR   an AOTInductor package with one more library entry,
                data/aotinductor/model/ + ../ x 12 + DIR/outside.wrapper.so, whose bytes
                (SRC's own library) are also written at DIR/outside.wrapper.so: a loader
                that follows the name maps a library outside its unpack folder
  bomb_json     an ExportedProgram archive whose models/<name>.json is padded with 1 GiB
                of spaces, deflated (the file grows by about 1 MB)
  bomb_bin      an AOTInductor package with a 1 GiB data/aotinductor/model/weights.bin of
                zeros, deflated
  many N        an AOTInductor package with N more 11-byte .cpp entries"""
import json
import os
import sys
import zipfile

GIB = 1 << 30
CHUNK = 16 << 20


def put(zout, info, data):
    """`data` as a record of zout named and compressed as `info` (zin's, left as it was:
    writing a ZipInfo sets its offset)."""
    fresh = zipfile.ZipInfo(info.filename, info.date_time)
    fresh.compress_type = info.compress_type
    zout.writestr(fresh, data)


def copy(zin, zout):
    """Every record of zin into zout, as it was; returns the archive's top folder."""
    top = None
    for info in zin.infolist():
        top = top or info.filename.split("/", 1)[0]
        put(zout, info, zin.read(info.filename))
    return top


def padded(zout, name, head, size):
    """A record `name` of `head` then spaces up to `size` bytes, deflated as it is written."""
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zout.open(info, "w", force_zip64=True) as f:
        f.write(head)
        left = size - len(head)
        block = b" " * CHUNK
        while left > 0:
            n = min(left, CHUNK)
            f.write(block[:n])
            left -= n


def main():
    kind, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
    arg = sys.argv[4] if len(sys.argv) > 4 else None
    entry = None
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        names = zin.namelist()
        if kind == "bomb_json":
            program = next(n for n in names if "/models/" in n and n.endswith(".json"))
            top = None
            for info in zin.infolist():
                top = top or info.filename.split("/", 1)[0]
                if info.filename != program:
                    put(zout, info, zin.read(info.filename))
            padded(zout, program, zin.read(program), GIB)
            entry = program.split("/", 1)[1]
        else:
            top = copy(zin, zout)
            model = f"{top}/data/aotinductor/model/"
            if kind == "outside":
                library = next(n for n in names if n.endswith(".wrapper.so"))
                os.makedirs(arg, exist_ok=True)
                outside = os.path.join(os.path.abspath(arg), "outside.wrapper.so")
                data = zin.read(library)
                with open(outside, "wb") as f:
                    f.write(data)
                name = model + "../" * 12 + outside.lstrip("/")
                zout.writestr(name, data)
                entry = name.split("/", 1)[1]
            elif kind == "bomb_bin":
                padded(zout, model + "weights.bin", b"", GIB)
                entry = "data/aotinductor/model/weights.bin"
            elif kind == "many":
                for i in range(int(arg)):
                    zout.writestr(f"{model}extra_{i:05}.cpp", b"// nothing\n")
                entry = f"{int(arg)} more"
            else:
                sys.exit(f"unknown kind {kind}")
    print(json.dumps({"path": dst, "bytes": os.path.getsize(dst), "entry": entry}))


main()
