#!/usr/bin/env bash
# Prepares what scripts/gpu_check.sh installs on a CUDA machine without network: DeepSpeed's
# source package and the pure-Python packages brorl and DeepSpeed need, at requirements.lock's
# versions, for that machine's Python (docs/gpu.md). torch, Triton and transformers are never
# carried: the machine's own CUDA builds are the ones to test.
#   bash scripts/gpu_wheels.sh [DIR=.gpu-wheels] [PYTHON_VERSION=3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-wheels}
pyver=${2:-3.12}
mkdir -p "$dir"
ds=$(grep -o 'deepspeed==[0-9.]*' scripts/setup.sh | head -1)  # the version CPU setup builds
# DeepSpeed as a source package: it builds there against that machine's CUDA torch, ops JIT.
python3 -m pip download -q --no-deps --no-binary :all: -d "$dir" "$ds"
pins=()
for name in $(cat scripts/gpu_packages.txt | sed 's/#.*//'); do
  pin=$(grep -i "^$name==" requirements.lock | head -1)
  [ -n "$pin" ] || { echo "gpu_wheels: $name is not in requirements.lock" >&2; exit 1; }
  pins+=("$pin")
done
python3 -m pip download -q --no-deps --only-binary :all: -d "$dir" \
  --python-version "$pyver" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 "${pins[@]}"
du -sh "$dir"
ls "$dir"
