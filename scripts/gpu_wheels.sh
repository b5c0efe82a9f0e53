#!/usr/bin/env bash
# Prepares what scripts/gpu_check.sh installs on a CUDA machine without network: DeepSpeed's
# source package and the pure-Python packages it needs that such a machine may lack, for that
# machine's Python (docs/gpu.md).
#   bash scripts/gpu_wheels.sh [DIR=.gpu-wheels] [PYTHON_VERSION=3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-wheels}
pyver=${2:-3.12}
mkdir -p "$dir"
ds=$(grep -o 'deepspeed==[0-9.]*' scripts/setup.sh | head -1)  # the version CPU setup builds
# DeepSpeed as a source package: it builds there against that machine's CUDA torch, ops JIT.
python3 -m pip download -q --no-deps --no-binary :all: -d "$dir" "$ds"
# Its pure-Python dependencies (and pydantic's compiled core for that Python), no torch.
python3 -m pip download -q --no-deps --only-binary :all: -d "$dir" \
  --python-version "$pyver" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  hjson py-cpuinfo msgpack ninja packaging psutil \
  "pydantic==$(python3 -c 'import pydantic; print(pydantic.VERSION)')" \
  "pydantic-core==$(python3 -c 'import pydantic_core; print(pydantic_core.__version__)')" \
  annotated-types typing-inspection typing-extensions pyyaml einops redis
du -sh "$dir"
ls "$dir"
