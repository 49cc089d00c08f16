"""Prints, as JSON, the shared libraries a process without Python needs to load
torchvision's TorchScript operators: the Python library this venv's interpreter was built
with (libtorch_python.so, which torchvision's _C.so links, takes its symbols from it) and
torchvision's _C.so. Used by tests/production.rs; run with the project's venv python."""
import importlib.util
import json
import os
import sysconfig

spec = importlib.util.find_spec("torchvision")
vision = os.path.join(spec.submodule_search_locations[0], "_C.so") if spec else None
name = sysconfig.get_config_var("INSTSONAME") or ""
candidates = [os.path.join(d, name) for d in (sysconfig.get_config_var("LIBDIR") or "",
                                               "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")]
libpython = next((c for c in candidates if name and os.path.isfile(c)), None)
print(json.dumps({"libpython": libpython, "libpython_name": name, "torchvision_c": vision}))
