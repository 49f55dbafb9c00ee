#!/usr/bin/env bash
# Install PyTorch into the current Python environment without ever pulling a multi-GB CUDA build by accident.
#   usage: scripts/install_torch.sh PYTHON TORCH_SPEC [CPU_INDEX_URL]
# - torch already importable at the requested version: nothing to do (setup stays idempotent and offline).
# - an NVIDIA GPU is present (nvidia-smi works): plain `pip install TORCH_SPEC` (the CUDA build is wanted).
# - otherwise the CPU build: taken from pip's local wheels when they hold a +cpu wheel (our machines do),
#   else from PyTorch's CPU index (CPU_INDEX_URL, default https://download.pytorch.org/whl/cpu).
set -euo pipefail
python=$1
spec=$2
cpu_index=${3:-https://download.pytorch.org/whl/cpu}
want=${spec#torch==}

have=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ -n "$have" ] && { [ "$want" = "$spec" ] || [ "${have%%+*}" = "${want%%+*}" ]; }; then
  echo "torch $have already installed"
  exit 0
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "NVIDIA GPU found: installing $spec (CUDA build)"
  exec "$python" -m pip install "$spec"
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if "$python" -m pip download --quiet --no-deps --no-index --dest "$scratch" "$spec" >/dev/null 2>&1 \
   && ls "$scratch" | grep -q '+cpu'; then
  echo "no NVIDIA GPU: installing the local CPU build of $spec"
  exec "$python" -m pip install "$spec"
fi
echo "no NVIDIA GPU: installing the CPU build of $spec from $cpu_index"
exec "$python" -m pip install "$spec" --index-url "$cpu_index" --extra-index-url https://pypi.org/simple
