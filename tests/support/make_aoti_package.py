"""Writes an AOTInductor package (scripts/make_pt2_models.py's `aoti_package`) to PATH and
prints {"path": ..., "bytes": ...}. Compiling takes about a minute on two cores: callers
cache it (tests/aoti.rs's `package`).

usage: make_aoti_package.py PATH MODULE dynamic|default
  MODULE: mlp (mlp.pt's module and weights), dict (the same returning a dict) or mlp256
  dynamic: compiled with TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1 (served);
  default: torch's default, a thread count fixed in the kernels (refused)"""
import json
import os
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
sys.path.insert(0, SCRIPTS)

from make_pt2_models import aoti_package  # noqa: E402

path, module, threads = sys.argv[1], sys.argv[2], sys.argv[3]
aoti_package(module, path, threads == "dynamic")
print(json.dumps({"path": path, "bytes": os.path.getsize(path)}))
