#!/usr/bin/env python3
"""Infinity for the text bench: `infinity-emb` from PyPI (pinned, VERSION) in a venv of its own
under bench/tmp (never the test venv), and its server started on the bench's model.

The venv sees the torch venv's packages through a .pth file, so that Infinity runs on the same
torch 2.11.0 as every other side (and without a second multi-gigabyte copy of it); what
infinity-emb pins otherwise (numpy 1, sentence-transformers 3, its server's packages) is
installed in the venv itself, ahead of them on sys.path.

The server as it ships: the torch engine, its batch size 32 and its length sorting (by string
length) as they come, one process whose torch uses 2 threads (OMP_NUM_THREADS=2), no telemetry.

Usage: text_infinity.py --prepare   (makes the venv when it has no infinity_emb; idempotent)
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import TMP, App, free_port, get  # noqa: E402

VERSION = "0.0.78"
VENV = os.path.join(TMP, "infinity-venv")
PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)
THREADS = 2


def prepare():
    if os.path.exists(os.path.join(VENV, "bin", "infinity_emb")):
        return
    subprocess.run(["rm", "-rf", VENV], check=True)
    # From the torch venv's python: a venv of the same Python as that venv's packages.
    subprocess.run([PY, "-m", "venv", VENV], check=True)
    vpy = os.path.join(VENV, "bin", "python")
    site = lambda py: subprocess.run(  # noqa: E731
        [py, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
        capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site(vpy), "vramfork-torch.pth"), "w") as f:
        f.write(site(PY) + "\n")
    subprocess.run([vpy, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"infinity-emb[torch,server]=={VERSION}"], check=True)


def start(folder, name, log_path):
    """`infinity_emb v2` on the Hugging Face folder `folder`, served as `name`: (server,
    port), once its /health answers (after its own warm-up)."""
    port = free_port()
    srv = App.other(["env", "INFINITY_ANONYMOUS_USAGE_STATS=false", f"OMP_NUM_THREADS={THREADS}",
                     f"MKL_NUM_THREADS={THREADS}", os.path.join(VENV, "bin", "infinity_emb"),
                     "v2", "--model-id", folder, "--served-model-name", name, "--engine", "torch",
                     "--device", "cpu", "--url-prefix", "/v1", "--host", "127.0.0.1", "--port",
                     str(port)],
                    log_path)
    srv.wait(lambda: get(port, "/health", timeout=2)[0] == 200, 600)
    return srv, port


if __name__ == "__main__":
    if sys.argv[1:] != ["--prepare"]:
        sys.exit(__doc__)
    prepare()
