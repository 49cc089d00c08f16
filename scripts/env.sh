# Sourced by the project's scripts: installs libtorch if needed (scripts/setup-torch) and
# points the build at it. After this, `cargo build` builds the worker against torch 2.11.0.
_vf_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VRAMFORK_TORCH_VENV=$("$_vf_root/scripts/setup-torch") || return 1
export VRAMFORK_TORCH_VENV
export LIBTORCH=$("$VRAMFORK_TORCH_VENV/bin/python" -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null)
export LIBTORCH_CXX11_ABI=$("$VRAMFORK_TORCH_VENV/bin/python" -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
export VRAMFORK_PYTHON=$VRAMFORK_TORCH_VENV/bin/python
unset _vf_root
