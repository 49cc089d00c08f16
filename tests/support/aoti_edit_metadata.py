"""Copies the AOTInductor package SRC to DST with KEY=VALUE pairs set in its metadata
records (`*_metadata.json`: AOTI_DEVICE_KEY, AOTI_CPU_ISA…), every other record as it was;
prints {"path": DST}. The tests make packages for another device or CPU from one compiled
here.

usage: aoti_edit_metadata.py SRC DST KEY=VALUE..."""
import json
import sys
import zipfile

src, dst, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
changes = dict(p.split("=", 1) for p in pairs)
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
    for info in zin.infolist():
        data = zin.read(info.filename)
        if info.filename.endswith("_metadata.json"):
            meta = json.loads(data)
            meta.update(changes)
            data = json.dumps(meta).encode()
        zout.writestr(info.filename, data)
print(json.dumps({"path": dst}))
