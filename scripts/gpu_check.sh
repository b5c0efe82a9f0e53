#!/usr/bin/env bash
# The GPU check, for a CUDA machine with no network (docs/gpu.md): installs DeepSpeed and its
# pure-Python needs from the wheels scripts/gpu_wheels.sh prepared, runs `pytest -m gpu` and the
# learner/kernel benchmarks, and writes every result into one folder. Fits a 15-minute window.
#   bash scripts/gpu_check.sh [WHEELS=.gpu-wheels] [OUT=$OUT or gpu-check]
set -uo pipefail
cd "$(dirname "$0")/.."
wheels=${1:-.gpu-wheels}
out=${2:-${OUT:-gpu-check}}
mkdir -p "$out"
# Carried packages go into their own folder, first on the path: the machine's own site-packages
# (its CUDA torch, Triton, transformers) stay untouched.
site=/tmp/brorl-gpu-site
mkdir -p "$site"
export PYTHONPATH=$site:$PWD
log() { echo "[gpu-check] $*" | tee -a "$out/check.log"; }
log "python $(python3 -V 2>&1); $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")')"
exact=$(sed 's/#.*//' scripts/gpu_packages.txt | awk 'NF' | head -1)
if [ -d "$wheels" ]; then
  for whl in "$wheels"/*.whl; do
    name=$(basename "$whl" | cut -d- -f1 | tr _ -)
    want=$(basename "$whl" | cut -d- -f2)
    have=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null)
    if [ -z "$have" ] || { [ "$have" != "$want" ] && [[ " $exact " == *" $name "* ]]; }; then
      log "install $name $want (machine: ${have:-none})"
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" --upgrade \
        "$whl" >>"$out/check.log" 2>&1 || log "install $name failed"
    fi
  done
  python3 -c "import deepspeed" >/dev/null 2>&1 || DS_BUILD_OPS=0 python3 -m pip install -q \
    --no-index --no-deps --no-build-isolation --target "$site" "$wheels"/deepspeed-*.tar.gz \
    >>"$out/check.log" 2>&1
fi
python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1 | tee -a "$out/check.log"
log "pytest -m gpu"
# Only the modules that hold gpu tests are collected: a CPU-only module whose imports the machine
# lacks (vLLM) would otherwise stop the whole run at collection.
files=$(grep -rl "pytest.mark.gpu" tests/unit)
[ -n "$files" ] || { log "no gpu test modules found"; exit 1; }
timeout 420 python3 -m pytest -q -m gpu $files -p no:cacheprovider \
  --junitxml "$out/pytest.xml" >"$out/pytest.txt" 2>&1
echo "pytest exit $?" >>"$out/pytest.txt"
tail -3 "$out/pytest.txt" | tee -a "$out/check.log"
run_bench() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  log "bench $name"
  timeout "$limit" "$@" >"$out/$name.json" 2>"$out/$name.err" || log "bench $name failed ($?)"
}
run_bench logprob_memory 120 python3 bench/logprob_memory.py
run_bench logprob_memory_truncated 120 python3 bench/logprob_memory.py --truncated
run_bench kernel_logprobs 90 python3 bench/kernel_logprobs.py
run_bench kernel_advantages 60 python3 bench/kernel_advantages.py
run_bench kernel_policy_loss 60 python3 bench/kernel_policy_loss.py
run_bench learner_update 180 python3 bench/learner_update.py --steps 3 --repeats 1
log "done: $(ls "$out" | tr '\n' ' ')"
