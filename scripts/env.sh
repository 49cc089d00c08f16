# Sourced by the project's scripts: installs libtorch if needed (scripts/setup-torch) and
# points the build at it. After this, `cargo build` builds the worker against torch 2.11.0.
_vf_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VRAMFORK_TORCH_VENV=$("$_vf_root/scripts/setup-torch") || return 1
export VRAMFORK_TORCH_VENV
export LIBTORCH=$("$VRAMFORK_TORCH_VENV/bin/python" -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null)
export LIBTORCH_CXX11_ABI=$("$VRAMFORK_TORCH_VENV/bin/python" -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
export VRAMFORK_PYTHON=$VRAMFORK_TORCH_VENV/bin/python
unset _vf_root

# vf_need_wrk NAME: installs wrk (the load generator of scripts/bench and scripts/stress) with
# apt-get when it is missing and we are root; else says what to do and fails.
vf_need_wrk() {
  command -v wrk >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "$1: installing wrk (apt-get)" >&2
    apt-get install -y -q wrk >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; }
  else
    echo "$1: wrk is missing: install it (apt-get install wrk)" >&2
    return 1
  fi
}
